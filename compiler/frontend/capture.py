"""Capture a model's whole training step (forward, loss, backward) as torch's own joint graph.

AOTAutograd traces `loss = objective(model(x), y)` and its backward into one aten-level fx graph with the
eager kernels (`convolution_backward`, `native_batch_norm_backward`, ...). Frozen parameters get no
gradient and their weight-gradient work is absent; buffer updates (batch-norm running statistics) are
graph outputs. Nothing here writes a backward rule: edgetrain only reads what torch produced.
"""
from __future__ import annotations

import contextlib
import io
import linecache
import os
import sys
import traceback
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._python_dispatch

from edgetrain.compiler.errors import UnsupportedModelError

# What `--loss` may be, besides a user function given as path/file.py:fn.
LOSSES = ("cross_entropy", "mse", "model")


@dataclass
class JointCapture:
    """torch's joint forward-backward graph of one training step, with what its placeholders and outputs are."""

    gm: fx.GraphModule
    params: dict[str, str]  # placeholder -> parameter name (every parameter, frozen ones too)
    buffers: dict[str, str]  # placeholder -> buffer name
    inputs: tuple[str, str]  # placeholders of x and y
    loss: str  # the fx node of the loss value
    grads: dict[str, str]  # fx node -> parameter it is the (complete) gradient of
    buffer_updates: dict[str, str]  # fx node -> buffer it becomes
    seed_keys: dict[str, str] = field(default_factory=dict)  # random op node -> the key its mask is drawn by
    constants: dict[str, torch.Tensor] = field(default_factory=dict)  # buffer name -> a constant tensor of the code
    sources: dict[str, str] = field(default_factory=dict)  # forward fx node -> the user's line that made it


def class_dim(rank: int, token_ids: bool) -> int:
    """Where cross-entropy reads the classes of an output of `rank` dimensions: the last of a token model's
    (B, T, V) logits, else dim 1 of (B, C, ...) (torch's own; a sequence classifier's (B, C) over token ids too)."""
    return -1 if token_ids and rank == 3 else 1


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, token_ids: bool = False) -> torch.Tensor:
    """torch's cross-entropy (classes on dim 1 for (B, C, ...) outputs); for a token model's (B, T, V) logits,
    the classes are the last dimension and every one of the B*T positions counts (labels (B, T))."""
    if class_dim(logits.dim(), token_ids) == -1:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return F.cross_entropy(logits, labels)


def _loss_value(out) -> torch.Tensor:
    """The loss a model returned: a tensor, an object with `.loss` (Hugging Face), or a tuple led by it."""
    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise UnsupportedModelError(f"--loss model: the model returned {type(out).__name__}, not a loss; its "
                                "forward(x, y) must return the scalar loss (a tensor, or an object with .loss)")


def objective(loss: str, token_ids: bool = False, user_fn=None):
    """The function (model, x, y) -> scalar loss for a `--loss` choice."""
    if user_fn is not None:
        return lambda model, x, y: user_fn(model(x), y)
    if loss == "cross_entropy":
        return lambda model, x, y: cross_entropy(model(x), y, token_ids)
    if loss == "mse":
        return lambda model, x, y: F.mse_loss(model(x), y)
    if loss == "model":
        return lambda model, x, y: _loss_value(model(x, y))
    raise UnsupportedModelError(f"unknown loss {loss!r}: choose one of {', '.join(LOSSES)} or give path/file.py:fn")


def load_loss(spec: str):
    """A user's loss function given as path/file.py:fn, called as fn(output, labels)."""
    from .modelspec import _load_file

    where, _, attr = spec.rpartition(":")
    if not where.endswith(".py") or not attr:
        raise UnsupportedModelError(f"unknown loss {spec!r}: choose one of {', '.join(LOSSES)} or give "
                                    "path/file.py:fn")
    fn = getattr(_load_file(where), attr, None)
    if not callable(fn):
        raise UnsupportedModelError(f"{where!r} defines no function {attr!r} for the loss")
    return fn


