"""NeuroFlux Algorithm 1, the partitioner: per-layer feasible batch sizes from memory lines, grouped into blocks.

Inputs are one memory line per trainable layer (the layer + its auxiliary head, trained on its local loss:
``bytes(b) = slope * b + intercept``, from ``memory_lines.fit_line``), a memory budget in bytes, a batch
limit (``cap``, default 256) and the grouping threshold ``rho`` (default 0.40).

1. Feasible batch of layer n (paper lines 2-3): ``b_n = floor((budget - intercept_n) / slope_n)``; a layer
   whose memory does not grow with the batch (slope <= 0) is only limited by the cap.
2. Cap (paper line 4): ``b_n = min(b_n, cap)``. A layer with ``b_n < 1`` cannot train even one sample under
   the budget: :class:`PartitionError` names it and the bytes it needs at batch 1.
3. Grouping (paper lines 5-12). The paper groups successive layers "if the variation in feasible batch
   sizes between successive layers remains below a 40% margin". Precisely, as implemented here: scanning
   layers in order, layer n joins the block of layer n-1 iff

       |b_n - b_{n-1}| / b_{n-1} < rho        (strict; relative to the previous layer's feasible batch)

   otherwise layer n opens a new block. The comparison is between neighbours, not against the block's
   first layer or its minimum (the paper's wording: "between successive layers").
4. Block batch (paper line 11): the smallest feasible batch of its layers, so every layer of the block fits
   the budget at the block's batch (memory lines are increasing in the batch).

The text of the paper we worked from ("NeuroFlux: Memory-Efficient CNN Training Using Adaptive Local
Learning") has the prose of Algorithm 1 but not its pseudo-code listing, so rule 3's exact form (the
denominator and strictness) is our reading of the prose.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

from edgetrain.compiler.errors import BudgetError

__all__ = [
    "Line", "LayerBatch", "Block", "Partition", "PartitionError",
    "feasible_batch", "group", "partition", "DEFAULT_CAP", "DEFAULT_RHO",
]

DEFAULT_CAP = 256
DEFAULT_RHO = 0.40


class PartitionError(BudgetError):
    """A layer cannot train batch 1 under the budget (or the inputs are malformed)."""


@dataclass(frozen=True)
class Line:
    """Training memory of one layer (+ head) as a function of batch: ``slope * batch + intercept`` bytes."""

    name: str
    slope: float
    intercept: float
    r2: float | None = None

    def bytes_at(self, batch: int) -> float:
        return self.slope * batch + self.intercept


@dataclass(frozen=True)
class LayerBatch:
    name: str
    index: int
    feasible_batch: int  # after the cap
    uncapped_batch: int | None  # None: unbounded (slope <= 0)
    bytes_at_block_batch: float


@dataclass(frozen=True)
class Block:
    index: int
    layers: tuple[LayerBatch, ...]
    batch: int
    peak_bytes: float  # max over the block's layers of the line at the block's batch

    @property
    def first(self) -> int:
        return self.layers[0].index

    @property
    def last(self) -> int:
        return self.layers[-1].index


@dataclass(frozen=True)
class Partition:
    budget: int
    cap: int
    rho: float
    blocks: tuple[Block, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {
            "budget": self.budget,
            "cap": self.cap,
            "rho": self.rho,
            "blocks": [
                {
                    "index": b.index,
                    "batch": b.batch,
                    "peak_bytes": b.peak_bytes,
                    "layers": [asdict(lb) for lb in b.layers],
                }
                for b in self.blocks
            ],
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    @property
    def batches(self) -> list[int]:
        return [b.batch for b in self.blocks]

    @property
    def layer_names(self) -> list[list[str]]:
        return [[lb.name for lb in b.layers] for b in self.blocks]


def feasible_batch(line: Line, budget: float, cap: int = DEFAULT_CAP) -> tuple[int, int | None]:
    """(capped, uncapped) largest batch b with ``line.bytes_at(b) <= budget``; raises if b < 1."""
    if cap < 1:
        raise PartitionError(f"partition: batch cap must be >= 1, got {cap}")
    if not (math.isfinite(line.slope) and math.isfinite(line.intercept)):
        raise PartitionError(f"partition: layer '{line.name}' has a non-finite memory line {line}")
    if line.slope <= 0:
        if line.intercept > budget:
            raise PartitionError(
                f"partition: layer '{line.name}' needs {line.bytes_at(1):.0f} bytes at batch 1, "
                f"more than the budget of {budget:.0f} bytes")
        return cap, None
    b = math.floor((budget - line.intercept) / line.slope)
    # Float rounding right at the boundary: b is the largest batch whose line value fits, as evaluated.
    while b >= 1 and line.bytes_at(b) > budget:
        b -= 1
    while line.bytes_at(b + 1) <= budget and b < cap:
        b += 1
    if b < 1:
        raise PartitionError(
            f"partition: layer '{line.name}' needs {line.bytes_at(1):.0f} bytes at batch 1 "
            f"(slope {line.slope:.0f} B/sample + intercept {line.intercept:.0f} B), more than the budget "
            f"of {budget:.0f} bytes; raise the budget to at least {math.ceil(line.bytes_at(1))} bytes")
    return min(b, cap), b


def group(batches: Sequence[int], rho: float = DEFAULT_RHO) -> list[list[int]]:
    """Rule 3: layer indices grouped into blocks; n joins n-1's block iff |b_n - b_{n-1}| / b_{n-1} < rho."""
    if not rho >= 0:
        raise PartitionError(f"partition: rho must be >= 0, got {rho}")
    blocks: list[list[int]] = []
    for n, b in enumerate(batches):
        if n > 0 and abs(b - batches[n - 1]) < rho * batches[n - 1]:
            blocks[-1].append(n)
        else:
            blocks.append([n])
    return blocks


def partition(lines: Sequence[Line], budget: float, *, cap: int = DEFAULT_CAP,
              rho: float = DEFAULT_RHO) -> Partition:
    """Algorithm 1: lines (in layer order) -> blocks of consecutive layers, each with its batch."""
    if not lines:
        raise PartitionError("partition: no layers to partition")
    if not budget > 0:
        raise PartitionError(f"partition: budget must be > 0 bytes, got {budget}")
    fb = [feasible_batch(line, budget, cap) for line in lines]
    capped = [c for c, _ in fb]
    blocks = []
    for bi, idx in enumerate(group(capped, rho)):
        batch = min(capped[i] for i in idx)
        layers = tuple(
            LayerBatch(lines[i].name, i, capped[i], fb[i][1], lines[i].bytes_at(batch)) for i in idx)
        blocks.append(Block(bi, layers, batch, max(lb.bytes_at_block_batch for lb in layers)))
    return Partition(int(budget), int(cap), float(rho), tuple(blocks))
