"""The frontend: trace a user's nn.Module with torch.fx and run it once on an example input for shapes.

The result is a `Traced` graph module with every node's value, and each node's place in the user's source
(file, line, code, module) for the messages of the stages after it.
"""
from __future__ import annotations

import copy
import linecache
import os
import re
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from edgetrain.compiler.errors import UnsupportedModelError

_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.join("frontend", "trace.py")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def _user_frame(frames: list[tuple[str, int, str]]) -> str:
    """The innermost frame that is the user's code, formatted as `file:line: code`."""
    for file, line, func in reversed(frames):
        if not file.startswith(_TORCH_DIR) and not file.endswith(_THIS_FILE):
            code = linecache.getline(file, line).strip()
            return f"{os.path.basename(file)}:{line} ({func}): `{code}`" if code else f"{file}:{line} ({func})"
    return "unknown location"


def node_source(node: fx.Node) -> str:
    frames = [(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(node.stack_trace or "")]
    where = _user_frame(frames)
    if node.op == "call_module":
        return f"{where} [module {node.target}]" if frames and where != "unknown location" else f"module {node.target}"
    stack = list((node.meta.get("nn_module_stack") or {}).keys())
    return f"{where} [inside {stack[-1]}]" if stack else where


class _Tracer(fx.Tracer):
    def __init__(self) -> None:
        super().__init__()
        self.record_stack_traces = True


class _Recorder(fx.Interpreter):
    """Runs the traced graph once on an example input and keeps every node's value (for shapes)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}
        self.current: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def _trace(model: nn.Module) -> fx.GraphModule:
    try:
        return fx.GraphModule(model, _Tracer().trace(model))
    except Exception as e:  # fx raises TraceError for control flow, others for odd Python
        frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(e.__traceback__)]
        where = _user_frame(frames)
        if "control flow" in str(e) or "iteration" in str(e):
            raise UnsupportedModelError(
                f"data-dependent control flow at {where}: {e}. edgetrain compiles one static training graph; "
                "move the branch out of forward() or make it depend on Python constants only."
            ) from None
        raise UnsupportedModelError(f"torch.fx cannot trace the model at {where}: {type(e).__name__}: {e}") from None




@dataclass
class Traced:
    """A traced model and the value of every node on the example input."""

    gm: fx.GraphModule
    values: dict[str, Any]


def trace_model(model: nn.Module, example: torch.Tensor) -> Traced:
    """Trace `model` and run the trace once on `example` (on a copy: the shape run must not touch the user's
    batch-norm statistics)."""
    gm = _trace(model)
    shadow = copy.deepcopy(gm).train()
    rec = _Recorder(shadow)
    try:
        with torch.no_grad():
            rec.run(example)
    except Exception as e:  # a wrong --input-shape, or a model that fails on its own
        where = f"fx node `{rec.current.name}`, {node_source(rec.current)}" if rec.current else "the start"
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise UnsupportedModelError(
            f"running the model once on an example input of shape {tuple(example.shape)} failed at {where}: "
            f"{type(e).__name__}: {first_line}. Check --input-shape against what the model expects."
        ) from None
    return Traced(gm, rec.values)
