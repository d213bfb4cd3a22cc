"""The Python backend: a plan for the Python runtime (runtime/python, torch's own kernels), `--emit python`.

It runs every aten op of the joint graph as traced, so it refuses nothing and lowers only an int8 frozen prefix's
nodes to its q8 ops' calls (python_q8.py); its plan is `python_plan.py`'s, run by `edgetrain run` in-process.
"""
from __future__ import annotations

from edgetrain.codegen.backend import DeviceRoom, Rendered, WeightRoom
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.runtime.python.inplace import IN_PLACE_ARGS

from .c.backend import CBackend
from edgetrain.compiler.frontend.meta_weights import check_meta_weights

from .python_plan import render_python_plan, write_weights
from .python_q8 import integer_params, lower_q8, write_prefix_floats


class PythonBackend:
    name = "python"
    widen_fusion = True
    generates_kernels = True  # torch's inductor compiles a fused chain at its first call (fused_kernels.py)
    overlaps_paging = True  # the page store's threads read ahead and write behind (scheduling/overlap.py)
    streams_from_storage = True  # frozen weights read from weights.safetensors by each op that reads them
    clamp_grad_from_output = True  # torch's kernels run the graph's ops
    runs_int8_prefix = True  # q8_ops.py: the integer reference's arithmetic on the CPU (python_q8.py)
    runs_int8_biases = False  # no kernel for int8 bias training's backward node (C firmware has: qas_emit.py)
    reads_input_from_storage = False  # the batch is a tensor the caller hands the plan
    in_place = IN_PLACE_ARGS  # torch's out= overloads and in-place twins (runtime/python/inplace.py)

    def check_model(self, model, target, optimizer, name: str) -> None:
        return None

    def lower(self, graph: TrainingGraph) -> TrainingGraph:
        return lower_q8(graph)

    def weight_room(self, graph: TrainingGraph, target) -> WeightRoom | None:
        return None  # weights stay in memory

    def device_room(self, graph: TrainingGraph, target) -> DeviceRoom | None:
        # A microcontroller's `--budget auto` is its RAM less what its firmware needs, whichever runtime
        # the plan is for (README: --budget).
        room = CBackend().device_room(graph, target)
        if room is None or room.linked_by is None:
            return room
        # A Python plan links to no board: the profile's RAM.
        return DeviceRoom(target.ram_bytes - room.reserved_bytes, room.reserved_bytes, room.reserved_for)

    def render(self, schedule: dict, model, out_dir: str, target) -> Rendered:
        render_python_plan(schedule, out_dir)
        params = dict(model.named_parameters())
        source = check_meta_weights(model)

        def value(p: str):  # a meta weight's from its source, read only where an int8 prefix needs it
            return source.get(p) if params[p].is_meta else params[p]
        integers = integer_params(schedule, value)
        if integers:  # an int8 prefix: its parameters as the runtime holds them, their float values beside
            write_prefix_floats({p: value(p) for p in integers}, out_dir)
        write_weights({**params, **integers}, dict(model.named_buffers()), out_dir, source)
        streamed = list(dict.fromkeys(p for n in schedule["graph"]["nodes"] for p in n.get("streamed", ())))
        if not streamed:
            return Rendered()
        return Rendered(summary={"streamed": streamed, "streamed_bytes": sum(({**params, **integers})[p].nbytes for p in streamed),
                                 "paged_bytes_per_step": schedule["predicted"]["paged_bytes"]})
