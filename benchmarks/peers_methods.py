"""The training steps the peers benchmark compares, one class per method, each on the same model and batches.

Every method starts from the model the zoo (or a model file) builds under the compile's seed, trains with the
torch.optim optimizer an edgetrain plan's update matches (SGD with momentum by default) and the loss the plan
is compiled with, and exposes `step(x, y)` and `state_bytes()`: the tensors it holds between steps (parameters,
buffers, optimizer state; an edgetrain plan's ledger), to which a measured step's resident-set growth adds.

- eager: the model as written, `loss.backward()`, `opt.step()`, gradients set to None after the update;
- eager-optim-hook: torch's optimizer-in-backward recipe: one optimizer per parameter, stepped by
  `register_post_accumulate_grad_hook` as soon as the parameter's gradient is whole, which then frees it;
- checkpoint: `torch.utils.checkpoint` (use_reentrant=False) around every block (peers_models.block_types); a
  Hugging Face model's own `activation_checkpointing_enable` (the same, per decoder layer); `checkpoint_sequential`
  in sqrt(n) segments for a model that is one plain nn.Sequential;
- compile: `torch.compile` (inductor) of model and loss with `torch._functorch.config.activation_memory_budget`
  at the setting, the optimizer step eager;
- edgetrain: a compiled plan (its folder made beforehand by `compile_plan`) run by the runtime's Trainer.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn as nn

from benchmarks.peers_models import block_types

METHODS = {"eager": ("-",), "eager-optim-hook": ("-",), "checkpoint": ("per block",),
           "compile": ("1.0", "0.5", "0.3", "0.1"), "edgetrain": ("100%", "50%", "40%", "25%", "min"),
           "edgetrain-fused": ("100%", "50%", "40%", "25%", "min"),  # compile --fuse: pointwise chains as kernels
           # compile --fuse --scheduler checkmate: recompute only (on a loaded 2-core host, handing pages to the
           # page store costs more than the profile's page cost says)
           "edgetrain-fused-recompute": ("100%", "50%", "40%", "25%", "min")}
PLANS = ("edgetrain", "edgetrain-fused", "edgetrain-fused-recompute")  # the methods that compile an edgetrain plan


@dataclass(frozen=True)
class Workload:
    """What every method trains: the model spec (a zoo name or path/file.py:fn), its loss, the batch size, the
    seed the weights and batches come from, the target edgetrain plans are compiled for, torch's thread count,
    and the optimizer every method trains with (a unit of runtime/python/optimizers by name, its defaults)."""

    model: str
    loss: str
    batch_size: int
    seed: int
    target: str
    threads: int
    time_limit: float
    optimizer: str = "sgd"


def loss_for(spec: str) -> str:
    """The loss a model trains with: its own (`model`) when it carries `labels_shape` (forward(x, y) -> loss),
    else cross-entropy."""
    from edgetrain.compiler.frontend.modelspec import resolve

    return "model" if hasattr(resolve(spec).module, "labels_shape") else "cross_entropy"


def build_model(w: Workload):
    """(the torch module in training mode, its resolved facts), initialised as a compile initialises it."""
    from edgetrain.compiler.frontend.modelspec import resolve

    torch.manual_seed(w.seed)
    resolved = resolve(w.model)
    return resolved.module.train(), resolved


def batches(w: Workload, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` random batches: inputs as the compiler's example (token ids or standard-normal), labels shaped by
    the compiler's own rule (class ids from the model's output, or its `labels_shape`)."""
    from edgetrain.compiler.frontend.labels import example_labels

    model, resolved = build_model(w)
    gen = torch.Generator().manual_seed(w.seed + 1000)
    shape = (w.batch_size, *resolved.input_shape)
    out = []
    for k in range(steps):
        if resolved.input_dtype == "int64":
            x = torch.randint(0, resolved.input_high, shape, generator=gen)
        else:
            x = torch.randn(*shape, generator=gen)
        out.append((x, example_labels(w.loss, w.seed + 1000 + k, resolved, model, x).example))
    return out


def optimizer_config(name: str):
    """The optimizer every method trains with: the named unit with its defaults, as compile's --optimizer sets it
    (`sgd`: compile's default, SGD with momentum; `adamw`: lr 1e-3, weight decay 0.01)."""
    from edgetrain.compiler.graph.ir import OptimizerConfig

    return OptimizerConfig.of(name)


def _tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


class Objective(nn.Module):
    """Model and loss as one module (forward(x, y) -> the scalar loss): what torch.compile differentiates."""

    def __init__(self, model: nn.Module, loss: str, token_ids: bool) -> None:
        super().__init__()
        from edgetrain.compiler.frontend.capture import objective

        self.m = model
        self.fn = objective(loss, token_ids)

    def forward(self, x, y):
        return self.fn(self.m, x, y)


class TorchStep:
    """eager (and the base of the other torch methods): the model, its loss module, its optimizer(s)."""

    def __init__(self, w: Workload, setting: str) -> None:
        from edgetrain.compiler.workbench.reference import make_optimizer

        model, resolved = build_model(w)
        self.model = model
        self.objective = Objective(model, w.loss, resolved.input_dtype == "int64")
        self.opt_config = optimizer_config(w.optimizer).to_json()
        self.optimizers = [make_optimizer(model.parameters(), self.opt_config)]
        self.prepare(setting, make_optimizer)

    def prepare(self, setting: str, make_optimizer) -> None:
        pass

    def forward_backward(self, x, y) -> None:
        self.objective(x, y).backward()

    def step(self, x, y) -> None:
        self.forward_backward(x, y)
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)

    def state_bytes(self) -> int:
        held = [*self.model.parameters(), *self.model.buffers()]
        held += [p.grad for p in self.model.parameters() if p.grad is not None]
        held += [t for opt in self.optimizers for st in opt.state.values() for t in st.values()]
        return _tensor_bytes(held)

    def close(self) -> None:
        pass


