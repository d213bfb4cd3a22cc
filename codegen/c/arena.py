"""The offset planner: packs the schedule's tensor lifetimes into one static arena.

Every compute, recompute or page-in of a tensor opens a lifetime at its step index; the free step closes
it. Two lifetimes may share bytes only if they never overlap in time (a kernel's output is allocated
while its operands are alive, so an output never aliases an input, except an output the graph writes over a
dying operand: firmware.py gives the two one lifetime, so one offset). The live bytes at the busiest step
are a lower bound on any arena - and exactly the schedule's activation peak, which the validator
predicted. Fragmentation can make a packing larger; the planner tries a few orderings of greedy
best-fit placement (largest first as in TFLite Micro's greedy planner, earliest first, longest first),
then, until one reaches the lower bound, orderings drawn from a fixed-seed generator (shuffles and
size orders with jitter; a fixed number of them, so the result never depends on the machine's speed),
and keeps the smallest arena. Offsets and sizes are in 4-byte words: every tensor starts on a word (float32 and
int32 need it; an int8 tensor's kernels load words), and an int8 tensor's lifetime also counts its exact bytes, so
the live bytes equal the schedule's prediction to the byte while the arena rounds each int8 tensor up to a word.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Lifetime:
    name: str  # the tensor
    start: int  # step index that allocates it
    end: int  # step index that frees it (inclusive)
    words: int  # size in 4-byte words
    offset: int = -1  # word offset in the arena, once placed
    nbytes: int = -1  # the bytes it holds: 4 * words, or fewer for an int8 tensor (its last word's tail unused)

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            self.nbytes = 4 * self.words

    @classmethod
    def of_bytes(cls, name: str, start: int, end: int, nbytes: int) -> "Lifetime":
        """A tensor of `nbytes` bytes, placed on whole words (an int8 tensor's kernels load words)."""
        return cls(name, start, end, -(-nbytes // 4), nbytes=nbytes)

    def overlaps(self, other: "Lifetime") -> bool:
        return self.start <= other.end and other.start <= self.end


def live_peak_words(lifetimes: list[Lifetime]) -> int:
    """The most words alive at any one step: the lower bound of every packing."""
    return _live_peak(lifetimes, lambda lt: lt.words)


def live_peak_bytes(lifetimes: list[Lifetime]) -> int:
    """The most bytes the tensors alive at any one step hold: what the schedule's memory model counts."""
    return _live_peak(lifetimes, lambda lt: lt.nbytes)


def _live_peak(lifetimes: list[Lifetime], size) -> int:
    events: dict[int, int] = {}
    for lt in lifetimes:
        events[lt.start] = events.get(lt.start, 0) + size(lt)
        events[lt.end + 1] = events.get(lt.end + 1, 0) - size(lt)
    peak = live = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def _place(order: list[Lifetime]) -> tuple[dict[int, int], int]:
    """Greedy best-fit in the given order: each lifetime takes the smallest gap that holds it among the
    lifetimes already placed that overlap it in time (the lowest such gap on ties)."""
    placed: list[tuple[Lifetime, int]] = []
    offsets: dict[int, int] = {}
    top = 0
    for lt in order:
        busy = sorted((off, off + other.words) for other, off in placed if other.overlaps(lt))
        best, best_gap, cursor = None, None, 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= lt.words and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, hi)
        if best is None:
            best = cursor
        placed.append((lt, best))
        offsets[id(lt)] = best
        top = max(top, best + lt.words)
    return offsets, top


STRATEGIES = {
    "largest-first": lambda lt: (-lt.words, lt.start, lt.name),
    "earliest-first": lambda lt: (lt.start, -lt.words, lt.name),
    "longest-first": lambda lt: (-(lt.end - lt.start), -lt.words, lt.start, lt.name),
}


@dataclass
class Packing:
    words: int  # arena size
    lower_bound_words: int  # live peak
    strategy: str

    @property
    def bytes(self) -> int:
        return 4 * self.words


def _orders(lifetimes: list[Lifetime], trials: int):
    for name, key in STRATEGIES.items():
        yield name, sorted(lifetimes, key=key)
    rng = random.Random(0)
    base = sorted(lifetimes, key=STRATEGIES["earliest-first"])
    for k in range(trials):
        if k % 2:
            jitter = {id(lt): lt.words * rng.uniform(0.5, 1.5) for lt in base}
            yield f"jittered-size-{k}", sorted(base, key=lambda lt: -jitter[id(lt)])
        else:
            order = base[:]
            rng.shuffle(order)
            yield f"shuffled-{k}", order


def pack(lifetimes: list[Lifetime], trials: int | None = None) -> Packing:
    """Give every lifetime an offset (in place) and return the arena size. Deterministic."""
    bound = live_peak_words(lifetimes)
    if trials is None:  # about the same work for any number of lifetimes
        trials = max(20, min(2000, 2_000_000 // max(1, len(lifetimes)) ** 2))
    best = None
    for name, order in _orders(lifetimes, trials):
        offsets, top = _place(order)
        if best is None or top < best[1]:
            best = (name, top, offsets)
        if top == bound:
            break
    name, top, offsets = best  # type: ignore[misc]
    for lt in lifetimes:
        lt.offset = offsets[id(lt)]
    check(lifetimes)
    return Packing(words=top, lower_bound_words=bound, strategy=name)


def check(lifetimes: list[Lifetime]) -> None:
    """No two lifetimes that overlap in time overlap in the arena (a guard on the planner itself)."""
    for i, a in enumerate(lifetimes):
        for b in lifetimes[i + 1:]:
            if a.overlaps(b) and a.offset < b.offset + b.words and b.offset < a.offset + a.words:
                raise AssertionError(f"arena planner: {a.name} and {b.name} overlap in time and space")