def _dropout_args(func, args, kwargs) -> tuple:
    """(input, p, training) of an F.dropout(input, p=0.5, training=True, inplace=False) or
    torch.dropout(input, p, train) call."""
    names = ("input", "p", "training") if func is F.dropout else ("input", "p", "train")
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    return bound.get("input"), bound.get("p", 0.5), bound.get(names[2], True)


class KeyedDropout(torch.overrides.TorchFunctionMode):
    """Every dropout of a training step, an nn.Dropout module's or a functional F.dropout call, as torch's
    native_dropout keyed by the module that draws it: an nn.Dropout by its name, an F.dropout by the module
    whose forward calls it (`enc:F.dropout`; `F.dropout` in the model's own forward).

    During capture it only records the keys in call order (`calls`); in the exactness reference it draws
    each mask from the generator the runtime seeds for the same (seed, step, key) (`clock`), or (`hashed`, for C
    firmware) the C runtime's hashed mask for that key."""

    def __init__(self, model: nn.Module, calls: list | None = None, clock=None, hashed: bool = False) -> None:
        super().__init__()
        self.model, self.calls, self.clock, self.hashed = model, calls, clock, hashed
        self.stack: list[tuple[str, nn.Module]] = []  # the modules running, outermost first
        self.handles: list = []

    def __enter__(self):
        for name, m in self.model.named_modules():
            if name:
                self.handles.append(m.register_forward_pre_hook(
                    lambda mod, args, name=name: self.stack.append((name, mod))))
                self.handles.append(m.register_forward_hook(lambda *_: _pop(self.stack), always_call=True))
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        return super().__exit__(*exc)

    def _key(self) -> str:
        name, mod = self.stack[-1] if self.stack else ("", None)
        return name if isinstance(mod, nn.Dropout) else f"{name}:F.dropout" if name else "F.dropout"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.dropout and func is not torch.dropout:
            return func(*args, **kwargs)
        x, p, training = _dropout_args(func, args, kwargs)
        if not isinstance(x, torch.Tensor) or not isinstance(p, (int, float)) or not 0 < p < 1 or not training:
            return func(*args, **kwargs)  # the identity, or torch's own message for a bad p
        key = self._key()
        if self.calls is not None:
            self.calls.append(key)
            return torch.ops.aten.native_dropout(x, p, True)[0]
        from edgetrain.runtime.python.aten_call import seeded

        seed, step, counts = self.clock  # counts: draws of each key in this step (reset per step)
        counts[key] = counts.get(key, 0) + 1
        key = key if counts[key] == 1 else f"{key}#{counts[key]}"
        if self.hashed:
            from . import dropout_mask

            keep = dropout_mask.keep_mask(seed, step, key, p, x.numel())
            m = torch.from_numpy(keep).to(device=x.device, dtype=x.dtype).reshape(x.shape)
            return x * m * dropout_mask.scale(p)  # the kernel's x * keep * scale, rounding for rounding
        with seeded(seed, step, key, x.device):
            return torch.ops.aten.native_dropout(x, p, True)[0]


def dropout_keys(gm: fx.GraphModule, calls: list[str]) -> dict[str, str]:
    """The k-th native_dropout node of the graph is the k-th dropout call of the (last) trace."""
    nodes = [n.name for n in gm.graph.nodes if n.op == "call_function" and "native_dropout" in str(n.target)
             and "backward" not in str(n.target)]
    if not nodes or len(calls) < len(nodes):
        return {}
    last = calls[-len(nodes):]
    seen: dict[str, int] = {}
    keys = {}
    for node, key in zip(nodes, last):
        seen[key] = seen.get(key, 0) + 1
        keys[node] = key if seen[key] == 1 else f"{key}#{seen[key]}"
    return keys


