"""The training DAG: dataclasses shared by the frontend, the passes and the validator.

A graph is a list of nodes in execution (topological) order. Stage t of a schedule computes node t.
Every node produces at most one tensor, named after the node. Views (reshape, narrow) are not nodes:
a consumer reads a base tensor through a `TensorRef` with a view chain, so they cost no memory and are
never recomputed.
"""
from __future__ import annotations

from dataclasses import dataclass, field, asdict
from typing import Literal

import networkx as nx

from edgetrain.runtime.python.optimizers import OPTIMIZERS, state_names, step_counter_bytes

DTYPE_BYTES = {"float32": 4, "int64": 8, "int32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int16": 2,
               "int8": 1, "uint8": 1, "bool": 1}
LOSSES = ("cross_entropy", "mse", "model")  # what TrainingGraph.loss may be (or a user's path/file.py:fn)
# The training graph's JSON layout; a graph.json or schedule of another format is refused, not misread.
GRAPH_FORMAT = 2

# input: the data batch; labels: the targets (pinned for the whole step); forward/loss: recomputable;
# backward: the ops after the loss (gradients, with the optimizer steps they complete).
Kind = Literal["input", "labels", "forward", "loss", "backward"]
# An input node's attr: the batch is read from storage patch by patch by its readers, never whole in RAM
# (graph/input_storage.py): it holds 0 B.
IN_STORAGE = "in_storage"


@dataclass(frozen=True)
class TensorRef:
    """An operand: the tensor of node `name`, seen through a chain of views.

    A view is an aten view op and its literal arguments, ("aten.t.default", ()), or ("item", k): element k of
    a node that holds a tuple.
    """

    name: str
    view: tuple = ()

    def to_json(self) -> dict:
        d: dict = {"t": self.name}
        if self.view:
            d["view"] = [list(v[:1]) + [list(x) if isinstance(x, tuple) else x for x in v[1:]] for v in self.view]
        return d

    @staticmethod
    def from_json(d: dict) -> "TensorRef":
        return TensorRef(d["t"], tuple(_tuples(v) for v in d.get("view", [])))


def _tuples(x):
    """JSON lists back to (hashable) tuples, all the way down."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


@dataclass
class Node:
    name: str
    kind: Kind
    op: str  # runtime kernel name
    inputs: tuple[TensorRef, ...] = ()
    params: tuple[str, ...] = ()  # parameters read; a backward node also updates them (fused SGD)
    buffers: tuple[str, ...] = ()  # e.g. batch-norm running statistics, updated on first compute only
    attrs: dict = field(default_factory=dict)
    shape: tuple[int, ...] | None = None  # None: the node produces no tensor
    dtype: str = "float32"
    aux_bytes: int = 0  # small side output kept until the backward node (batch-norm statistics)
    aux_of: str | None = None  # a backward node that reads the aux of this forward node
    workspace_bytes: int = 0  # transient bytes held while the kernel runs (param grads, scratch)
    # Parameter-sized temporaries its optimizer updates allocate while they run, beside the workspace
    # (runtime/python/update_memory.py); apart from it, so the workspace still says what a dropped output takes
    update_temporary_bytes: int = 0
    flops: int = 0
    time_s: float = 0.0
    energy_j: float = 0.0
    source: str = ""  # where the user's code created it (file:line, module path)
    # A node that holds several outputs of its op (a backward op's input gradients): their specs, in the
    # order readers see them through ("item", k) views; `shape` is then None.
    items: tuple["TensorSpec", ...] | None = None
    updates: tuple[str, ...] = ()  # parameters whose optimizer step runs right after this node
    # Frozen parameters this node reads from storage: paged into its workspace before each (re)computation.
    streamed: tuple[str, ...] = ()
    # A recompute that does less than the first computation (a batch norm normalising from the statistics it
    # kept: graph/norm_recompute.py): its FLOPs, and the time and energy the target gives them; None: as the node
    recompute_flops: int | None = None
    recompute_time_s: float | None = None
    recompute_energy_j: float | None = None

    @property
    def bytes(self) -> int:
        if self.items is not None:
            return sum(s.bytes for s in self.items)
        if self.shape is None or self.attrs.get(IN_STORAGE):
            return 0
        n = 1
        for s in self.shape:
            n *= s
        return n * DTYPE_BYTES[self.dtype]

    @property
    def transient_bytes(self) -> int:
        """Everything the node holds only while it runs, beside its output: what every memory model counts."""
        return self.workspace_bytes + self.update_temporary_bytes

    @property
    def into(self) -> str | None:
        """The operand whose bytes this node's output takes (it dies here: graph/inplace.py), or None."""
        k = self.attrs.get("into")
        return None if k is None else self.inputs[k].name

    @property
    def recomputable(self) -> bool:
        return self.kind in ("forward", "loss")

    @property
    def rec_time_s(self) -> float:
        """Seconds of one recompute of the node (every computation after its first)."""
        return self.time_s if self.recompute_time_s is None else self.recompute_time_s

    @property
    def rec_energy_j(self) -> float:
        """Joules of one recompute of the node."""
        return self.energy_j if self.recompute_energy_j is None else self.recompute_energy_j

    def to_json(self) -> dict:
        d = asdict(self)
        d["inputs"] = [r.to_json() for r in self.inputs]
        d["shape"] = list(self.shape) if self.shape is not None else None
        d["params"] = list(self.params)
        d["buffers"] = list(self.buffers)
        d["items"] = [{"shape": list(s.shape), "dtype": s.dtype} for s in self.items] if self.items is not None else None
        d["updates"] = list(self.updates)
        if self.streamed:
            d["streamed"] = list(self.streamed)
        else:  # graphs without streamed weights serialise as they always have
            del d["streamed"]
        if not self.update_temporary_bytes:  # so do nodes whose updates allocate nothing
            del d["update_temporary_bytes"]
        for k in ("recompute_flops", "recompute_time_s", "recompute_energy_j"):
            if d[k] is None:  # and nodes recomputed as they were first computed
                del d[k]
        return d

    @staticmethod
    def from_json(d: dict) -> "Node":
        d = dict(d)
        d["inputs"] = tuple(TensorRef.from_json(r) for r in d["inputs"])
        d["shape"] = tuple(d["shape"]) if d["shape"] is not None else None
        d["params"] = tuple(d["params"])
        d["buffers"] = tuple(d["buffers"])
        if d.get("items") is not None:
            d["items"] = tuple(TensorSpec(tuple(s["shape"]), s["dtype"]) for s in d["items"])
        d["updates"] = tuple(d.get("updates", ()))
        d["streamed"] = tuple(d.get("streamed", ()))
        d.pop("forward_of", None)  # a recorded graph of the earlier format names it; nothing reads it now
        return Node(**d)


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def bytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * DTYPE_BYTES[self.dtype]


