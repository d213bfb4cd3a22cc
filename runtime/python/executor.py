"""The executor: a generated plan calls one `Runtime` method per schedule step.

The runtime holds every tensor by name, counts it in the ledger, runs each step's aten op (torch's own
kernel, the one autograd runs), applies the optimizer right after a parameter's gradient is made, and pages
tensors to files. It checks the plan as it goes: an operand that is not resident, a
tensor computed twice, a page-in of something never paged out all raise `PlanError` naming the tensor and
the step. What a node's call reads from the plan's literals is read once and reused (`prepared.py`); how a
node's op runs (operands, kernel, held outputs, updates) is `op_runner.py`.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from os import PathLike
from types import MappingProxyType

import torch
from torch import Tensor

from .integrity import read_weights
from . import cuda_memory, fused_kernels, heap, memory_format as layouts, plan_api, prepared, q8_ops
from .ledger import Ledger
from .streamed_weights import StreamedWeights
from .optim import Optimizer
from .storage import FileStore, PendingRead
from .op_runner import OpRunner, Overwritten
from .plan_error import PlanError

INPUT, LABELS = "input", "labels"


def nbytes(t: Tensor) -> int:
    return t.nbytes  # numel x element size


def _name(ref) -> str:
    """A tensor's name, from its name or its handle (plan_api.Ref)."""
    return ref if ref.__class__ is str else ref.name


def _words(what) -> str:
    return what if isinstance(what, str) else what[0].format(*what[1:])


