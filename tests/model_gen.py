"""Random models for the property tests: chains, residual blocks, and branches joined by torch.cat.

A model is described by a plain, JSON-able spec. Specs are drawn through a `choose(lo, hi) -> int` function, so
one generator serves Hypothesis (`choose` draws integers, which shrink) and a seeded `random.Random` (fixed models
for the end-to-end tests, loadable by the compiler as `tests/model_gen.py:random_model`).

Only ops the frontend supports are used: Conv2d (random channels, kernel, stride, padding, groups, bias),
BatchNorm2d, ReLU (sometimes in place, never on a tensor another branch reads), ReLU6, MaxPool2d, AvgPool2d,
Dropout, residual `+` of two same-shaped branches, torch.cat of branches along channels, Flatten + Linear head
(in the cat family sometimes a multi-scale head: flattened branches of different strides joined by torch.cat).
Spatial sizes stay small (4..12) so that each example traces, solves and runs in well under a second.
"""
from __future__ import annotations

import random
from typing import Callable

import torch
from torch import nn

Choose = Callable[[int, int], int]
FAMILIES = ("chain", "residual", "cat")
MAX_CHANNELS = 8


def _pick(choose: Choose, options: list):
    return options[choose(0, len(options) - 1)]


def _out(size: int, k: int, s: int, p: int) -> int:
    return (size + 2 * p - k) // s + 1