def _sum_tied_gradients(gm: fx.GraphModule, grads: dict[str, str]) -> dict[str, str]:
    """torch differentiates each name of a tied parameter apart; its gradient is the sum (one add node)."""
    by_param: dict[str, list[str]] = {}
    for node, p in grads.items():
        by_param.setdefault(p, []).append(node)
    nodes = {n.name: n for n in gm.graph.nodes}
    out = gm.graph.output_node()
    for p, parts in by_param.items():
        if len(parts) < 2:
            continue
        with gm.graph.inserting_before(out):
            total = nodes[parts[0]]
            for other in parts[1:]:
                val = total.meta.get("val")
                total = gm.graph.call_function(torch.ops.aten.add.Tensor, (total, nodes[other]))
                total.meta["val"] = val
        for node in parts:
            del grads[node]
        grads[total.name] = p
        out.args = (tuple(out.args[0]) + (total,),)
    return grads


@contextlib.contextmanager
def on_fakes(module: nn.Module):
    """`module` with fake parameters and buffers (shapes and dtypes, no data) while the context lasts: a trace
    or a forward on it computes nothing and allocates nothing. Yields the FakeTensorMode; a tensor that is
    neither a parameter nor a buffer (a constant of the code) stays real."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.utils.stateless import _reparametrize_module

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    real = {**dict(module.named_parameters(remove_duplicate=False)),
            **dict(module.named_buffers(remove_duplicate=False))}
    fakes = {k: mode.from_tensor(v) for k, v in real.items()}  # one fake per tensor: tied names stay tied
    with _reparametrize_module(module, fakes):
        yield mode


class _Step(nn.Module):
    """model + objective as one module whose forward returns the loss (what AOTAutograd differentiates)."""

    def __init__(self, model: nn.Module, fn) -> None:
        super().__init__()
        self.m = model
        self.fn = fn

    def forward(self, x, y):
        return (self.fn(self.m, x, y),)


_PREFIX = "m."
CONSTANT_PREFIX = "edgetrain_constant_"  # a tensor constant of the model's code, kept as a buffer of the plan


def _strip(name: str) -> str:
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def _model_frame(frames):
    """The innermost of `frames` in the model's code (the user's, or a zoo model's): not torch's, not the
    environment's scripts and packages, not edgetrain's own; None when there is none."""
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    skip = (os.path.dirname(torch.__file__), sys.prefix, sys.exec_prefix)
    for f in reversed(frames):
        mine = f.filename.startswith(ours) and not os.path.basename(f.filename).startswith("zoo")
        if not mine and not f.filename.startswith(skip) and "site-packages" not in f.filename \
                and not f.filename.startswith("<"):
            return f
    return None


def user_frame(e: BaseException) -> str:
    """The innermost frame of the user's code in an exception's traceback: ` at file.py:line: `code``."""
    f = _model_frame(traceback.extract_tb(e.__traceback__))
    return f" at {f.filename}:{f.lineno}: `{(f.line or '').strip()}`" if f else ""


def _user_line(frames) -> str:
    """The model's innermost frame inside the training step's call: `file.py:line: `code``; "" when there is
    none (the loss edgetrain adds, for one)."""
    step = min((i for i, f in enumerate(frames) if f.filename == __file__ and f.name == "forward"), default=None)
    f = _model_frame(frames[step + 1:]) if step is not None else None
    return f"{os.path.basename(f.filename)}:{f.lineno}: `{(f.line or '').strip()}`" if f else ""


class _Frame:
    """A stack frame's place; its code line is read only when asked (most frames are never printed)."""

    __slots__ = ("filename", "lineno", "name")

    def __init__(self, filename: str, lineno: int, name: str) -> None:
        self.filename, self.lineno, self.name = filename, lineno, name

    @property
    def line(self) -> str:
        return linecache.getline(self.filename, self.lineno)