_SGD, _ADAM = OPTIMIZERS["sgd"].defaults, OPTIMIZERS["adam"].defaults
# What a setting that the optimizer does not take is stored as (a schedule names every field).
_NOT_TAKEN = {"momentum": 0.0, "nesterov": False}


@dataclass(frozen=True)
class OptimizerConfig:
    """The user's optimizer: a unit of `runtime/python/optimizers` by name and its settings. Build one with
    `OptimizerConfig.of(name, **given)`: the unit's defaults for what is not given. The fields' own defaults are
    SGD's (and Adam's betas and eps)."""

    name: str = "sgd"
    lr: float = _SGD["lr"]
    momentum: float = _SGD["momentum"]
    weight_decay: float = _SGD["weight_decay"]
    nesterov: bool = _SGD["nesterov"]
    betas: tuple[float, float] = _ADAM["betas"]
    eps: float = _ADAM["eps"]

    @staticmethod
    def of(name: str, **given) -> "OptimizerConfig":
        """`name`'s settings: `given`, else its unit's defaults; settings it does not take switched off."""
        unit = OPTIMIZERS[name]
        foreign = sorted(set(given) - set(unit.defaults))
        if foreign:
            raise ValueError(f"{name} takes no {', '.join(foreign)} (its settings: {', '.join(unit.defaults)})")
        off = {k: v for k, v in _NOT_TAKEN.items() if k not in unit.defaults}
        return OptimizerConfig(name=name, **{**off, **unit.defaults, **given})

    def to_json(self) -> dict:
        return {**asdict(self), "betas": list(self.betas)}

    @staticmethod
    def from_json(d: dict) -> "OptimizerConfig":
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return OptimizerConfig(**d)


