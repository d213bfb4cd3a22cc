"""What each code-generation backend's runtime holds in memory, in one place.

The training DAG counts bytes; how many depends on the runtime that executes the plan. The Python
runtime (torch) keeps max-pool indices as int64, materializes the pooled values next to them for a
moment, and computes each layer's parameter gradients into tensors before SGD applies them. The C
runtime (runtime/c) keeps indices as int32, finds the argmax without writing the values
(`et_maxpool2d_forward(..., y = NULL, idx)`), and fuses the weight gradient into the SGD update
(`et_*_wgrad_sgd`), so no gradient buffer ever exists. Lowering reads a `Backend` so the schedule,
the validator and the generated code count exactly what the runtime holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from edgetrain.compiler.errors import UnsupportedModelError


@dataclass(frozen=True)
class OpSupport:
    """One op a runtime has a kernel for, and the cases it leaves out (a check on the node, and why not)."""

    note: str = ""  # what it covers, in words
    refuse: Callable[[dict], str | None] = lambda attrs: None  # attrs -> why this case has no kernel, or None


@dataclass(frozen=True)
class Backend:
    name: str
    index_dtype: str  # max-pool argmax and class labels
    param_grad_workspace: bool  # a backward node holds its parameters' gradients until SGD applies them
    maxpool_value_scratch: bool  # the argmax kernel also writes the pooled values (dropped at once)
    ops: dict[str, OpSupport] | None = None  # registry ops with a kernel; None: every op of the registry
    also: str = ""  # what the runtime does besides its ops, in words

    @property
    def supported_text(self) -> str:
        """The supported ops in words, from the table (what an error offers instead)."""
        if self.ops is None:
            return "every op of the registry"
        ops = ", ".join(op + (f" ({s.note})" if s.note else "") for op, s in self.ops.items()
                        if op not in ("input", "labels"))
        return ops + (f"; {self.also}" if self.also else "")

    def check_node(self, node) -> None:
        """Fail, naming the op, the node and the user's source line, when this runtime has no kernel."""
        if self.ops is None:
            return
        support = self.ops.get(node.op)
        why = "has no kernel in this runtime" if support is None else support.refuse(node.attrs)
        if why:
            raise UnsupportedModelError(
                f"--emit {self.name}: op `{node.op}` at node `{node.name}` ({node.source or 'unknown source'}) "
                f"{why}. The {self.name.upper()} runtime supports: {self.supported_text}. "
                "Remove or replace the op, or use --emit python."
            )


def _adaptive_refuse(attrs: dict) -> str | None:
    size = list(attrs.get("output_size", []))
    return None if size == [1, 1] else f"with output size {size} has no kernel (only a 1x1 output)"


PYTHON = Backend(name="python", index_dtype="int64", param_grad_workspace=True, maxpool_value_scratch=True)

C = Backend(
    name="c",
    index_dtype="int32",
    param_grad_workspace=False,
    maxpool_value_scratch=False,
    ops={
        "input": OpSupport(), "labels": OpSupport(),
        "conv2d": OpSupport("stride, padding, dilation, groups, bias"),
        "linear": OpSupport(),
        "relu": OpSupport(), "relu6": OpSupport(),
        "maxpool_argmax": OpSupport("max-pool"), "maxpool_gather": OpSupport("max-pool"),
        "avg_pool2d": OpSupport("no divisor_override", lambda a: "with divisor_override has no kernel"
                                if a.get("divisor_override") is not None else None),
        "adaptive_avg_pool2d": OpSupport("to 1x1 only", _adaptive_refuse),
        "add": OpSupport("residual"),
        "cat": OpSupport("along channels, dim 1", lambda a: None if a.get("dim") == 1 else
                         f"along dim {a.get('dim')} has no kernel (channels, dim 1, only)"),
        "cross_entropy": OpSupport("the loss"),
    },
    also="views (flatten, reshape); SGD with momentum and weight decay",
)
BACKENDS = {b.name: b for b in (PYTHON, C)}


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UnsupportedModelError(f"unknown --emit {name!r}; choose one of {', '.join(BACKENDS)}") from None
