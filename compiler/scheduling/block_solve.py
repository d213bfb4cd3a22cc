"""One block's sub-problem of the repeated-block restriction (repeats.py), solved at the memory its neighbours
leave: every variable but the tied blocks' shared ones fixed at a schedule of the model, the rest solved as a
MILP. The tied blocks' variables are a few thousand of the restricted model's hundreds of thousands (the rest
belong to the tensors outside the blocks, whose windows span the whole backward), so HiGHS reaches this one's root
where it does not reach the whole model's; every solution is a point of the restricted model."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .milp.model import SolveResult
from .milp.registry import Solver
from .poet import PoetModel
from .repeats import Restriction


def tied_columns(pm: PoetModel, shape: Restriction) -> np.ndarray:
    """For each variable of `pm`, whether it is shared by the tied blocks."""
    tied = set(shape.tie) | {j for j, _ in shape.tie.values()}
    out = np.zeros(pm.milp.n_vars, dtype=bool)
    for d in (pm.K, pm.PO):
        for i, j in d.items():
            out[j] |= i in tied
    for d in (pm.S, pm.R, pm.P):
        for (_, i), j in d.items():
            out[j] |= i in tied
    return out


def block_solve(solver: Solver | str, pm: PoetModel, shape: Restriction, x: np.ndarray, seconds: float, *,
                mip_gap: float = 1e-4, threads: int | None = None) -> SolveResult:
    """The restricted model with every variable but the tied blocks' fixed at `x` (a point of it), from `x`."""
    free = tied_columns(pm, shape)
    x = np.round(np.asarray(x, dtype=np.float64))
    m = pm.milp
    sub = replace(m, lower=list(np.where(free, np.asarray(m.lower, dtype=np.float64), x)),
                  upper=list(np.where(free, np.asarray(m.upper, dtype=np.float64), x)))
    return Solver.of(solver).solve(sub, time_limit=seconds, mip_gap=mip_gap, warm_start=x, threads=threads)
