"""The executor: a generated plan calls one `Runtime` method per schedule step.

The runtime holds every tensor by name, counts it in the ledger, runs each step's aten op (torch's own
kernel, the one autograd runs), applies the optimizer right after a parameter's gradient is made, and pages
tensors to files. It checks the plan as it goes: an operand that is not resident, a
tensor computed twice, a page-in of something never paged out all raise `PlanError` naming the tensor and
the step.
"""
from __future__ import annotations

import time
import warnings
from os import PathLike

import torch
from torch import Tensor

from .integrity import read_weights
from . import aten_call, heap, inplace
from .ledger import Ledger
from .optim import Optimizer
from .storage import FileStore, PendingRead

INPUT, LABELS = "input", "labels"


class PlanError(RuntimeError):
    """The plan asked for something the runtime's state does not allow."""


class _Overwritten:
    """Stands for a resident tensor whose storage an in-place op took (`inplace.py`) until the plan frees it."""
    __slots__ = ("op", "by")

    def __init__(self, op: int, by: str) -> None:
        self.op, self.by = op, by


def nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _storage_ptr(t: Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.numel() else 0


def _words(what) -> str:
    return what if isinstance(what, str) else what[0].format(*what[1:])


class Runtime:
    def __init__(self, weights_file: str | PathLike, storage_dir: str | PathLike, *, device=None,
                 optimizer: dict | None = None, trainable=None, lr: float | None = None,
                 momentum: float | None = None, weight_decay: float | None = None, seed: int = 0,
                 expected_tensors: dict | None = None) -> None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
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
        for key, t in read_weights(weights_file, expected_tensors).items():
            kind, _, name = key.partition("/")
            if kind not in ("param", "buffer") or not name:
                raise ValueError(f"{weights_file}: unexpected key '{key}' (want param/<name> or buffer/<name>)")
            t = t.to(self.device, copy=True)  # own the memory (load_file maps the file)
            (self._params if kind == "param" else self._buffers)[name] = t
            self.ledger.alloc(key, nbytes(t))
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
        self.step = 0  # index of the current (or next) training step
        self.losses: list[float] = []
        self.leftovers: list[str] = []  # what the last end_step had to free
        self._live: dict[str, Tensor | tuple] = {}
        self._batch: tuple[Tensor, Tensor] | None = None
        self._in_step = False
        self._op = 0
        self._doing = ""
        self._freed_at: dict[str, int] = {}  # tensor -> the op that freed it
        self._paged_out: set[str] = set()
        self._step_loss: float | None = None
        self.view_copied_bytes = 0  # views never copy: aten view ops alias their base
        self.in_place_ops = 0  # ops that wrote their output into an operand the plan freed next (inplace.py)
        self.paging_wait_s = 0.0  # seconds the plan waited for the page store (writes, reads, checksums)

    # -- properties -----------------------------------------------------------------------------------
    @property
    def params(self) -> dict[str, Tensor]:
        return self._params

    @property
    def buffers(self) -> dict[str, Tensor]:
        return self._buffers

    @property
    def momentum_buffers(self) -> dict[str, Tensor]:
        return self._momentum

    @property
    def paged_bytes(self) -> int:
        """Bytes moved to and from storage (out + in) since the runtime was created."""
        return self.store.bytes_out + self.store.bytes_in

    @property
    def cuda_max_memory_allocated(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return torch.cuda.max_memory_allocated(self.device)

    def resident(self) -> list[str]:
        return list(self._live)

    def tensor(self, name: str):
        return self._require(name)

    # -- bookkeeping ----------------------------------------------------------------------------------
    def _begin_op(self, what) -> None:
        """`what`: the call in words, or a (format, *values) tuple formatted only if an error names it."""
        if not self._in_step:
            raise PlanError(f"{_words(what)}: called outside begin_step()/end_step()")
        self._op += 1
        self._doing = what

    @property
    def _what(self) -> str:
        return f"step {self.step}, op #{self._op} {_words(self._doing)}"

    def _require(self, name: str):
        if name in self._live:
            value = self._live[name]
            if isinstance(value, PendingRead):  # a page-in read ahead: its bytes are needed now
                value = self._live[name] = self._waited(value.result)
            elif value.__class__ is _Overwritten:
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
        self._in_step = True
        self._op = 0
        self._freed_at.clear()
        self._paged_out.clear()
        self._step_loss = None

    def _load(self, name: str, which: int) -> Tensor:
        self._begin_op(f"load '{name}'")
        t = self._batch[which].detach().to(self.device, copy=True)
        self._hold(name, t, nbytes(t))
        return t

    def load_input(self) -> Tensor:
        return self._load(INPUT, 0)

    def load_labels(self) -> Tensor:
        return self._load(LABELS, 1)

    # -- kernels --------------------------------------------------------------------------------------
    def compute(self, name, op, inputs, params=(), buffers=(), attrs=None, aux_of=None):
        return self._run(True, name, op, inputs, params, buffers, attrs, aux_of)

    def recompute(self, name, op, inputs, params=(), buffers=(), attrs=None, aux_of=None):
        return self._run(False, name, op, inputs, params, buffers, attrs, aux_of)

    def _run(self, first, name, op, inputs, params, buffers, attrs, aux_of):
        self._begin_op(("{} '{}' ({})", "compute" if first else "recompute", name, op))
        if op.startswith("aten."):
            return self._run_aten(first, name, op, inputs, attrs or {}, aux_of)
        raise PlanError(f"{self._what}: '{op}' is not an aten op; this plan was generated for another "
                        "runtime: recompile it")

    def _run_aten(self, first, name, op, inputs, attrs, aux_of):
        """One aten op: operands in, the outputs the plan keeps held, updates applied, the rest dropped."""
        if name in self._live:
            raise PlanError(f"{self._what}: tensor '{name}' is already resident")
        ins = []
        for r in inputs:
            if isinstance(r, str):  # most operands: a tensor as it is
                ins.append(self._require(r))
                continue
            t, view = self._require(r["t"]), r.get("view")
            try:
                ins.append(aten_call.apply_view(t, view))
            except (RuntimeError, IndexError, TypeError) as e:
                raise PlanError(f"{self._what}: view {view} of '{r['t']}': {e}") from None
        aux = self._require(f"{aux_of}.aux") if aux_of is not None else None
        spot = self._inplace_spot(op, attrs, inputs, ins) if "dying" in attrs else None
        # A kernel's scratch (the compiler's rule, in the plan) is held while its op runs and its outputs are applied.
        scratch = attrs.get("scratch", 0)
        if scratch:
            with self.ledger.transient(scratch, label=f"{name} (kernel scratch)"):
                held, outs = self._own_op(first, name, op, ins, attrs, aux, spot)
        else:  # nothing to hold: no context to enter (a step runs hundreds of ops)
            held, outs = self._own_op(first, name, op, ins, attrs, aux, spot)
        if spot is not None:  # the operand's bytes are the output's now: any read before its free is refused
            self._live[inputs[spot[0]]] = _Overwritten(self._op, name)
            self.in_place_ops += 1
        for sub in attrs.get("then", ()):  # each holds nothing
            with self.ledger.transient(sub.get("scratch", 0), label=f"{name} (then {sub['op']}, kernel scratch)"):
                more = aten_call.call(sub["op"], sub, ins, self._params, self._buffers, aux, self.device, self.seed,
                                      self.step, held)
                with self.ledger.transient(aten_call.dropped_bytes(more, "none"), label=f"{name} (then {sub['op']})"):
                    self._apply_updates(first, more, sub.get("updates", ()))
        if first and "loss_item" in attrs:
            item = attrs["loss_item"]
            self._step_loss = float(outs[0] if item is None else outs[item])
            self.losses.append(self._step_loss)
        return held

    def _inplace_spot(self, op, attrs, inputs, ins):
        """(operand, arguments) where the op may write into an operand the plan frees right after it."""
        spot = inplace.plan(op, attrs, ins, [isinstance(r, str) for r in inputs])
        if spot is None or self.store.writing(inputs[spot[0]]):  # a page-out still reading it keeps it
            return None
        return spot

    def _own_op(self, first, name, op, ins, attrs, aux, spot=None):
        """The node's own op: its outputs held (and aux), its updates applied while the rest are dropped.
        `spot`: run the op's in-place twin into that operand (`inplace.plan`)."""
        grad_was = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # torch.no_grad() without its context object, once per op
        updates = attrs.get("updates", ())
        try:
            if spot is None and first and updates and inplace.updates_buffers_in_place(op, attrs):
                outs = aten_call.call(inplace.BUFFER_UPDATES[op][0], attrs, ins, self._params, self._buffers, aux,
                                      self.device, self.seed, self.step)
                new = {u["item"]: self._buffers[u["buffer"]] for u in updates}  # the new values, in place already
                outs += [new[k] for k in range(len(outs), len(outs) + len(new))]
                updates = ()
            elif spot is None:
                outs = aten_call.call(op, attrs, ins, self._params, self._buffers, aux, self.device, self.seed,
                                      self.step)
            else:
                outs = aten_call.call(inplace.INPLACE[op], dict(attrs, args=spot[1]), ins, self._params,
                                      self._buffers, aux, self.device, self.seed, self.step)
        except KeyError as e:
            raise PlanError(f"{self._what}: unknown op, parameter or buffer {e.args[0]!r}") from None
        finally:
            torch._C._set_grad_enabled(grad_was)
        keep = attrs.get("keep")
        held = aten_call.held(outs, keep)
        if held is not None and spot is None:
            held_items = held if isinstance(held, tuple) else (held,)
            in_ptrs = {_storage_ptr(t) for t in ins if isinstance(t, Tensor) and t.numel()}
            if any(isinstance(o, Tensor) and o.numel() and _storage_ptr(o) in in_ptrs for o in held_items):
                raise PlanError(f"{self._what}: the op's output aliases an operand")
            self._hold(name, held, sum(nbytes(o) for o in held_items))
        elif held is not None:  # counted as a new tensor, as the schedule does; the operand's bytes go at its free
            self._hold(name, held, nbytes(held))
        aux_items = attrs.get("aux", ())
        if first and aux_items:
            aux_out = tuple(outs[k] for k in aux_items)
            self._hold(f"{name}.aux", aux_out, sum(nbytes(a) for a in aux_out))
        dropped = aten_call.dropped_bytes(outs, keep, aux_items) if len(outs) > 1 or keep is not None else 0
        kept = (*aten_call.held_items(keep), *aux_items) if updates else ()
        if dropped:
            with self.ledger.transient(dropped, label=f"{name} (dropped outputs)"):
                self._apply_updates(first, outs, updates, kept)
        elif updates:  # nothing dropped: the updates add nothing to the count
            self._apply_updates(first, outs, updates, kept)
        return held, outs

    def _apply_updates(self, first: bool, outs: list, updates, kept=()) -> None:
        """`kept`: the output items the node holds (or keeps as aux); any other gradient dies with the update."""
        for u in updates:
            value = aten_call.update_value(outs, u)
            if "param" in u:
                scratch = not u.get("view") and (u.get("item") or 0) not in kept and inplace.sole_owner(value)
                self.optim.update(u["param"], self._params[u["param"]], value, scratch)
            elif first:  # a recompute never updates running statistics again
                self._buffers[u["buffer"]].copy_(value)

    # -- paging and freeing ---------------------------------------------------------------------------
    def page_out(self, name: str) -> None:
        """Write a resident tensor to storage; it stays resident until freed."""
        self._begin_op(f"page_out '{name}'")
        t = self._require(name)
        if isinstance(t, tuple):
            raise PlanError(f"{self._what}: aux '{name}' cannot be paged")
        self._waited(lambda: self.store.page_out(name, t))
        self._paged_out.add(name)

    def page_in(self, name: str) -> None:
        """Start reading a paged tensor back. Its RAM is allocated and counted now; the bytes arrive on the
        store's reader thread and are waited for (and verified) where the tensor is first used."""
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

    def free(self, name: str) -> None:
        self._begin_op(("free '{}'", name))
        if self._live.get(name).__class__ is not _Overwritten:
            self._require(name)
        if self.store.writing(name):  # a page-out still writing it lets go first: the bytes go when the ledger's do
            self._waited(lambda: self.store.wait(name))
        self.ledger.release(name)
        del self._live[name]
        self._freed_at[name] = self._op

    def end_step(self) -> float | None:
        """Free whatever the plan left resident (reported in `leftovers`), return the step's loss."""
        if not self._in_step:
            raise PlanError(f"end_step: step {self.step} was never begun")
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
