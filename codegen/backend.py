"""What the compile pipeline asks of a backend: the runtime a plan is generated for, one room each.

A backend owns its op coverage (the graph pass that fits a training graph to its runtime), its device
limits (what a microcontroller's RAM leaves for training, where frozen weights may stay), its rendering
and its way to run. The pipeline (compiler/passes.py) holds one `Backend` and never asks which it is; the
table of backends by `--emit` name is `backends.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Protocol

from edgetrain.compiler.graph.ir import OptimizerConfig, TrainingGraph  # the graph a backend lowers


@dataclass(frozen=True)
class WeightRoom:
    """Where a device keeps frozen weights: `frozen` (name -> bytes), the read-only memory left for them
    (`flash_bytes`) and the RAM left for one paged in from storage while it is read (`ram_bytes`)."""

    frozen: dict[str, int]
    flash_bytes: int
    ram_bytes: int


@dataclass(frozen=True)
class DeviceRoom:
    """`--budget auto`: the RAM a device leaves for the training state and the activations (`bytes`), after
    `reserved_bytes` for what the runtime itself needs (`reserved_for`, in words). `linked_by`: why the device
    has less RAM for the plan than its profile says (a board's link script), in words; None where it has all."""

    bytes: int
    reserved_bytes: int
    reserved_for: str
    linked_by: str | None = None


@dataclass(frozen=True)
class Rendered:
    """What rendering wrote, for compile's summary: figures of the generated code (`summary`) and its fit
    on the device (`device_fit`: None where no device limit applies)."""

    summary: dict = field(default_factory=dict)
    device_fit: dict | None = None


class Backend(Protocol):
    """One runtime a plan is generated for. `render` may raise compiler.errors.ArenaOverflowError: the
    pipeline then solves again for that many bytes less."""

    name: str  # `--emit NAME`; the schedule's "backend"
    widen_fusion: bool  # fuse wide elementwise chains (a microcontroller's small graph keeps every byte instead)
    generates_kernels: bool  # runs fused pointwise chains as generated kernels (`compile --fuse`)
    overlaps_paging: bool  # pages ahead and behind in the background (a runtime that pages synchronously: False)
    # op -> the arguments (by position) its kernel may write its output into (compiler/graph/inplace.py)
    in_place: Mapping[str, tuple[int, ...]]
    streams_from_storage: bool  # reads frozen weights from its weights file per op when the budget asks it
    # its ReLU6 backward is torch's hardtanh_backward, exact on the ReLU6's output (graph/clamp_backward.py)
    clamp_grad_from_output: bool
    runs_int8_prefix: bool  # lowers an int8 frozen prefix (`compile --quantize-frozen int8`) to its kernels
    runs_int8_biases: bool  # runs int8 bias training's integer backward node (`compile --int8-biases`)
    # reads the input batch where it lies, patch by patch, when only patch-by-patch nodes read it
    # (compiler/graph/input_storage.py): the batch is never whole in RAM
    reads_input_from_storage: bool

    def check_model(self, model, target, optimizer: OptimizerConfig, name: str) -> None:
        """Refuse, before any tracing, a model the device cannot hold (its weights alone)."""

    def lower(self, graph: TrainingGraph) -> TrainingGraph:
        """The training graph as this runtime holds it, or one error naming every op it cannot run."""

    def weight_room(self, graph: TrainingGraph, target) -> WeightRoom | None:
        """Where `graph`'s frozen weights may stay on `target`; None where they all stay in memory."""

    def device_room(self, graph: TrainingGraph, target) -> DeviceRoom | None:
        """What `--budget auto` means on `target`; None where it has no such figure."""

    def render(self, schedule: dict, model, out_dir: str, target) -> Rendered:
        """Write the plan for `schedule` (as schedule.json will hold it) and the model's weights into `out_dir`."""
