"""The exactness reference: the user's model trained by plain PyTorch autograd from the same weights and data.

Every dropout, an nn.Dropout module's or an F.dropout call's, draws the runtime's mask (same seed, step and key:
torch's generator for a Python plan, the C runtime's hash for firmware), and the parameters the schedule lists as
trainable are the ones with requires_grad (so a `--train` selection holds), the only changes to the model;
everything else is the model as the user wrote it, with its loss and the torch.optim optimizer the plan's updates
match.
"""
from __future__ import annotations


import torch
import torch.nn as nn
from safetensors.torch import load_file

from edgetrain.compiler.frontend.capture import KeyedDropout, load_loss, objective, portable_kernels
from edgetrain.compiler.frontend.modelspec import resolve
from edgetrain.runtime.python.optimizers import unit_of
from edgetrain.targets import Target


def load_weights(model: nn.Module, path: str) -> None:
    tensors = load_file(path)
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(tensors[f"param/{k}"])
        for k, b in model.named_buffers():
            b.copy_(tensors[f"buffer/{k}"])


def make_optimizer(params, config: dict) -> torch.optim.Optimizer:
    """The torch.optim optimizer a plan's update matches (single-tensor arithmetic, foreach=False): its unit's
    class with the unit's settings, which are that class's keyword arguments."""
    unit = unit_of(config)
    return getattr(torch.optim, unit.torch_class)(params, **unit.settings(config), foreach=False)


def train_reference(schedule: dict, weights_path: str, batches: list[tuple[torch.Tensor, torch.Tensor]],
                    device: torch.device, first_step: int = 0) -> tuple[nn.Module, list[float]]:
    spec = schedule["model"]
    torch.manual_seed(schedule["seed"])
    model = resolve(spec["spec"], **spec["kwargs"]).module
    load_weights(model, weights_path)
    model.to(device).train()
    clock = [schedule["seed"], first_step, {}]
    graph = schedule["graph"]
    if "trainable" in graph:  # the schedule's choice (the model's flags or --train) decides what trains
        trainable = set(graph["trainable"])
        for name, p in model.named_parameters():
            p.requires_grad_(name in trainable)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad], graph["optimizer"])
    loss = spec["loss"]
    user_fn = load_loss(loss) if loss not in ("cross_entropy", "mse", "model") else None
    fn = objective(loss if user_fn is None else "cross_entropy", graph.get("input_dtype") == "int64", user_fn)
    gpu = Target(**schedule["target"]).gpu
    losses = []
    for k, (x, y) in enumerate(batches):
        clock[1], clock[2] = first_step + k, {}
        opt.zero_grad(set_to_none=True)
        # C firmware hashes its masks; a GPU plan's attention is the kernel its graph was traced with
        with KeyedDropout(model, clock=clock, hashed=schedule.get("backend") == "c"), portable_kernels(gpu):
            value = fn(model, x.to(device), y.to(device))
        value.backward()
        opt.step()
        losses.append(float(value.detach()))
    return model, losses
