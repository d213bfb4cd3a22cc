"""Frozen weights beyond flash, streamed from storage: which ones, and the graph that reads them from there.

A microcontroller keeps frozen weights const in flash. When they do not all fit, the largest go to storage
(the SD card) until the rest fits the flash left for them. A streamed weight is paged into the arena before
each node that reads it runs (its forward, a recompute of it, its input-gradient backward): it is that
node's workspace, and its page-in time and energy are in the node's (compiler/graph/costs.py), so the
schedulers count it like any other memory and paging. Pure functions: nothing here solves or reads files.
"""
from __future__ import annotations

from dataclasses import replace
from math import gcd

from edgetrain.compiler.errors import DeviceFitError

from .aten_node import read_rows, weight_rows
from .costs import costed
from .ir import TrainingGraph

CONV = "aten.convolution.default"
CONV_BACK = "aten.convolution_backward.default"


def choose_streamed(frozen: dict[str, int], flash_room: int, ram_room: int, storage_bytes: int,
                    device: str = "the device", sliceable: dict[str, int] | None = None) -> list[str]:
    """The frozen weights (name -> bytes, in model order) to keep in storage so that the rest fits
    `flash_room`: largest first (the earlier on ties), only those that fit `ram_room` once paged in, or whose
    output-channel blocks do (`sliceable`: name -> bytes of one output channel's row)."""
    over = sum(frozen.values()) - flash_room
    if over <= 0 or flash_room < 0:  # no flash left at all: the code and trainable weights overflow it (device_fit says so)
        return []
    order = {p: k for k, p in enumerate(frozen)}
    rows = sliceable or {}
    chosen: list[str] = []
    for p in sorted((p for p, b in frozen.items() if b <= ram_room or 0 < rows.get(p, ram_room + 1) <= ram_room // 2),
                    key=lambda p: (-frozen[p], order[p])):
        if over <= 0:
            break
        chosen.append(p)
        over -= frozen[p]
    need = sum(frozen[p] for p in chosen)
    if over > 0 and ram_room <= 0:
        raise DeviceFitError(
            f"the frozen weights ({sum(frozen.values())} B) do not fit the {flash_room} B of flash left for them on "
            f"{device}, and none can be streamed from storage: a weight is paged into RAM, and the fixed state alone "
            f"(the trainable weights, their optimizer state, the firmware's stack, runtime and batch buffers of input, "
            f"labels and logits) exceeds the RAM by {-ram_room} B. Train fewer parameters (--train), or use a smaller model. No firmware was written.")
    if over > 0:
        largest = max(frozen, key=frozen.__getitem__)
        raise DeviceFitError(
            f"the frozen weights ({sum(frozen.values())} B) do not fit the {flash_room} B of flash left for them on "
            f"{device}, and streaming from storage cannot make up the difference: a weight is paged into RAM whole, "
            f"and only {ram_room} B of RAM are left for it (the largest frozen weight, `{largest}`, has "
            f"{frozen[largest]} B). Use a smaller model or narrower layers. No firmware was written.")
    if need > storage_bytes:
        raise DeviceFitError(
            f"{need} B of frozen weights must be streamed from storage ({', '.join(chosen[:4])}"
            f"{' ...' if len(chosen) > 4 else ''}) because the rest fills the {flash_room} B of flash left for "
            f"them, but {device} has {'no storage' if storage_bytes == 0 else f'only {storage_bytes} B of storage'}"
            " (storage_bytes of its profile). Give the device an SD card (a profile with storage_bytes), or use a "
            "smaller model. No firmware was written.")
    return chosen


def sliceable_weights(g: TrainingGraph) -> dict[str, int]:
    """Frozen weights that can be paged in per block of output channels: those read only as the weight of
    forward convolutions without groups (whole, or a block of its rows each: a CNN head computed by channel
    blocks, frontend/channel_blocks.py) and of their backwards for the input's gradient alone (a block's share
    of it); name -> bytes of one output channel."""
    trained = set(g.trainable_params)
    ok: dict[str, bool] = {}
    for n in g.nodes:
        for p in n.params:
            a = n.attrs.get("args", [])
            if n.kind == "forward" and n.op == CONV and len(a) == 9:
                w, groups = a[1], a[8]
            elif n.kind == "backward" and n.op == CONV_BACK and len(a) == 11 and list(a[10]) == [True, False, False] \
                    and n.attrs.get("keep") == 0:
                w, groups = a[2], a[9]
            else:
                w = groups = None
            conv = isinstance(w, dict) and w.get("$p") == p and read_rows(w, g.params[p].shape[0]) is not None \
                and groups == 1 and len(g.params[p].shape) == 4 and set(n.attrs) - {"keep"} == {"args"}
            ok[p] = ok.get(p, True) and conv and p not in trained
    return {p: g.params[p].bytes // g.params[p].shape[0] for p, good in ok.items() if good}


def _reader_rows(g: TrainingGraph, p: str) -> list[tuple[int, int]]:
    """The row blocks of `p` its readers read (a weight read whole: one block)."""
    return [weight_rows(n, g.params[p].shape[0]) for n in g.nodes if p in n.params]


def block_rows(row_bytes: int, rows: int, ram_room: int, bounds: tuple[int, ...] = ()) -> int:
    """Output channels per block of a weight paged in by blocks: as many as half the RAM left holds (the other
    half for the convolution's input and output), a divisor of every reader's block boundary (`bounds`) so that
    each reader pages in its own rows only."""
    most = max(1, min(rows, (ram_room // 2) // row_bytes))
    step = 0
    for b in bounds:
        step = gcd(step, b)
    if not step or step >= rows:
        return most
    return max(d for d in range(1, min(most, step) + 1) if step % d == 0)


def stream_weights(g: TrainingGraph, streamed: list[str], ram_room: int | None = None) -> TrainingGraph:
    """`g` with every reader of a streamed weight paging it in: the weight in its `streamed` and workspace;
    one larger than `ram_room` paged in by blocks of output channels (attrs["stream_rows"]: channels a block)."""
    keep = set(streamed)
    if not keep:
        return g
    rows_of = sliceable_weights(g)
    # Read by blocks of rows: paged in by blocks too, where a RAM room says pages come by blocks (the firmware's)
    sliced = {p for p in keep if p in rows_of and len(set(_reader_rows(g, p))) > 1}
    blocked = {p: block_rows(rows_of[p], g.params[p].shape[0], ram_room, tuple(b for r in _reader_rows(g, p) for b in r))
               for p in keep if ram_room is not None and p in rows_of and (p in sliced or g.params[p].bytes > ram_room)}
    nodes = []
    for n in g.nodes:
        mine = tuple(dict.fromkeys(p for p in n.params if p in keep))
        if not mine:
            nodes.append(n)
            continue
        rows = {p: blocked[p] for p in mine if p in blocked}
        attrs = {**n.attrs, "stream_rows": rows} if rows else n.attrs
        nodes.append(replace(n, streamed=mine, attrs=attrs,
                             workspace_bytes=n.workspace_bytes + streamed_workspace(g, mine, rows)))
    return replace(g, nodes=nodes)


def streamed_workspace(g: TrainingGraph, streamed, rows: dict[str, int]) -> int:
    """The RAM a node's streamed weights take while it runs: each whole, or one block of `rows[p]` channels."""
    return sum(g.params[p].bytes // g.params[p].shape[0] * rows[p] if p in rows else g.params[p].bytes
               for p in streamed)


def restreamed(g: TrainingGraph, streamed: list[str], target, measured_s: dict[str, float] | None = None) -> TrainingGraph:
    """`g` with exactly `streamed` paged in by their readers (none: every weight in flash), costed on `target`
    (node seconds `measured_s` where the graph was profiled)."""
    return costed(stream_weights(unstream(g), streamed), target, measured_s)


def unstream(g: TrainingGraph) -> TrainingGraph:
    """`g` with every weight back in flash: no node streams, workspaces without the streamed weights."""
    nodes = [replace(n, streamed=(), attrs={k: v for k, v in n.attrs.items() if k != "stream_rows"},
                     workspace_bytes=n.workspace_bytes - streamed_workspace(g, n.streamed, n.attrs.get("stream_rows", {})))
             if n.streamed else n for n in g.nodes]
    return replace(g, nodes=nodes)


def stream_until(g: TrainingGraph, fits, storage_bytes: int) -> list[str]:
    """The shortest run of `g`'s frozen weights (all in memory), largest first (the earlier on ties), whose
    streaming makes `fits(graph)` hold; all that storage holds when none does (the budget check then refuses with
    the figures). A weight is paged in whole by each reader; none past `storage_bytes`."""
    trained = set(g.trainable_params)
    order = {p: k for k, p in enumerate(g.params)}
    read = {p for n in g.nodes for p in n.params}
    frozen = sorted((p for p in g.params if p not in trained and p in read and g.params[p].bytes),
                    key=lambda p: (-g.params[p].bytes, order[p]))
    if not frozen or fits(g):
        return []
    prefix, held = [], 0
    for p in frozen:
        if held + g.params[p].bytes > storage_bytes:
            break
        prefix.append(p)
        held += g.params[p].bytes
    # Streaming a weight frees its bytes at every stage but its readers', where it is their workspace: no stage
    # needs more, so fits() is monotone in the prefix and a bisection finds the shortest.
    lo, hi = 1, len(prefix)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(stream_weights(g, prefix[:mid])):
            hi = mid
        else:
            lo = mid + 1
    return prefix[:lo]