class OptimHookStep(TorchStep):
    """The update inside backward: each parameter's own optimizer steps once its gradient is accumulated."""

    def prepare(self, setting, make_optimizer) -> None:
        per_param = {p: make_optimizer([p], self.opt_config) for p in self.model.parameters() if p.requires_grad}

        def hook(p: torch.Tensor) -> None:
            per_param[p].step()
            per_param[p].zero_grad(set_to_none=True)

        for p in per_param:
            p.register_post_accumulate_grad_hook(hook)
        self.optimizers = list(per_param.values())

    def step(self, x, y) -> None:
        self.forward_backward(x, y)  # the hooks updated every parameter and freed its gradient


class CheckpointStep(TorchStep):
    """Every block's forward under torch.utils.checkpoint: its inside recomputed in backward."""

    def prepare(self, setting, make_optimizer) -> None:
        from torch.utils.checkpoint import checkpoint

        hf = [m for m in self.model.modules() if getattr(m, "supports_gradient_checkpointing", False)]
        if hf:  # transformers' own switch: torch.utils.checkpoint around each decoder layer
            if hasattr(hf[0], "activation_checkpointing_enable"):  # its name from transformers 5 on
                hf[0].activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                hf[0].gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return
        kinds = block_types()
        blocks = [m for m in self.model.modules() if isinstance(m, kinds)]
        for b in blocks:
            b.forward = _checkpointed(checkpoint, b.forward)
        if not blocks:
            if not isinstance(self.model, nn.Sequential):
                raise ValueError(f"{type(self.model).__name__} has no block to checkpoint (see "
                                 "benchmarks/peers_models.py: block_types)")
            self.objective.m = SequentialCheckpoint(self.model, max(1, round(math.sqrt(len(self.model)))))


class SequentialCheckpoint(nn.Module):
    """A plain nn.Sequential run by torch's checkpoint_sequential in `segments` segments."""

    def __init__(self, seq: nn.Sequential, segments: int) -> None:
        super().__init__()
        self.seq, self.segments = seq, segments

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint_sequential

        return checkpoint_sequential(self.seq, self.segments, x, use_reentrant=False)


def _checkpointed(checkpoint, forward):
    def call(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return call


class CompileStep(TorchStep):
    """torch.compile of model and loss; AOTAutograd's partitioner keeps `activation_memory_budget` (a fraction of
    the compiled region's saved activations) and recomputes the rest in backward."""

    def prepare(self, setting, make_optimizer) -> None:
        import torch._dynamo

        # every configuration of a model compiles the same code: room for each without falling back to eager
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        torch._dynamo.config.accumulated_cache_size_limit = max(
            torch._dynamo.config.accumulated_cache_size_limit, 512)
        self.budget = float(setting)
        self.compiled = torch.compile(self.objective, backend=_inductor_at(self.budget))

    def forward_backward(self, x, y) -> None:
        import torch._functorch.config as functorch_config

        with functorch_config.patch(activation_memory_budget=self.budget):
            self.compiled(x, y).backward()


def _inductor_at(budget: float):
    """Inductor (what backend="inductor" calls) with the partitioner's budget set while it compiles. A backend of
    its own per budget also makes dynamo compile each configuration apart: it guards on the backend, not on
    functorch's config, and would otherwise hand a second model of the same code the first one's graphs."""
    import torch._functorch.config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        with functorch_config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs)

    return backend


def plan_dir(work: str, model: str, budget: str, method: str = "edgetrain") -> str:
    return os.path.join(work, "plans", f"{method}-{os.path.basename(model).replace(':', '-')}-"
                                       f"{budget.replace('%', 'pct')}")


def compile_plan(w: Workload, budget: str, out: str, method: str = "edgetrain") -> dict:
    """An edgetrain plan of the workload at `budget` (POET, Python plan; fused for `edgetrain-fused`) in `out`;
    compile's summary."""
    from edgetrain.compiler.pipeline import CompileOptions, compile_model

    return compile_model(CompileOptions(model=w.model, target=w.target, budget=budget, out=out,
                                        batch_size=w.batch_size, time_limit=w.time_limit, loss=w.loss,
                                        seed=w.seed, fuse=method.startswith("edgetrain-fused"),
                                        scheduler="checkmate" if method == "edgetrain-fused-recompute" else "poet",
                                        optimizer=optimizer_config(w.optimizer)))


class EdgetrainStep:
    """A compiled plan trained by the runtime's Trainer, at the workload's thread count like every method."""

    def __init__(self, w: Workload, setting: str, folder: str) -> None:
        from edgetrain.runtime.python import Trainer

        self.trainer = Trainer(folder)
        self.trainer.rt.threads = w.threads  # the runtime pins it in each step; a plan's scratch is counted for its own

    def step(self, x, y) -> None:
        self.trainer.step(x, y)

    def state_bytes(self) -> int:
        return self.trainer.rt.ledger.live_bytes

    def ledger_peak(self) -> int:
        return self.trainer.rt.ledger.peak_bytes

    def close(self) -> None:
        self.trainer.close()


STEPS = {"eager": TorchStep, "eager-optim-hook": OptimHookStep, "checkpoint": CheckpointStep,
         "compile": CompileStep}


def make_step(w: Workload, method: str, setting: str, work: str):
    if method in PLANS:
        return EdgetrainStep(w, setting, plan_dir(work, w.model, setting, method))
    return STEPS[method](w, setting)