class Runtime(OpRunner):
    def __init__(self, weights_file: str | PathLike, storage_dir: str | PathLike, *, device=None,
                 optimizer: dict | None = None, trainable=None, lr: float | None = None,
                 momentum: float | None = None, weight_decay: float | None = None, seed: int = 0,
                 expected_tensors: dict | None = None, threads: int | None = None,
                 streamed: dict | None = None, memory_format: str | None = None) -> None:
        """`memory_format`: the plan's layout of its convolution weights (memory_format.py; None: contiguous).
        `streamed`: node name -> the frozen parameters it reads from the weights file each time it runs
        (streamed_weights.py), held only while it runs. `threads`: torch's intra-op thread count while a step trains on the CPU (the plan's: its kernel scratch
        was counted for it; `runtime_for` passes it), set back after the step; None leaves torch's own."""
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a whole number >= 1, got {threads!r}")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda":
            cuda_memory.bound_library_workspace()  # before a matrix product creates cuBLAS's workspace
            cuda_memory.exact_allocator_blocks()  # before the weights' blocks: each tensor costs its bytes
        heap.keep_freed_memory()  # freed activations reused by the next step, not page-faulted back in
        if optimizer is None:  # SGD given by its hyper-parameters
            optimizer = {"name": "sgd", "lr": lr, "momentum": momentum or 0.0, "weight_decay": weight_decay or 0.0}
        self.optimizer_config = dict(optimizer)
        self.lr = optimizer["lr"]
        self.momentum = optimizer.get("momentum", 0.0) if optimizer.get("name", "sgd") == "sgd" else 0.0
        self.weight_decay = optimizer.get("weight_decay", 0.0)
        self.seed = int(seed)
        self.ledger = Ledger()
        self.store = FileStore(storage_dir)
        self._params: dict[str, Tensor] = {}
        self._buffers: dict[str, Tensor] = {}
        self._momentum: dict[str, Tensor] = {}
        # Weights are bound to the schedule: names, shapes and dtypes as compiled, or a clear error.
        self._streams = {n: tuple(ps) for n, ps in (streamed or {}).items() if ps}
        names = list(dict.fromkeys(p for ps in self._streams.values() for p in ps))
        self.streamed = StreamedWeights(weights_file, names, self.device)
        self._params.update(self.streamed.tensors)  # empty until a reader runs; never in the ledger's state
        for key, t in read_weights(weights_file, expected_tensors, streamed=self.streamed.tensors).items():
            kind, _, name = key.partition("/")
            if kind not in ("param", "buffer") or not name:
                raise ValueError(f"{weights_file}: unexpected key '{key}' (want param/<name> or buffer/<name>)")
            t = t.to(self.device, copy=True)  # own the memory (load_file maps the file)
            (self._params if kind == "param" else self._buffers)[name] = t
            self.ledger.alloc(key, nbytes(t))
        self._resident_params = MappingProxyType({k: t for k, t in self._params.items() if k not in self.streamed.tensors})
        self.memory_format = layouts.check(memory_format)
        # before the optimizer's state copies their layout; a streamed weight is read as its file holds it
        layouts.lay_out(dict(self._resident_params), self.memory_format)
        self.trainable = tuple(self._params) if trainable is None else tuple(trainable)
        missing = [p for p in self.trainable if p not in self._params]
        if missing:
            raise ValueError(f"{weights_file}: no weights for trainable parameters {', '.join(missing[:5])}")
        self.optim = Optimizer(self.optimizer_config, self._params, self.trainable)
        for key, size in self.optim.state_bytes().items():
            self.ledger.alloc(key, size)
        self._momentum = {p: st["momentum"] for p, st in self.optim.state.items() if "momentum" in st}
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.threads = threads if self.device.type == "cpu" else None  # GPU kernels do not run on them
        self._threads_before: int | None = None
        self.step = 0  # index of the current (or next) training step
        self.losses: list[float] = []
        self.leftovers: list[str] = []  # what the last end_step had to free
        self._live: dict[str, Tensor | tuple] = {}
        self._prepared: dict[tuple[str, bool], prepared.Node] = {}  # (node, first computation) -> its call, read once
        self._refs: dict[str, plan_api.Ref] = {}  # tensor name -> its handle in plans
        self._batch: tuple[Tensor, Tensor] | None = None
        self._in_step = False
        self._op = 0
        self._doing = ""
        # (twin key, operands, outputs) of the op just run, for its twin node if that is the very next call
        self._twin: tuple | None = None
        self._freed_at: dict[str, int] = {}  # tensor -> the op that freed it
        self._paged_out: set[str] = set()
        self._step_loss: float | None = None
        self.view_copied_bytes = 0  # views never copy: aten view ops alias their base
        self.in_place_ops = 0  # ops that wrote their output into an operand the plan freed next (inplace.py)
        self.paging_wait_s = 0.0  # seconds the plan waited for the page store (writes, reads, checksums)
        self.observe: frozenset = frozenset()  # tensors copied into `observed` as made (a check reads them)
        self.observed: dict[str, Tensor] = {}

    # -- properties -----------------------------------------------------------------------------------
    @property
    def params(self) -> Mapping[str, Tensor]:
        """Read-only: prepared calls hold these tensors, so they are updated in place, never replaced. A streamed
        weight is not here (it is empty between its reads): `streamed_copy` reads one."""
        return self._resident_params

    @property
    def buffers(self) -> Mapping[str, Tensor]:
        return MappingProxyType(self._buffers)

    @property
    def momentum_buffers(self) -> dict[str, Tensor]:
        return self._momentum

    @property
    def paged_bytes(self) -> int:
        """Bytes moved to and from storage (out + in, streamed weights' reads) since the runtime was created."""
        return self.store.bytes_out + self.store.bytes_in + self.streamed.read_bytes

    @property
    def cuda_max_memory_allocated(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return torch.cuda.max_memory_allocated(self.device)

    def resident(self) -> list[str]:
        return list(self._live)

    def tensor(self, name):
        """A resident tensor, by its name or its handle."""
        return self._require(_name(name))

    # -- bookkeeping ----------------------------------------------------------------------------------
    def _begin_op(self, what) -> None:
        """`what`: the call in words, or a (format, *values) tuple formatted only if an error names it."""
        if not self._in_step:
            raise PlanError(f"{_words(what)}: called outside begin_step()/end_step()")
        self._op += 1
        self._doing = what
        self._twin = None  # outputs kept past the next call would be counted nowhere

    @property
    def _what(self) -> str:
        return f"step {self.step}, op #{self._op} {_words(self._doing)}"

    def _require(self, name: str):
        if name in self._live:
            value = self._live[name]
            if isinstance(value, PendingRead):  # a page-in read ahead: its bytes are needed now
                value = self._live[name] = self._waited(value.result)
            elif value.__class__ is Overwritten:
                raise PlanError(f"{self._what}: tensor '{name}' was overwritten in place by '{value.by}' at op "
                                f"#{value.op}, where the plan said it would be freed next")
            return value
        why = f"freed at op #{self._freed_at[name]}" if name in self._freed_at else "never computed in this step"
        raise PlanError(f"{self._what}: tensor '{name}' is not resident ({why})")

    def _hold(self, name: str, value, size: int) -> None:
        if name in self._live:
            raise PlanError(f"{self._what}: tensor '{name}' is already resident")
        self.ledger.alloc(name, size)
        self._live[name] = value

    # -- the batch ------------------------------------------------------------------------------------
    def begin_step(self, x: Tensor, y: Tensor) -> None:
        if self._in_step:
            raise PlanError(f"begin_step: step {self.step} was never ended")
        self._batch = (x, y)
        if self.threads is not None:
            current = torch.get_num_threads()
            if current != self.threads:
                self._threads_before = current
                torch.set_num_threads(self.threads)
        self._in_step = True
        self._op = 0
        self._freed_at.clear()
        self._paged_out.clear()
        self._step_loss = None

    def _load(self, name: str, which: int) -> plan_api.Ref:
        self._begin_op(f"load '{name}'")
        t = self._batch[which].detach().to(self.device, copy=True)
        self._hold(name, t, nbytes(t))
        return self._ref(name)

    def load_input(self) -> plan_api.Ref:
        """The batch's inputs, resident; returns their handle."""
        return self._load(INPUT, 0)

    def load_labels(self) -> plan_api.Ref:
        return self._load(LABELS, 1)

    # -- kernels --------------------------------------------------------------------------------------
    def call(self, name: str, op, /, *args, **keywords):
        """Compute node `name`: torch's `op` on `args` (plan_api.py), as the schedule's node says (`keywords`).
        Returns its tensor's handle, and with `aux=` also the handle of the statistics it keeps."""
        return self._call(True, name, op, args, keywords)

    def recompute(self, name: str, op, /, *args, **keywords):
        """Compute node `name` again, as `call` did (its aux stays as the first computation kept it). With the
        op given by its name, the node is given as `compute` takes it."""
        if op.__class__ is str:
            return self._node(False, name, op, *args, **keywords)
        return self._call(False, name, op, args, keywords)

    def _call(self, first, name, op, args, keywords):
        if name in self._streams:
            return self._streaming(name, self._call_here, first, name, op, args, keywords)
        return self._call_here(first, name, op, args, keywords)

    def _call_here(self, first, name, op, args, keywords):
        twin = self._twin  # what the call just before made, for this node if it holds another output of that call
        self._begin_op(("{} '{}' ({})", "compute" if first else "recompute", name, op))
        if name in self._live:
            raise PlanError(f"{self._what}: tensor '{name}' is already resident")
        node = self._prepared.get((name, first))
        # the call it was prepared from: the same op object, equal arguments and keywords
        if node is None or node.fn is not op or args != node.call_args or keywords != node.call_keywords:
            try:
                op_str, inputs, attrs, aux_of = plan_api.node_of(op, args, keywords)
            except (TypeError, ValueError) as e:
                raise PlanError(f"{self._what}: {e}") from None
            node = self._prepare(first, name, op_str, inputs, attrs, aux_of)
            node.fn, node.call_args, node.call_keywords = op, args, keywords
            node.returns = (self._ref(name), self._ref(f"{name}.aux", plan_api.AuxRef)) \
                if first and node.aux_items else self._ref(name)
        if twin is not None and twin[0] == node.twin and node.buffer_call is None:
            self._twin = twin  # for `_own_op`; anything else goes before this op's operands are read
        del twin
        self._run_aten(first, name, node)
        return node.returns

    def _ref(self, name: str, kind=plan_api.Ref):
        """The one handle of a tensor name (a plan's calls compare handles as themselves)."""
        ref = self._refs.get(name)
        if ref is None:
            ref = self._refs[name] = kind(name)
        return ref

    def compute(self, name, op, inputs, params=(), buffers=(), attrs=None, aux_of=None):
        """Compute node `name` given as the schedule writes it: the op's name, its operands (names, or
        {"t": name, "view": chain}), its attrs (aten_call.py's markers; `params` and `buffers` only list what
        they name). Returns what the node holds."""
        return self._node(True, name, op, inputs, params, buffers, attrs, aux_of)

    def _node(self, first, name, op, inputs, params=(), buffers=(), attrs=None, aux_of=None):
        if name in self._streams:
            return self._streaming(name, self._node_here, first, name, op, inputs, params, buffers, attrs, aux_of)
        return self._node_here(first, name, op, inputs, params, buffers, attrs, aux_of)

    def _node_here(self, first, name, op, inputs, params=(), buffers=(), attrs=None, aux_of=None):
        twin = self._twin
        self._begin_op(("{} '{}' ({})", "compute" if first else "recompute", name, op))
        if name in self._live:
            raise PlanError(f"{self._what}: tensor '{name}' is already resident")
        node = self._prepared.get((name, first))
        if node is None or not node.matches(op, inputs, attrs or {}, aux_of):
            node = self._prepare(first, name, op, inputs, attrs or {}, aux_of)
        return self._run(first, name, node, twin)

    def _run(self, first, name, node, twin):
        if twin is not None and twin[0] == node.twin and node.buffer_call is None:
            self._twin = twin  # for `_own_op`; anything else goes before this op's operands are read
        del twin
        return self._run_aten(first, name, node)

    def streamed_copy(self, name: str) -> Tensor:
        """A copy of streamed weight `name` as its file holds it (it is frozen: what every step read)."""
        self.streamed.read(name)
        self.streamed.read_bytes -= self.streamed.nbytes(name)  # not a step's read
        try:
            return self.streamed.tensors[name].clone()
        finally:
            self.streamed.drop(name)

    def _streaming(self, name, run, *args):
        """`run(*args)` for a node that reads streamed weights: each read from storage before the node's call is
        prepared and run (prepared views of it stay valid: the storage object is the same), counted as its
        workspace while it runs (as the compiler counted it), and freed after."""
        ws = self._streams[name]
        size = sum(self.streamed.nbytes(p) for p in ws)
        self.ledger.enter(size, f"streamed weights of '{name}'")
        try:
            for p in ws:
                self.streamed.read(p)
            return run(*args)
        finally:
            for p in ws:
                self.streamed.drop(p)
            self.ledger.leave(size)

    def _prepare(self, first, name, op, inputs, attrs, aux_of) -> prepared.Node:
        """The node's call read once (prepared.py), kept for this node's later calls of the same kind."""
        if not op.startswith(("aten.", "edgetrain.")) and op != fused_kernels.FUSED_OP:  # edgetrain's own: patch_forward.py
            raise PlanError(f"{self._what}: '{op}' is not an aten op; this plan was generated for another "
                            "runtime: recompile it")
        if self.device.type != "cpu" and q8_ops.runs_int8(op, attrs):
            raise PlanError(f"{self._what}: '{op}' is an int8 prefix's op, which runs with numpy on the CPU: run "
                            "this plan with --device cpu")
        if self.device.type != "cpu" and "_for_cpu" in op:  # torch's CPU-only kernels say so in their names
            raise PlanError(f"{self._what}: '{op}' is a CPU-only kernel: this plan was compiled for a target that "
                            f"trains on its CPU, and cannot train on {self.device.type}; compile it for a GPU "
                            "target (a Jetson profile) or run it with --device cpu")
        try:
            node = prepared.prepare(first, name, op, inputs, attrs, aux_of, self._params, self._buffers,
                                    self.device, self.optim)
        except KeyError as e:
            raise PlanError(f"{self._what}: unknown op, parameter or buffer {e.args[0]!r}") from None
        except ValueError as e:  # an output the plan writes into an operand the op's kernel cannot
            raise PlanError(f"{self._what}: {e}") from None
        self._prepared[(name, first)] = node
        return node

    # -- paging and freeing ---------------------------------------------------------------------------
    def page_out(self, name) -> None:
        """Write a resident tensor (by name or handle) to storage; it stays resident until freed."""
        name = _name(name)
        self._begin_op(f"page_out '{name}'")
        t = self._require(name)
        if isinstance(t, tuple):
            raise PlanError(f"{self._what}: aux '{name}' cannot be paged")
        self._waited(lambda: self.store.page_out(name, t))
        self._paged_out.add(name)

    def page_in(self, name) -> None:
        """Start reading a paged tensor (by name or handle) back. Its RAM is allocated and counted now; the bytes
        arrive on the store's reader thread and are waited for (and verified) where the tensor is first used."""
        name = _name(name)
        self._begin_op(f"page_in '{name}'")
        if name in self._live:
            raise PlanError(f"{self._what}: tensor '{name}' is already resident")
        if name not in self._paged_out:
            raise PlanError(f"{self._what}: tensor '{name}' was not paged out in this step")
        pending = self._waited(lambda: self.store.start_page_in(name, self.device))
        self._hold(name, pending, pending.nbytes)

    def _waited(self, fn):
        """fn(), its seconds added to `paging_wait_s` (time the plan stood still for the page store)."""
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.paging_wait_s += time.perf_counter() - t0

    def free(self, name) -> None:
        """Drop a resident tensor (by name or handle)."""
        if name.__class__ is not str:  # a handle (`_name`, inlined: a plan frees a tensor a step)
            name = name.name
        self._begin_op(("free '{}'", name))
        if self._live.get(name).__class__ is not Overwritten:
            self._require(name)
        if self.store.writing(name):  # a page-out still writing it lets go first: the bytes go when the ledger's do
            self._waited(lambda: self.store.wait(name))
        self.ledger.release(name)
        del self._live[name]
        self._freed_at[name] = self._op

    def restore_threads(self) -> None:
        """torch's thread count as it was before the step (end_step does it; a step that failed needs it)."""
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    def end_step(self) -> float | None:
        """Free whatever the plan left resident (reported in `leftovers`), return the step's loss."""
        if not self._in_step:
            raise PlanError(f"end_step: step {self.step} was never begun")
        self.restore_threads()
        self._twin = None
        self._waited(self.store.wait)  # every page-out of the step written (or its error raised) before the step ends
        for name, value in self._live.items():
            if isinstance(value, PendingRead):  # read ahead, never used: its read must still finish cleanly
                self._waited(value.result)
        self.leftovers = list(self._live)
        for name in self.leftovers:
            self.ledger.release(name)
        self._live.clear()
        if self.leftovers:
            warnings.warn(f"step {self.step}: the plan left {len(self.leftovers)} tensors resident: "
                          f"{', '.join(self.leftovers)}", RuntimeWarning, stacklevel=2)
        self._batch = None
        self._in_step = False
        self.step += 1
        return self._step_loss