def _stack() -> list[_Frame]:
    """The caller's stack, outermost first (traceback.extract_stack reads every frame's line: 10x slower)."""
    frames, f = [], sys._getframe(1)
    while f is not None:
        frames.append(_Frame(f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return frames[::-1]


class _Where(torch.utils._python_dispatch.TorchDispatchMode):
    """Records each aten op an eager forward runs, with the user's line that ran it, or (a container such as
    nn.Sequential, whose lines are torch's) the innermost module running it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []
        self.modules: list[str] = []  # the modules being run, outermost first

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if getattr(func, "namespace", "aten") != "aten":  # prim.device: fake tensors ask it, the graph has none
            return func(*args, **(kwargs or {}))
        line = _user_line(_stack()) or (f"module {self.modules[-1]}" if self.modules else "")
        self.calls.append((_base_name(func), line))
        return func(*args, **(kwargs or {}))


def _module_hooks(model: nn.Module, where: _Where) -> list:
    """Hooks that keep `where.modules` as the stack of modules running (named as in named_modules)."""
    handles = []
    for name, m in model.named_modules():
        if not name:
            continue
        label = f"`{name}` ({type(m).__name__})"
        handles.append(m.register_forward_pre_hook(lambda mod, args, label=label: where.modules.append(label)))
        handles.append(m.register_forward_hook(lambda mod, args, out: _pop(where.modules)))
    return handles


def _pop(stack: list) -> None:
    stack.pop()  # a forward hook that returned the popped name would replace the module's output


def _base_name(target) -> str:
    """An op's name without what functionalization adds (`_native_batch_norm_legit_functional` and the eager
    `native_batch_norm` are one op to a reader)."""
    name = getattr(target, "_schema", None)
    name = name.name.split("::")[1] if name is not None else str(target)
    for part in ("_functional", "_legit", "_no_training"):
        name = name.replace(part, "")
    return name.strip("_").removeprefix("native_")


def _sources(step: nn.Module, gm: fx.GraphModule, x, y, fake) -> dict[str, str]:
    """The user's source line of each op of the traced graph's forward: one forward on fake tensors records
    which line ran which aten op, and the graph's ops take them in order (an op the forward does not show,
    such as a `detach` autograd adds, takes none)."""
    where = _Where()
    handles = _module_hooks(step.m, where)
    try:
        with torch.random.fork_rng(), torch.no_grad(), fake, where, KeyedDropout(step.m, []):
            step(x, y)
    except Exception:  # the lines only label messages: a model that runs only traced still compiles
        return {}
    finally:
        for h in handles:
            h.remove()
    calls, at, out = where.calls, 0, {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or not hasattr(n.target, "_schema"):
            continue
        name = _base_name(n.target)
        for j in range(at, min(at + 8, len(calls))):  # a short look-ahead keeps the two sequences aligned
            if calls[j][0] == name:
                if calls[j][1]:
                    out[n.name] = calls[j][1]
                at = j + 1
                break
    return out


def _unmasked(gm: fx.GraphModule) -> None:
    """A fake kernel makes every output of a backward op; the real one makes none where its output_mask is
    False (batch-norm's input gradient under a frozen first layer): the values say what the runtime gets."""
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
        if n.op != "call_function" or "output_mask" not in names:
            continue
        i = names.index("output_mask")
        mask = n.kwargs.get("output_mask", n.args[i] if i < len(n.args) else None)
        val = n.meta.get("val")
        if isinstance(mask, (list, tuple)) and isinstance(val, (list, tuple)) and len(val) == len(mask):
            n.meta["val"] = type(val)(v if m else None for v, m in zip(val, mask))


def _real(value, name: str) -> torch.Tensor:
    """A constant torch lifted out of the code, as real data (it becomes a buffer of the plan)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(value, FakeTensor):
        return value
    if value.constant is None:
        raise UnsupportedModelError(f"the model's code makes a tensor constant ({name}, shape {tuple(value.shape)}) "
                                    "whose values the trace cannot keep: register it as a buffer of the module "
                                    "(self.register_buffer) instead")
    return value.constant


def _guard_message(e: Exception) -> str:
    """Where torch gave up on data-dependent control flow: the user's line."""
    text = str(e)
    where = user_frame(e)
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return (f"the model's control flow depends on tensor values{where} ({first[:200]}). A training graph must be "
            "the same for every batch: replace the data-dependent `if`/loop with torch.where or a fixed shape")


def portable_kernels(gpu: bool):
    """A trace, or the eager reference, that a GPU plan's device can run: `F.scaled_dot_product_attention` as torch's
    math (matrix products and softmax, every backend has them). Traced on the CPU, torch picks its CPU-only flash
    kernel (`_scaled_dot_product_flash_attention_for_cpu` and its backward), which a CUDA device cannot run.
    `gpu=False`: torch's own choice."""
    if not gpu:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def capture(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str = "cross_entropy",
            token_ids: bool = False, user_fn=None, gpu: bool = False) -> JointCapture:
    """The joint graph of one training step of `model` on a batch like (x, y); `gpu`: of kernels a CUDA device runs
    (`portable_kernels`)."""
    from torch._functorch.aot_autograd import aot_export_module

    if not any(p.requires_grad for p in model.parameters()):
        raise UnsupportedModelError("every parameter of the model is frozen (requires_grad=False): "
                                    "there is nothing to train")
    # Tied parameters (an LM head sharing the embedding) are one parameter: named_parameters lists it once.
    tied: dict[str, str] = {}
    seen: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen and seen[id(p)] != name:
            tied[name] = seen[id(p)]
        seen.setdefault(id(p), name)
    calls: list[str] = []
    step = _Step(model, objective(loss, token_ids, user_fn))
    try:
        # Fakes: the trace needs shapes, not values (a real batch made it run the model, 4x slower on BERT-base).
        # preserve_node_meta: each backward node keeps the seq_nr of the forward op it differentiates
        with on_fakes(step) as fake, KeyedDropout(model, calls), contextlib.redirect_stderr(io.StringIO()), \
                torch.fx.traceback.preserve_node_meta(), portable_kernels(gpu):
            gm, sig = aot_export_module(step, (fake.from_tensor(x), fake.from_tensor(y)), trace_joint=True,
                                        output_loss_index=0)
            seed_keys = dropout_keys(gm, calls)  # before the forward below records its own
            sources = _sources(step, gm, fake.from_tensor(x), fake.from_tensor(y), fake)
    except UnsupportedModelError:
        raise
    except Exception as e:  # torch's own message for what it could not trace
        name = type(e).__name__
        if "GuardOnDataDependent" in name or "data-dependent" in str(e) or "DataDependent" in name:
            raise UnsupportedModelError(_guard_message(e)) from None
        raise UnsupportedModelError(f"torch could not trace the training step{user_frame(e)}: {name}: "
                                    f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}") from None
    _unmasked(gm)
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    # A tied parameter is named as named_parameters() names it (its first name) everywhere.
    params = {ph: tied.get(_strip(p), _strip(p)) for ph, p in sig.inputs_to_parameters.items()}
    buffers = {ph: _strip(b) for ph, b in sig.inputs_to_buffers.items()}
    user = [ph for ph in placeholders if ph not in params and ph not in buffers]
    if len(user) != 2:
        raise UnsupportedModelError(f"expected the batch as two inputs (x, y), torch traced {len(user)}")
    bwd = sig.backward_signature
    grads = {node: tied.get(_strip(p), _strip(p)) for node, p in bwd.gradients_to_parameters.items()}
    grads = _sum_tied_gradients(gm, grads)
    constants = {f"{CONSTANT_PREFIX}{n.target}": _real(getattr(gm, n.target), n.target)
                 for n in gm.graph.nodes if n.op == "get_attr"}
    buffers.update({n.name: f"{CONSTANT_PREFIX}{n.target}" for n in gm.graph.nodes if n.op == "get_attr"})
    return JointCapture(gm=gm, constants=constants, params=params, buffers=buffers, inputs=(user[0], user[1]),
                        loss=sig.user_outputs[0], grads=grads,
                        buffer_updates={node: _strip(b) for node, b in sig.buffers_to_mutate.items()},
                        seed_keys=seed_keys, sources=sources)
