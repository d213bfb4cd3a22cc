"""Frozen weights beyond flash, streamed from storage: which ones, and the graph that reads them from there.

A microcontroller keeps frozen weights const in flash. When they do not all fit, the largest go to storage
(the SD card) until the rest fits the flash left for them. A streamed weight is paged into the arena before
each node that reads it runs (its forward, a recompute of it, its input-gradient backward): it is that
node's workspace, and its page-in time and energy are in the node's (compiler/graph/costs.py), so the
schedulers count it like any other memory and paging. Pure functions: nothing here solves or reads files.
"""
from __future__ import annotations

from dataclasses import replace

from edgetrain.compiler.errors import DeviceFitError

from .costs import costed
from .ir import TrainingGraph


def choose_streamed(frozen: dict[str, int], flash_room: int, ram_room: int, storage_bytes: int,
                    device: str = "the device") -> list[str]:
    """The frozen weights (name -> bytes, in model order) to keep in storage so that the rest fits
    `flash_room`: largest first (the earlier on ties), only those that fit `ram_room` once paged in."""
    over = sum(frozen.values()) - flash_room
    if over <= 0 or flash_room < 0:  # no flash left at all: the code and trainable weights overflow it (device_fit says so)
        return []
    order = {p: k for k, p in enumerate(frozen)}
    chosen: list[str] = []
    for p in sorted((p for p, b in frozen.items() if b <= ram_room), key=lambda p: (-frozen[p], order[p])):
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


def stream_weights(g: TrainingGraph, streamed: list[str]) -> TrainingGraph:
    """`g` with every reader of a streamed weight paging it in: the weight in its `streamed` and workspace."""
    keep = set(streamed)
    if not keep:
        return g
    nodes = []
    for n in g.nodes:
        mine = tuple(dict.fromkeys(p for p in n.params if p in keep))
        nodes.append(replace(n, streamed=mine, workspace_bytes=n.workspace_bytes + sum(g.params[p].bytes for p in mine))
                     if mine else n)
    return replace(g, nodes=nodes)


def restreamed(g: TrainingGraph, streamed: list[str], target, measured_s: dict[str, float] | None = None) -> TrainingGraph:
    """`g` with exactly `streamed` paged in by their readers (none: every weight in flash), costed on `target`
    (node seconds `measured_s` where the graph was profiled)."""
    return costed(stream_weights(unstream(g), streamed), target, measured_s)


def unstream(g: TrainingGraph) -> TrainingGraph:
    """`g` with every weight back in flash: no node streams, workspaces without the streamed weights."""
    nodes = [replace(n, streamed=(), workspace_bytes=n.workspace_bytes - sum(g.params[p].bytes for p in n.streamed))
             if n.streamed else n for n in g.nodes]
    return replace(g, nodes=nodes)
