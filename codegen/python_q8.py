"""An int8 frozen prefix in a Python plan (`compile --emit python --quantize-frozen int8`).

Lowering gives each int8 node (compiler/graph/quantize.py) the call its op takes in the runtime
(runtime/python/q8_ops.py): its operands, and a convolution's integer weight and bias as parameters; its
quantisation stays attrs["q8"], which the plan passes as the keyword `q8`. Rendering writes what the runtime holds:
each int8 convolution's weight as int8 and its bias as int32 in weights.safetensors (conv_integers, the one
definition, as the C backend's flash data), at the sizes the schedule counts. The float values they were made from go
beside them in PREFIX_FLOATS: the user's model as it was, which `run --check` trains autograd from and derives the
integers from again.
"""
from __future__ import annotations

import os
from dataclasses import replace

import torch
from safetensors.torch import save_file

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.quantize import (Q8_ADD, Q8_CONV, Q8_DEQUANTIZE, Q8_QUANTIZE, Q8_RELU, Q8_RELU6,
                                               conv_integers, q8_layers)

Q8_NODES = (Q8_QUANTIZE, Q8_CONV, Q8_RELU, Q8_RELU6, Q8_ADD, Q8_DEQUANTIZE)
PREFIX_FLOATS = "prefix_floats.safetensors"  # the int8 parameters' float values: the check's reference reads them


def lower_q8(graph: TrainingGraph) -> TrainingGraph:
    """`graph` with each int8 node's operands (and a convolution's parameters) as its op's arguments, and no kernel
    scratch."""
    nodes = []
    for n in graph.nodes:
        if n.op.startswith("edgetrain.q8_") and n.op not in Q8_NODES:
            raise UnsupportedModelError(f"node `{n.name}` ({n.op}): the Python runtime has no such int8 op (it runs "
                                        f"{', '.join(op.split('.')[1] for op in Q8_NODES)}); compile with --emit c")
        if n.op in Q8_NODES:
            args = [{"$t": k} for k in range(len(n.inputs))]
            if n.op == Q8_CONV:
                q = n.attrs["q8"]
                args += [{"$p": q["weight"]}, {"$p": q["bias"]} if q["bias"] else None]
            # no scratch: the float node's (a CPU convolution's re-laid-out weight) is not the q8 op's, and numpy's
            # temporaries are outside the ledger (docs/int8-kernels.md)
            n = replace(n, attrs={**n.attrs, "args": args}, workspace_bytes=0)
        nodes.append(n)
    return replace(graph, nodes=nodes)


def integer_params(schedule: dict, value) -> dict[str, torch.Tensor]:
    """The int8 weights and int32 biases of the schedule's int8 convolutions (a tiled prefix's too), by parameter
    name, from their float values (`value(name)`)."""
    out: dict[str, torch.Tensor] = {}
    for q in (q for n in schedule["graph"]["nodes"] for q in q8_layers(n["attrs"]) if "weight" in q):
        w = {p: value(p).detach().to("cpu", torch.float64) for p in (q["weight"], q["bias"]) if p}
        out.update({p: torch.from_numpy(v) for p, v in conv_integers(q, w).items()})
    return out


def write_prefix_floats(floats: dict[str, torch.Tensor], out_dir: str) -> str:
    """PREFIX_FLOATS (`param/<name>`, as weights.safetensors names them), written to a temporary name, then
    renamed."""
    path = os.path.join(out_dir, PREFIX_FLOATS)
    save_file({f"param/{k}": v.detach().to("cpu").contiguous() for k, v in floats.items()}, path + ".partial")
    os.replace(path + ".partial", path)
    return path
