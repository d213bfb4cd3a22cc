"""Held-out loss and accuracy of a plan's weights as training goes: the user's model, rebuilt from the schedule,
takes the trained tensors and runs in eval mode without gradients (dropout off, batch norm's running
statistics), with the plan's own loss. It runs beside the plan, outside its budget: a forward without
gradients holds far less than a training step, and its memory is not counted by the runtime's ledger.
"""
from __future__ import annotations

import torch

from edgetrain.compiler.frontend.capture import class_dim, load_loss, objective
from edgetrain.compiler.frontend.modelspec import resolve

from .run_data import Dataset


class Evaluator:
    """`evaluate(state_dict, ds)` -> {"eval_loss", "eval_accuracy" (None without class ids), "eval_examples"}."""

    def __init__(self, body: dict, device: torch.device, int8=None) -> None:
        """`int8`: the plan's int8 prefix (int8_check.Int8Reference), whose integers the trained state holds: the
        model keeps the float weights they were made from, and its head reads the integer prefix's boundary."""
        spec, graph = body["model"], body["graph"]
        torch.manual_seed(body["seed"])
        self.model = resolve(spec["spec"], **spec["kwargs"]).module.to(device)
        self.integers, self.before = (), (lambda x: None)
        if int8 is not None:
            with torch.no_grad():
                for k, v in int8.floats.items():
                    self.model.get_parameter(k).copy_(torch.from_numpy(v))
            self.integers, self.before = frozenset(int8.values), int8.feed(self.model)
        self.device, self.batch = device, graph["input_shape"][0]
        self.token_ids = graph.get("input_dtype") == "int64"
        loss = spec["loss"]
        user_fn = load_loss(loss) if loss not in ("cross_entropy", "mse", "model") else None
        self.loss = objective(loss if user_fn is None else "cross_entropy", self.token_ids, user_fn)
        self.classes = spec["loss"] != "model" and spec["num_classes"] is not None  # accuracy needs class ids

    @torch.no_grad()
    def evaluate(self, state: dict[str, torch.Tensor], ds: Dataset) -> dict:
        own = dict(self.model.state_dict())
        self.model.load_state_dict({k: v for k, v in state.items() if k in own and k not in self.integers},
                                   strict=False)
        self.model.eval()
        total, correct, labels = 0.0, 0, 0
        try:
            for start in range(0, ds.n, self.batch):
                x, y = ds.take(torch.arange(start, min(ds.n, start + self.batch)).numpy())
                x, y = x.to(self.device), y.to(self.device)
                self.before(x)
                total += float(self.loss(self.model, x, y)) * len(x)
                if self.classes:
                    out = self.model(x)
                    out = getattr(out, "logits", out)
                    pred = out.argmax(class_dim(out.dim(), self.token_ids))
                    correct += int((pred == y).sum())
                    labels += y.numel()
        finally:
            self.model.train()
        return {"eval_loss": total / max(ds.n, 1),
                "eval_accuracy": 100.0 * correct / labels if self.classes and labels else None,
                "eval_examples": ds.n}
