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

from edgetrain.compiler.errors import UnsupportedModelError


@dataclass(frozen=True)
class Backend:
    name: str
    index_dtype: str  # max-pool argmax and class labels
    param_grad_workspace: bool  # a backward node holds its parameters' gradients until SGD applies them
    maxpool_value_scratch: bool  # the argmax kernel also writes the pooled values (dropped at once)
    ops: frozenset[str] | None = None  # registry ops with a kernel; None: every op of the registry
    supported_text: str = ""  # the supported ops in words, for error messages

    def check_node(self, node) -> None:
        """Fail, naming the op, the node and the user's source line, when this runtime has no kernel."""
        if self.ops is None:
            return
        why = ""
        if node.op not in self.ops:
            why = "has no kernel in this runtime"
        elif node.op == "adaptive_avg_pool2d" and list(node.attrs.get("output_size", [])) != [1, 1]:
            why = f"with output size {node.attrs.get('output_size')} has no kernel (only a 1x1 output)"
        elif node.op == "avg_pool2d" and node.attrs.get("divisor_override") is not None:
            why = "with divisor_override has no kernel"
        elif node.op == "cat" and node.attrs.get("dim") != 1:
            why = f"along dim {node.attrs.get('dim')} has no kernel (channels, dim 1, only)"
        if why:
            raise UnsupportedModelError(
                f"--emit {self.name}: op `{node.op}` at node `{node.name}` ({node.source or 'unknown source'}) "
                f"{why}. The {self.name.upper()} runtime supports: {self.supported_text}. "
                "Remove or replace the op, or use --emit python."
            )


PYTHON = Backend(name="python", index_dtype="int64", param_grad_workspace=True, maxpool_value_scratch=True)

C = Backend(
    name="c",
    index_dtype="int32",
    param_grad_workspace=False,
    maxpool_value_scratch=False,
    ops=frozenset({"input", "labels", "conv2d", "linear", "relu", "relu6", "maxpool_argmax", "maxpool_gather",
                   "avg_pool2d", "adaptive_avg_pool2d", "add", "cat", "cross_entropy"}),
    supported_text=("conv2d (stride, padding, dilation, groups, bias), linear, relu, relu6, max-pool, avg-pool, "
                    "global average pool (adaptive_avg_pool2d to 1x1), residual add, concat (channels), "
                    "flatten/view, cross-entropy loss, SGD (momentum, weight decay); no batch-norm, dropout or "
                    "mse loss"),
)

BACKENDS = {b.name: b for b in (PYTHON, C)}


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UnsupportedModelError(f"unknown --emit {name!r}; choose one of {', '.join(BACKENDS)}") from None