@dataclass
class TrainingGraph:
    model: str
    nodes: list[Node]
    params: dict[str, TensorSpec]
    buffers: dict[str, TensorSpec]
    input_shape: tuple[int, ...]  # with the batch dimension
    num_classes: int | None  # class ids run 0..num_classes-1 (from the model's output); None: labels are values
    loss: str  # "cross_entropy" | "mse"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    input_dtype: str = "float32"  # "int64": token ids in [0, input_high), which no gradient reaches
    input_high: int | None = None
    trainable: tuple[str, ...] | None = None  # parameters the optimizer updates; None: every parameter
    frozen_in_flash: bool = False  # frozen parameters live in read-only memory (C firmware), not in the budget
    exported: bool = False  # traced as torch.export traces (a library's helper needed it): the reference runs so too
    # "channels_last": the plan holds its convolution weights so (`--fuse`; runtime/python/memory_format.py)
    memory_format: str = "contiguous"

    def __post_init__(self) -> None:
        self._index = {n.name: i for i, n in enumerate(self.nodes)}

    # -- lookups -------------------------------------------------------------------------------
    def index(self, name: str) -> int:
        return self._index[name]

    def node(self, name: str) -> Node:
        return self.nodes[self._index[name]]

    @property
    def loss_stage(self) -> int:
        return next(i for i, n in enumerate(self.nodes) if n.kind == "loss")

    @property
    def batch_size(self) -> int:
        return self.input_shape[0]

    @property
    def param_bytes(self) -> int:
        """Parameter bytes the budget holds: all of them, or the trainable ones where frozen ones stay in flash;
        never a streamed one (its readers' workspace while they run)."""
        trained, streamed = set(self.trainable_params), set(self.streamed_params)
        return sum(s.bytes for p, s in self.params.items()
                   if p in trained or not (self.frozen_in_flash or p in streamed))

    @property
    def streamed_params(self) -> tuple[str, ...]:
        """Frozen parameters kept in storage instead of flash (paged in by the nodes that read them)."""
        read = {p for n in self.nodes for p in n.streamed}
        return tuple(p for p in self.params if p in read)

    @property
    def trainable_params(self) -> tuple[str, ...]:
        return tuple(self.params) if self.trainable is None else self.trainable

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer state: per trainable parameter, its state tensors and (Adam, Adagrad) a 4-byte step count, as the
        runtime's optimizer allocates them."""
        config = self.optimizer.to_json()
        per, counter = len(state_names(config)), step_counter_bytes(config)
        return sum(per * self.params[p].bytes + counter for p in self.trainable_params)

    @property
    def buffer_bytes(self) -> int:
        return sum(s.bytes for s in self.buffers.values())

    @property
    def state_bytes(self) -> int:
        """Memory held for the whole step: parameters, optimizer state, buffers."""
        return self.param_bytes + self.optimizer_bytes + self.buffer_bytes

    @property
    def total_flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    def consumers(self) -> dict[str, list[int]]:
        """Tensor name -> stages that read it directly (as an input operand)."""
        out: dict[str, list[int]] = {n.name: [] for n in self.nodes}
        for t, n in enumerate(self.nodes):
            for r in n.inputs:
                out[r.name].append(t)
        return out

    def to_nx(self) -> nx.DiGraph:
        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.name, kind=n.kind, op=n.op, bytes=n.bytes, flops=n.flops)
        for n in self.nodes:
            for r in n.inputs:
                g.add_edge(r.name, n.name)
            if n.aux_of:
                g.add_edge(n.aux_of, n.name)
        return g

    def summary(self) -> dict:
        kinds: dict[str, int] = {}
        for n in self.nodes:
            kinds[n.kind] = kinds.get(n.kind, 0) + 1
        return {
            "model": self.model,
            "nodes": len(self.nodes),
            "edges": sum(len(n.inputs) for n in self.nodes),
            "kinds": kinds,
            "param_bytes": self.param_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "buffer_bytes": self.buffer_bytes,
            "total_flops": self.total_flops,
        }

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "loss": self.loss,
            "format": GRAPH_FORMAT,
            "optimizer": self.optimizer.to_json(),
            **({"trainable": list(self.trainable)} if self.trainable is not None else {}),
            **({"frozen_in_flash": True} if self.frozen_in_flash else {}),
            **({"exported": True} if self.exported else {}),
            **({"memory_format": self.memory_format} if self.memory_format != "contiguous" else {}),
            # Token-id inputs only, so image models' schedules (and their content hashes) stay as they were.
            **({"input_dtype": self.input_dtype, "input_high": self.input_high} if self.input_dtype != "float32" else {}),
            "params": {k: {"shape": list(v.shape), "dtype": v.dtype} for k, v in self.params.items()},
            "buffers": {k: {"shape": list(v.shape), "dtype": v.dtype} for k, v in self.buffers.items()},
            "nodes": [n.to_json() for n in self.nodes],
        }

    @staticmethod
    def from_json(d: dict, recorded: bool = False) -> "TrainingGraph":
        """`recorded`: a graph kept beside results made with it (a sweep's graph.json), read to draw them:
        any format with these fields will do, since nothing is solved or run on it."""
        if d.get("format") != GRAPH_FORMAT and not recorded:
            raise ValueError(f"training graph of format {d.get('format', 1)}, this edgetrain reads format "
                             f"{GRAPH_FORMAT}: build it again (rerun the sweep or compile)")
        return TrainingGraph(
            model=d["model"],
            nodes=[Node.from_json(n) for n in d["nodes"]],
            params={k: TensorSpec(tuple(v["shape"]), v["dtype"]) for k, v in d["params"].items()},
            buffers={k: TensorSpec(tuple(v["shape"]), v["dtype"]) for k, v in d["buffers"].items()},
            input_shape=tuple(d["input_shape"]),
            num_classes=d["num_classes"],
            loss=d["loss"],
            optimizer=OptimizerConfig.from_json(d["optimizer"]),
            trainable=tuple(d["trainable"]) if "trainable" in d else None,
            frozen_in_flash=bool(d.get("frozen_in_flash", False)),
            exported=bool(d.get("exported", False)),
            memory_format=d.get("memory_format", "contiguous"),
            input_dtype=d.get("input_dtype", "float32"),
            input_high=d.get("input_high"),
        )
