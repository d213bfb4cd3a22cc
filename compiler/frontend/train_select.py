"""`--train`: which parameters train. Everything else is frozen (requires_grad=False) before capture, so
torch's joint graph holds no gradient, no optimizer state and no backward work that serves only them.

A spec is a comma-separated list; the selection is the union of its items:

- an fnmatch pattern over parameter names (`classifier.*`, `features.16.*`, `*.bias`), case-sensitive;
- `biases`: every parameter whose name ends in `bias` (bias-only fine-tuning, as TinyTL);
- `last:N`: the parameters of the last N modules that own parameters, in module registration order;
- `all`: every parameter.

Each item must select something: a pattern that matches nothing is a typo, not an empty wish.
"""
from __future__ import annotations

import fnmatch

import torch.nn as nn

from edgetrain.compiler.errors import TrainSelectionError

SPECIAL = ("all", "biases", "last:N")
_EXAMPLE = "'classifier.*,features.16.*', biases, last:2 or all"


def parse_train_spec(text: str) -> list[str]:
    """The items of a `--train` spec, checked for form (not yet against a model)."""
    items = [s.strip() for s in str(text).split(",")]
    if not text or not str(text).strip() or any(not s for s in items):
        raise TrainSelectionError(f"--train {text!r} has an empty item; give comma-separated parameter name "
                                  f"patterns or one of {', '.join(SPECIAL)} (e.g. {_EXAMPLE})")
    for s in items:
        if s.startswith("last:"):
            _last_count(s)
    return items


def _last_count(item: str) -> int:
    n = item[len("last:"):]
    if not n.isdigit() or int(n) < 1:
        raise TrainSelectionError(f"--train {item!r}: N in last:N must be a whole number of at least 1 "
                                  "(the parameters of the model's last N modules that own parameters)")
    return int(n)


def _names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters()]  # tied parameters once, under their first name


def _last_modules(model: nn.Module, n: int, item: str) -> set[str]:
    canonical = {id(p): name for name, p in model.named_parameters()}
    owners = [m for _, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
    if n > len(owners):
        raise TrainSelectionError(f"--train {item}: the model has only {len(owners)} modules that own parameters; "
                                  f"use last:{len(owners)} or all")
    return {canonical[id(p)] for m in owners[-n:] for p in m.parameters(recurse=False)}


def _sample(names: list[str]) -> str:
    """A few names from each end: heads and classifiers, the usual choices, are last."""
    if len(names) <= 7:
        return ", ".join(names)
    return f"{', '.join(names[:4])}, ..., {', '.join(names[-3:])} ({len(names)} in all)"


def select_trainable(model: nn.Module, spec: str) -> set[str]:
    """The names (as model.named_parameters() gives them) of the parameters `spec` trains."""
    items = parse_train_spec(spec)
    names = _names(model)
    if not names:
        raise TrainSelectionError("--train: the model has no parameters, so there is nothing to train")
    chosen: set[str] = set()
    for item in items:
        if item == "all":
            hit = set(names)
        elif item == "biases":
            hit = {n for n in names if n.endswith("bias")}
            if not hit:
                raise TrainSelectionError(f"--train biases: the model has no parameter whose name ends in 'bias' "
                                          f"(its parameters: {_sample(names)}); name the ones to train instead")
        elif item.startswith("last:"):
            hit = _last_modules(model, _last_count(item), item)
        else:
            hit = {n for n in names if fnmatch.fnmatchcase(n, item)}
            if not hit:
                raise TrainSelectionError(f"--train pattern {item!r} matches no parameter; the model's parameters "
                                          f"are named like {_sample(names)} (patterns are fnmatch, e.g. 'fc.*')")
        chosen |= hit
    if not chosen:  # every item matched something, so only a model without parameters gets here
        raise TrainSelectionError(f"--train {spec!r} leaves nothing to train")
    return chosen


def apply_selection(model: nn.Module, trainable: set[str]) -> None:
    """Set requires_grad: exactly the parameters in `trainable` train."""
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)


def select_and_apply(model: nn.Module, spec: str) -> set[str]:
    chosen = select_trainable(model, spec)
    apply_selection(model, chosen)
    return chosen