# -- layers of a chain: any supported layer whose output is at least 1x1 ---------------------------------
def _chain_layer(choose: Choose, c: int, h: int, w: int, batch: int, no_inplace: bool) -> tuple[dict, tuple]:
    kinds = ["conv", "conv", "relu", "relu6", "maxpool", "avgpool", "dropout"]
    if batch * h * w > 1:  # batch-norm in training mode needs more than one value per channel
        kinds.append("bn")
    kind = _pick(choose, kinds)
    if kind == "conv":
        k = choose(1, min(3, h + 2, w + 2))
        p = choose(0, k // 2 + (1 if k > 1 else 0))
        while h + 2 * p < k or w + 2 * p < k:
            p += 1
        s = choose(1, 2)
        divisors = [d for d in range(1, c + 1) if c % d == 0]
        groups = _pick(choose, divisors)
        cout = groups * choose(1, max(1, MAX_CHANNELS // groups))
        layer = {"op": "conv", "cout": cout, "k": k, "s": s, "p": p, "groups": groups, "bias": bool(choose(0, 1))}
        return layer, (cout, _out(h, k, s, p), _out(w, k, s, p))
    if kind in ("maxpool", "avgpool"):
        k = choose(1, min(3, h, w))
        s = choose(1, 2)
        p = choose(0, k // 2)
        return {"op": kind, "k": k, "s": s, "p": p}, (c, _out(h, k, s, p), _out(w, k, s, p))
    if kind == "relu":
        return {"op": "relu", "inplace": (not no_inplace) and bool(choose(0, 1))}, (c, h, w)
    if kind == "dropout":
        return {"op": "dropout", "p": _pick(choose, [0.0, 0.1, 0.25, 0.5])}, (c, h, w)
    return {"op": kind}, (c, h, w)


def _inplace_ok(layers: list) -> bool:
    """In place only after conv or batch-norm (their outputs are not saved for backward, in eager PyTorch
    either: ReLU -> ReLU(inplace) fails in autograd itself)."""
    return bool(layers) and layers[-1]["op"] in ("conv", "bn")


def _chain(choose: Choose, n: int, shape: tuple, batch: int, shared_input: bool) -> tuple[list, tuple]:
    layers: list[dict] = []
    for k in range(n):
        layer, shape = _chain_layer(choose, *shape, batch, (shared_input and k == 0) or not _inplace_ok(layers))
        layers.append(layer)
    return layers, shape


# -- layers of a branch: same output size for every branch of a block (stride s on the first layer) ---------
def _branch(choose: Choose, c: int, h: int, w: int, batch: int, s: int, cout: int | None,
            allow_identity: bool) -> tuple[list, int]:
    """Layers mapping (c, h, w) to (cout, or any channels if None, ceil(h/s), ceil(w/s)); [] is the identity.

    The first layer reads the block's input, which other branches read too: it is never an in-place ReLU.
    (Nor is a layer after anything but conv or batch-norm, see `_inplace_ok`.)
    """
    if allow_identity and s == 1 and cout in (None, c) and c <= 16 and choose(0, 2) == 0:
        return [], c
    layers: list[dict] = []
    n = choose(1, 3)
    cur = c
    for k in range(n):
        stride = s if k == 0 else 1
        last = k == n - 1
        if last and cout is not None and cur != cout:
            kinds = ["conv"]
        else:
            kinds = ["conv", "conv", "maxpool", "avgpool"]
            if stride == 1:
                kinds += ["relu", "relu6", "dropout"] + (["bn"] if batch * h * w > 1 else [])
        kind = _pick(choose, kinds)
        if kind == "conv":
            ks = _pick(choose, [1, 3])
            if last and cout is not None:
                co = cout
                groups = _pick(choose, [d for d in range(1, min(cur, co) + 1) if cur % d == 0 and co % d == 0])
            else:
                groups = _pick(choose, [d for d in range(1, cur + 1) if cur % d == 0])
                co = groups * choose(1, max(1, MAX_CHANNELS // groups))
            layers.append({"op": "conv", "cout": co, "k": ks, "s": stride, "p": ks // 2, "groups": groups,
                           "bias": bool(choose(0, 1))})
            cur = co
        elif kind in ("maxpool", "avgpool"):  # 3x3, padding 1: the size of a padded 3x3 conv of this stride
            layers.append({"op": kind, "k": 3, "s": stride, "p": 1})
        elif kind == "relu":
            layers.append({"op": "relu", "inplace": k > 0 and _inplace_ok(layers) and bool(choose(0, 1))})
        elif kind == "dropout":
            layers.append({"op": "dropout", "p": _pick(choose, [0.1, 0.5])})
        else:
            layers.append({"op": kind})
    return layers, cur


def _post(choose: Choose, c: int, h: int, w: int, batch: int) -> list:
    """After a join: nothing, a ReLU, or BN + ReLU."""
    opts = [[], [{"op": "relu", "inplace": True}], [{"op": "relu6"}]]
    if batch * h * w > 1:
        opts.append([{"op": "bn"}, {"op": "relu", "inplace": False}])
    return _pick(choose, opts)


def gen_spec(choose: Choose, family: str | None = None) -> dict:
    """A random model spec; `family` None draws one."""
    family = family or _pick(choose, list(FAMILIES))
    batch = choose(1, 4)
    c, h, w = choose(1, 4), choose(4, 12), choose(4, 12)
    spec: dict = {"family": family, "batch": batch, "input": [c, h, w], "blocks": []}
    shape = (c, h, w)
    n_blocks = choose(1, 3) if family != "chain" else 1
    if family != "chain" and choose(0, 1):  # a stem conv first, so the blocks see learned features
        layers, shape = _chain(choose, 1, shape, batch, shared_input=True)
        spec["blocks"].append({"kind": "chain", "layers": layers})
    for _ in range(n_blocks):
        c, h, w = shape
        if family == "chain":
            layers, shape = _chain(choose, choose(1, 6), shape, batch, shared_input=True)
            spec["blocks"].append({"kind": "chain", "layers": layers})
            continue
        s = choose(1, 2) if min(h, w) >= 4 else 1
        oh, ow = (h - 1) // s + 1, (w - 1) // s + 1
        if family == "residual":
            main, cout = _branch(choose, c, h, w, batch, s, None, allow_identity=False)
            short, _ = _branch(choose, c, h, w, batch, s, cout, allow_identity=True)
            if short and choose(0, 1) and batch * h * w > 1:
                short = short + [{"op": "bn"}]
            spec["blocks"].append({"kind": "residual", "main": main, "short": short,
                                   "post": _post(choose, cout, oh, ow, batch)})
            shape = (cout, oh, ow)
        else:
            branches, total = [], 0
            for _ in range(choose(2, 3)):
                layers, co = _branch(choose, c, h, w, batch, s, None, allow_identity=True)
                branches.append(layers)
                total += co
            spec["blocks"].append({"kind": "cat", "branches": branches, "post": _post(choose, total, oh, ow, batch)})
            shape = (total, oh, ow)
    c, h, w = shape
    spec["head"] = {"dropout": _pick(choose, [0.0, 0.0, 0.2]), "hidden": _pick(choose, [0, 0, 8]),
                    "classes": choose(2, 10), "features": c * h * w, "flatcat": []}
    if family == "cat" and choose(0, 2) == 0:
        # A multi-scale head: branches of their own strides, each flattened, joined by torch.cat(dim=1). The
        # gradient of each branch is a narrow view of the 2-d gradient, reshaped back to 4-d.
        features = 0
        for _ in range(choose(2, 3)):
            s = choose(1, 2)
            layers, co = _branch(choose, c, h, w, batch, s, None, allow_identity=True)
            spec["head"]["flatcat"].append(layers)
            features += co * ((h - 1) // s + 1) * ((w - 1) // s + 1)
        spec["head"]["features"] = features
    return spec


def spec_from_seed(family: str, seed: int) -> dict:
    rng = random.Random(f"{family}-{seed}")
    return gen_spec(rng.randint, family)


# -- modules ----------------------------------------------------------------------------------------------
def _layers(specs: list, c: int) -> tuple[nn.Sequential, int]:
    mods = []
    for L in specs:
        op = L["op"]
        if op == "conv":
            mods.append(nn.Conv2d(c, L["cout"], L["k"], stride=L["s"], padding=L["p"], groups=L["groups"],
                                  bias=L["bias"]))
            c = L["cout"]
        elif op == "bn":
            mods.append(nn.BatchNorm2d(c))
        elif op == "relu":
            mods.append(nn.ReLU(inplace=L["inplace"]))
        elif op == "relu6":
            mods.append(nn.ReLU6())
        elif op == "maxpool":
            mods.append(nn.MaxPool2d(L["k"], stride=L["s"], padding=L["p"]))
        elif op == "avgpool":
            mods.append(nn.AvgPool2d(L["k"], stride=L["s"], padding=L["p"]))
        elif op == "dropout":
            mods.append(nn.Dropout(L["p"]))
        else:
            raise ValueError(op)
    return nn.Sequential(*mods), c


class Residual(nn.Module):
    def __init__(self, block: dict, c: int) -> None:
        super().__init__()
        self.main, cout = _layers(block["main"], c)
        self.short, _ = _layers(block["short"], c) if block["short"] else (nn.Identity(), c)
        self.post, _ = _layers(block["post"], cout)
        self.cout = cout

    def forward(self, x):
        return self.post(self.main(x) + self.short(x))


class Concat(nn.Module):
    def __init__(self, block: dict, c: int) -> None:
        super().__init__()
        outs = []
        mods = []
        for b in block["branches"]:
            m, co = _layers(b, c) if b else (nn.Identity(), c)
            mods.append(m)
            outs.append(co)
        self.branches = nn.ModuleList(mods)
        self.cout = sum(outs)
        self.post, _ = _layers(block["post"], self.cout)

    def forward(self, x):
        return self.post(torch.cat([b(x) for b in self.branches], dim=1))


class FlatCat(nn.Module):
    def __init__(self, branches: list, c: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList(_layers(b, c)[0] if b else nn.Identity() for b in branches)

    def forward(self, x):
        return torch.cat([b(x).flatten(1) for b in self.branches], dim=1)


class RandomNet(nn.Module):
    def __init__(self, spec: dict) -> None:
        super().__init__()
        self.spec = spec
        self.input_shape = tuple(spec["input"])
        c = spec["input"][0]
        blocks = []
        for b in spec["blocks"]:
            if b["kind"] == "chain":
                m, c = _layers(b["layers"], c)
            elif b["kind"] == "residual":
                m = Residual(b, c)
                c = m.cout
            else:
                m = Concat(b, c)
                c = m.cout
            blocks.append(m)
        self.blocks = nn.Sequential(*blocks)
        head = spec["head"]
        self.num_classes = head["classes"]
        layers: list[nn.Module] = [FlatCat(head["flatcat"], c) if head.get("flatcat") else nn.Flatten()]
        if head["dropout"]:
            layers.append(nn.Dropout(head["dropout"]))
        if head["hidden"]:
            layers += [nn.Linear(head["features"], head["hidden"]), nn.ReLU()]
            layers.append(nn.Linear(head["hidden"], head["classes"]))
        else:
            layers.append(nn.Linear(head["features"], head["classes"]))
        self.head = nn.Sequential(*layers)

    def forward(self, x):
        return self.head(self.blocks(x))


def build(spec: dict) -> RandomNet:
    return RandomNet(spec)


def random_model(family: str = "chain", seed: int = 0) -> RandomNet:
    """Factory for `compile_model`: `tests/model_gen.py:random_model` with kwargs family=..., seed=...."""
    return build(spec_from_seed(family, seed))
