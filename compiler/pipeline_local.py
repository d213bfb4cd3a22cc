"""`edgetrain compile MODEL --mode local`: heads, memory lines, Algorithm 1, a schedule and a Jetson plan.

The pipeline: split the zoo model into its trainable layers, give each an AAN-LL head, measure each layer's
(+ head's) training bytes at several batches and fit a line (the profiler), partition the layers into blocks
under the budget (Algorithm 1), and write the schedule (format v2, ``mode: local``), the initial weights of
layers and heads (safetensors) and the generated plan that the runtime's Controller/Worker trains.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
from safetensors.torch import save_file

from edgetrain.runtime.python.activation_cache import CACHE_DTYPES
from edgetrain.runtime.python.local_layers import build

from .schedule_file import format as schedule_format
from .scheduling.budget import parse_budget
from .errors import BudgetError, UnsupportedModelError
from .frontend.modelspec import resolve
from .graph.ir import OptimizerConfig
from .local.heads import HEAD_FRAC, head_spec, split_layers
from .local.memory_lines import DEFAULT_BATCHES, DEFAULT_HELD_OUT, profile_layers
from .local.partition import DEFAULT_CAP, DEFAULT_RHO, partition
from .local.spec import copy_weights, head_layer_spec, layer_spec

__all__ = ["LocalOptions", "compile_local", "WEIGHTS"]

WEIGHTS = "weights.safetensors"
SGD_DEFAULTS = OptimizerConfig(name="sgd")


@dataclass
class LocalOptions:
    model: str
    target: str
    budget: str
    out: str
    cap: int = DEFAULT_CAP
    rho: float = DEFAULT_RHO
    input_shape: tuple[int, int, int] | None = None  # default: the zoo model's
    profile_batches: tuple[int, ...] = DEFAULT_BATCHES
    held_out_batch: int = DEFAULT_HELD_OUT
    profile_method: str = "counter"  # counter (CPU, deterministic), profiler (torch.profiler), cuda (allocator)
    lr: float = SGD_DEFAULTS.lr  # SGD's defaults, as backprop plans take them
    # The lr is per this many samples, scaled linearly with each block's batch (Goyal et al. 2017), so blocks
    # with large batches keep the per-sample step size; None: the same lr at every batch.
    lr_reference_batch: int | None = 32
    momentum: float = SGD_DEFAULTS.momentum
    weight_decay: float = SGD_DEFAULTS.weight_decay
    cache_dtype: str = "float32"
    val_fraction: float = 0.1
    exit_tolerance_points: float = 0.5
    seed: int = 0


def model_classes(resolved, in_shape: tuple[int, ...], seed: int) -> int:
    """The classes every head scores: those of the model's own output (dim 1 of its (B, C) logits), or its
    `num_classes` attribute."""
    from .frontend.labels import example_labels

    example = torch.randn(2, *in_shape, generator=torch.Generator().manual_seed(seed))
    labels = example_labels("cross_entropy", seed, resolved, resolved.module, example)
    if labels.example.dim() != 1:
        raise UnsupportedModelError(f"--mode local trains classifiers of whole images (B, C) outputs; "
                                    f"{resolved.spec} scores labels of shape {list(labels.example.shape[1:])} per "
                                    "example: use --mode poet")
    return labels.num_classes


def _params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def compile_local(opts: LocalOptions, progress=None) -> dict:
    from edgetrain.targets import load_target

    from .output_dir import StagedOutput

    budget = parse_budget(opts.budget)
    if budget.nbytes is None:
        raise BudgetError(f"--mode local needs the budget in bytes (like 64MB or 512KiB), not {budget.text!r}: "
                          "a percentage or min refers to plain backprop's peak, which local learning "
                          "never holds")
    if opts.cache_dtype not in CACHE_DTYPES:
        raise BudgetError(f"--cache-dtype must be one of {', '.join(CACHE_DTYPES)}, got {opts.cache_dtype!r}")
    target = load_target(opts.target)
    stage = StagedOutput(opts.out)  # fails before any work when --out cannot be replaced
    with stage:
        result = _compile_local_into(opts, budget, target, str(stage.path), stage, progress)
        stage.commit()
    return dict(result, out=opts.out)


def _compile_local_into(opts: LocalOptions, budget, target, work: str, stage, progress) -> dict:
    """Profile, partition and write every output into the staging folder `work`."""
    from edgetrain.codegen.local_plan import render_local_plan
    from edgetrain.runtime.python.integrity import weights_table

    torch.manual_seed(opts.seed)
    resolved = resolve(opts.model)  # the factory as the user wrote it: no arguments from edgetrain
    model = resolved.module
    if not (opts.input_shape or resolved.input_shape):
        raise UnsupportedModelError(f"the input shape of {opts.model!r} is unknown; pass --input-shape C,H,W")
    in_shape = tuple(opts.input_shape or resolved.input_shape)
    classes = model_classes(resolved, in_shape, opts.seed)
    layers = split_layers(model, in_shape)
    if progress:
        progress(f"profiling {len(layers)} layers at batches {list(opts.profile_batches)}")
    profiles = profile_layers(model, in_shape, classes, batches=opts.profile_batches,
                              held_out=opts.held_out_batch, method=opts.profile_method)
    context = None
    if opts.profile_method == "cuda":
        from .local.memory_lines import cuda_context_bytes

        context = cuda_context_bytes()
    part = partition([p.fit.to_line(p.name) for p in profiles], budget.nbytes, cap=opts.cap, rho=opts.rho)

    weights, layer_rows, head_rows = {}, [], []
    torch.manual_seed(opts.seed + 1)  # heads initialize from their own seed, whatever the model did
    for i, (tl, prof) in enumerate(zip(layers, profiles)):
        spec = layer_spec(tl.module)
        built = build(spec)
        copy_weights(tl.module, built, tl.in_shape)
        hs = head_spec(tl.out_shape, classes)
        head = build(head_layer_spec(hs))
        for kind, mod in (("layer", built), ("head", head)):
            weights.update({f"{kind}.{i}.{k}": v.detach().contiguous().clone() for k, v in mod.state_dict().items()})
        layer_rows.append({
            "name": tl.name, "in_shape": list(tl.in_shape), "out_shape": list(tl.out_shape),
            "params": _params(built), "spec": spec,
            "line": {"slope": prof.fit.slope, "intercept": prof.fit.intercept, "r2": prof.fit.r2,
                     "points": [list(pt) for pt in prof.points], "held_out_batch": prof.held_out_batch,
                     "held_out_measured": prof.held_out_measured,
                     "held_out_predicted": prof.held_out_predicted},
        })
        head_rows.append({"head_channels": hs.head_channels, "pool": hs.pool, "classes": hs.classes,
                          "params": hs.params, "act_bytes_per_sample": hs.act_bytes_per_sample,
                          "spec": head_layer_spec(hs)})
    min_feasible = max(math.ceil(p.fit.predict(1)) for p in profiles)
    body = schedule_format.local_body(
        spec=resolved.spec, kwargs=resolved.kwargs, input_shape=list(in_shape), num_classes=classes,
        target=target, budget_text=budget.text, budget_bytes=budget.nbytes, min_feasible_bytes=min_feasible,
        local={
            "layers": layer_rows, "heads": head_rows, "partition": part.to_dict(),
            "profile": {"method": opts.profile_method, "device": "cuda" if opts.profile_method == "cuda" else "cpu",
                        "batches": list(opts.profile_batches), "head_frac": HEAD_FRAC,
                        "cuda_context_bytes": context},
            "training": {"lr": opts.lr, "lr_reference_batch": opts.lr_reference_batch, "momentum": opts.momentum,
                         "weight_decay": opts.weight_decay, "cache_dtype": opts.cache_dtype,
                         "val_fraction": opts.val_fraction, "exit_tolerance_points": opts.exit_tolerance_points},
            "full_params": _params(model),
        },
        seed=opts.seed)
    save_file(weights, os.path.join(work, WEIGHTS))
    render_local_plan(json.loads(schedule_format.dumps(body)), work)
    # The schedule last: it records the sha256 of every file above and the weights' table.
    body["outputs"] = stage.outputs(weights_table(os.path.join(work, WEIGHTS)))
    schedule_format.save(body, work)
    return {
        "out": opts.out, "mode": "local", "model": resolved.spec, "target": target.name,
        "budget_bytes": budget.nbytes, "min_feasible_bytes": min_feasible, "layers": len(layers),
        "blocks": [{"index": b.index, "batch": b.batch, "layers": [lb.name for lb in b.layers],
                    "peak_bytes": b.peak_bytes} for b in part.blocks],
        "full_params": _params(model),
        "min_r2": min(p.fit.r2 for p in profiles),
        "max_held_out_rel_error": max(p.held_out_rel_error for p in profiles),
    }
