"""The executor: a generated plan calls one `Runtime` method per schedule step.

The runtime holds every tensor by name, counts it in the ledger, runs kernels, applies the fused SGD
updates, and pages tensors to files. It checks the plan as it goes: an operand that is not resident, a
tensor computed twice, a page-in of something never paged out all raise `PlanError` naming the tensor and
the step.
"""
from __future__ import annotations

import warnings
from os import PathLike

import torch
from safetensors.torch import load_file
from torch import Tensor

from .kernel_api import KernelContext, KernelResult
from .kernels import KERNELS
from .ledger import Ledger
from .sgd import sgd_update
from .storage import FileStore
from .views import ViewError, apply_views

LOSS_OPS = frozenset({"cross_entropy", "mse"})
INPUT, LABELS = "input", "labels"


class PlanError(RuntimeError):
    """The plan asked for something the runtime's state does not allow."""


def nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _storage_ptr(t: Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.numel() else 0


class Runtime:
    def __init__(self, weights_file: str | PathLike, storage_dir: str | PathLike, *, device=None,
                 lr: float, momentum: float, weight_decay: float, seed: int = 0) -> None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.lr, self.momentum, self.weight_decay, self.seed = lr, momentum, weight_decay, int(seed)
        self.ledger = Ledger()
        self.store = FileStore(storage_dir)
        self._params: dict[str, Tensor] = {}
        self._buffers: dict[str, Tensor] = {}
        self._momentum: dict[str, Tensor] = {}
        for key, t in load_file(str(weights_file), device="cpu").items():
            kind, _, name = key.partition("/")
            if kind not in ("param", "buffer") or not name:
                raise ValueError(f"{weights_file}: unexpected key '{key}' (want param/<name> or buffer/<name>)")
            t = t.to(self.device, copy=True)  # own the memory (load_file maps the file)
            (self._params if kind == "param" else self._buffers)[name] = t
            self.ledger.alloc(key, nbytes(t))
        if momentum != 0:
            for name, p in self._params.items():
                self._momentum[name] = torch.zeros_like(p)
                self.ledger.alloc(f"momentum/{name}", nbytes(p))
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.step = 0  # index of the current (or next) training step
        self.losses: list[float] = []
        self.leftovers: list[str] = []  # what the last end_step had to free
        self._live: dict[str, Tensor | tuple] = {}
        self._batch: tuple[Tensor, Tensor] | None = None
        self._in_step = False
        self._op = 0
        self._what = ""
        self._freed_at: dict[str, str] = {}
        self._paged_out: set[str] = set()
        self._step_loss: float | None = None
        self.view_copied_bytes = 0  # reshapes that had to copy (a plan the compiler got right has none)

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
    def _begin_op(self, what: str) -> None:
        if not self._in_step:
            raise PlanError(f"{what}: called outside begin_step()/end_step()")
        self._op += 1
        self._what = f"step {self.step}, op #{self._op} {what}"

    def _require(self, name: str):
        if name in self._live:
            return self._live[name]
        why = f"freed at {self._freed_at[name]}" if name in self._freed_at else "never computed in this step"
        raise PlanError(f"{self._what}: tensor '{name}' is not resident ({why})")

    def _hold(self, name: str, value, size: int) -> None:
        if name in self._live:
            raise PlanError(f"{self._what}: tensor '{name}' is already resident")
        self.ledger.alloc(name, size)
        self._live[name] = value

    def _operand(self, ref) -> tuple[Tensor, int]:
        """An input operand: a name, or {"t": name, "view": [...]}. Returns it and the bytes copied."""
        if isinstance(ref, str):
            ref = {"t": ref}
        t = self._require(ref["t"])
        if isinstance(t, tuple) and not ref.get("view"):
            raise PlanError(f"{self._what}: '{ref['t']}' is an aux tuple, not an operand")
        try:
            t, copied = apply_views(t, ref.get("view", ()))
        except ViewError as e:
            raise PlanError(f"{self._what}: {e} on '{ref['t']}'") from None
        self.view_copied_bytes += copied
        return t, copied

    def _lookup(self, table: dict, names, kind: str) -> list[Tensor]:
        try:
            return [table[n] for n in names]
        except KeyError as e:
            raise PlanError(f"{self._what}: unknown {kind} {e.args[0]!r}") from None

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
        self._begin_op(f"{'compute' if first else 'recompute'} '{name}' ({op})")
        kernel = KERNELS.get(op)
        if kernel is None:
            raise PlanError(f"{self._what}: no kernel named '{op}'")
        if name in self._live:
            raise PlanError(f"{self._what}: tensor '{name}' is already resident")
        operands = [self._operand(r) for r in inputs]
        ins = [t for t, _ in operands]
        copied = sum(c for _, c in operands)
        ps = self._lookup(self._params, params, "parameter")
        bufs = self._lookup(self._buffers, buffers, "buffer")
        aux = None
        if aux_of is not None:
            aux = self._require(f"{aux_of}.aux")
        ctx = KernelContext(first=first, buffers=bufs, aux=aux, step=self.step, seed=self.seed,
                            device=self.device)
        with torch.no_grad():
            res = kernel(ctx, ins, ps, dict(attrs or {}))
        self._check_result(res, ins + ps + bufs, len(ps))
        if res.out is not None:  # a tuple: the input gradients of an op with several differentiable inputs
            out = tuple(res.out) if isinstance(res.out, (tuple, list)) else res.out
            self._hold(name, out, sum(map(nbytes, out)) if isinstance(out, tuple) else nbytes(out))
        if first and res.aux is not None:
            self._hold(f"{name}.aux", tuple(res.aux), sum(nbytes(a) for a in res.aux))
        work = sum(nbytes(g) for g in res.grads) + sum(nbytes(s) for s in res.scratch) + copied
        with self.ledger.transient(work, label=f"{name} (grads+scratch)"):
            for pname, p, g in zip(params, ps, res.grads):
                sgd_update(p, g, self._momentum.get(pname), self.lr, self.momentum, self.weight_decay)
        if first and op in LOSS_OPS:
            self._step_loss = float(res.out)
            self.losses.append(self._step_loss)
        return res.out

    def _check_result(self, res: KernelResult, operands: list[Tensor], n_params: int) -> None:
        if res.grads and len(res.grads) != n_params:
            raise PlanError(f"{self._what}: kernel gave {len(res.grads)} gradients for {n_params} params")
        outs = res.out if isinstance(res.out, (tuple, list)) else [res.out]
        for out in outs:
            if out is not None and out.numel():
                ptr = _storage_ptr(out)
                if any(_storage_ptr(t) == ptr for t in operands):
                    raise PlanError(f"{self._what}: kernel output aliases an operand")

    # -- paging and freeing ---------------------------------------------------------------------------
    def page_out(self, name: str) -> None:
        """Write a resident tensor to storage; it stays resident until freed."""
        self._begin_op(f"page_out '{name}'")
        t = self._require(name)
        if isinstance(t, tuple):
            raise PlanError(f"{self._what}: aux '{name}' cannot be paged")
        self.store.page_out(name, t)
        self._paged_out.add(name)

    def page_in(self, name: str) -> Tensor:
        self._begin_op(f"page_in '{name}'")
        if name in self._live:
            raise PlanError(f"{self._what}: tensor '{name}' is already resident")
        if name not in self._paged_out:
            raise PlanError(f"{self._what}: tensor '{name}' was not paged out in this step")
        t = self.store.page_in(name, self.device)
        self._hold(name, t, nbytes(t))
        return t

    def free(self, name: str) -> None:
        self._begin_op(f"free '{name}'")
        self._require(name)
        self.store.wait(name)  # a page-out still writing it lets go first: the bytes go when the ledger's do
        self.ledger.release(name)
        del self._live[name]
        self._freed_at[name] = f"op #{self._op}"

    def end_step(self) -> float | None:
        """Free whatever the plan left resident (reported in `leftovers`), return the step's loss."""
        if not self._in_step:
            raise PlanError(f"end_step: step {self.step} was never begun")
        self.store.wait()  # every page-out of the step written (or its error raised) before the step ends
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
