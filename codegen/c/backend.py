"""The C backend: training firmware for runtime/c (`--emit c`), the room that owns it end to end.

Its op coverage is the table in `ops.py` and the graph pass in `lower.py`; its device limits are
`device_fit.py` (RAM and flash of a microcontroller, the board's stack: targets/boards/); its rendering is
`firmware.py` (with `emitters.py` and `arena.py`); its way to run, on the host or under QEMU, is `runner.py`.
"""
from __future__ import annotations

from edgetrain.codegen.backend import DeviceRoom, Rendered, WeightRoom
from edgetrain.codegen.python_plan import write_weights
from edgetrain.compiler.graph.input_storage import tiles_can_read_input
from edgetrain.compiler.graph.ir import TrainingGraph

from .device_fit import (applies, batch_buffer_bytes, board_limit, check_fit, check_model_fits, device_budget,
                         figures_of_firmware, flash_room_for_frozen, int8_code_bytes, q8_table_bytes,
                         runtime_reserve_bytes, board_stack_bytes)
from .firmware import render_c_firmware
from .lower import lower_for_c
from .ops import IN_PLACE_ARGS

CODE_STEPS_PER_NODE = 3  # code estimated at 3 steps a node (computed, freed, sometimes recomputed); the image is checked


class CBackend:
    name = "c"
    widen_fusion = False  # microcontroller graphs are small: every byte counts
    generates_kernels = False  # each op is a hand-written C kernel
    overlaps_paging = False  # the C runtime pages synchronously: overlap would only hold RAM
    in_place = IN_PLACE_ARGS  # kernels whose loops read each element before writing it (ops.py)
    streams_from_storage = False  # frozen weights beyond flash stream by the device's own rule (weight_room)
    clamp_grad_from_output = False  # its int8 ReLU6 kernels read quantised values: kept as captured
    runs_int8_prefix = True  # an int8 frozen prefix (--quantize-frozen int8) is lowered to its q8 kernels
    runs_int8_biases = True  # int8 bias training's backward node (--int8-biases): qas_emit.py
    reads_input_from_storage = True  # the driver hands the plan a reader of the data file (runtime/c/input.h)

    def check_model(self, model, target, optimizer, name: str) -> None:
        check_model_fits(model, target, optimizer, name)  # a model whose weights alone overflow fails before tracing

    def lower(self, graph: TrainingGraph) -> TrainingGraph:
        return lower_for_c(graph)

    def weight_room(self, graph: TrainingGraph, target) -> WeightRoom | None:
        if not applies(target) or target.flash_bytes is None or len(graph.trainable_params) == len(graph.params):
            return None
        trained = set(graph.trainable_params)
        tb = sum(s.bytes for p, s in graph.params.items() if p in trained)
        ram = device_budget(target, batch_buffer_bytes(graph)) - graph.state_bytes
        if ram <= 0 and tiles_can_read_input(graph):  # no plan holds the batch whole: the tiles will read it
            ram = device_budget(target, batch_buffer_bytes(graph, input_from_storage=True)) - graph.state_bytes
        return WeightRoom(frozen={p: s.bytes for p, s in graph.params.items() if p not in trained},
                          flash_bytes=flash_room_for_frozen(target, tb, CODE_STEPS_PER_NODE * len(graph.nodes),
                                                            graph.buffer_bytes, int8_code_bytes(n.attrs for n in graph.nodes))
                          - q8_table_bytes(n.attrs for n in graph.nodes),
                          ram_bytes=ram)

    def device_room(self, graph: TrainingGraph, target) -> DeviceRoom | None:
        io = batch_buffer_bytes(graph)
        room = device_budget(target, io)  # the RAM the firmware links to
        return None if room is None else DeviceRoom(
            room, runtime_reserve_bytes(io, board_stack_bytes(target)), "the stack, the runtime and the batch buffers",
            board_limit(target))

    def render(self, schedule: dict, model, out_dir: str, target) -> Rendered:
        # Weights first: the C initializers are read from them.
        write_weights(dict(model.named_parameters()), dict(model.named_buffers()), out_dir)
        firmware = render_c_firmware(schedule, out_dir)  # ArenaOverflowError: the pipeline solves for less
        summary = {"arena_bytes": firmware["arena_bytes"], "paged_bytes_per_step": firmware["paged_bytes_per_step"],
                   "pages": len(firmware["pages"]), "streamed": list(dict.fromkeys(w["param"] for w in firmware["streamed"])),
                   "streamed_bytes": firmware["streamed_bytes"]}
        if firmware["input_in_storage"]:  # the batch read from storage patch by patch, never whole in RAM
            summary["input_read_bytes_per_step"] = firmware["input_read_bytes_per_step"]
        fit = check_fit(figures_of_firmware(schedule, firmware), target).to_json() if applies(target) else None
        return Rendered(summary, fit)  # arena, weights and buffers held against the device's RAM and flash
