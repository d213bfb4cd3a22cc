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
from .eager_kernels import eager_backward_kernels, eager_upsampling
from .random_keys import KeyedRandom, graph_keys

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
    exported: bool = False  # traced as torch.export traces (`as_export`): a library's helper needed it


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


def tensor_field(out, field: str) -> torch.Tensor | None:
    """The tensor a model returned as `field` ("loss", "logits"): the output itself when it is a tensor, its
    attribute `field` (a Hugging Face output), or the first item of a tuple; None when there is none."""
    if isinstance(out, torch.Tensor):
        return out
    value = getattr(out, field, None)
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def _loss_value(out) -> torch.Tensor:
    """The loss a model returned: a tensor, an object with `.loss` (Hugging Face), or a tuple led by it."""
    loss = tensor_field(out, "loss")
    if loss is not None:
        return loss
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


@contextlib.contextmanager
def on_fakes(module: nn.Module):
    """`module` with fake parameters and buffers (shapes and dtypes, no data) while the context lasts: a trace
    or a forward on it computes nothing and allocates nothing. Yields the FakeTensorMode; a tensor that is
    neither a parameter nor a buffer (a constant of the code) stays real."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.utils.stateless import _reparametrize_module

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    real = {**dict(nn.Module.named_parameters(module, remove_duplicate=False)),  # every name (_Step lists one)
            **dict(module.named_buffers(remove_duplicate=False))}
    fakes, made = {}, {}
    for k, v in real.items():  # one fake per tensor: tied names stay tied
        if id(v) not in made:
            made[id(v)] = _cpu_fake(mode, v) if v.is_meta else mode.from_tensor(v)
        fakes[k] = made[id(v)]
    with _reparametrize_module(module, fakes):
        yield mode


def _cpu_fake(mode, t: torch.Tensor) -> torch.Tensor:
    """A fake CPU tensor like a meta one (a frozen weight whose values are in a file, meta_weights.py): the trace
    computes with the batch on the CPU, and a meta fake beside it would be another device."""
    with mode:
        fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return fake.requires_grad_(t.requires_grad)


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """Each further name of a tied parameter (an LM head sharing the token embedding) -> its first name, the one
    named_parameters() lists."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first and first[id(p)] != name:
            aliases[name] = first[id(p)]
        first.setdefault(id(p), name)
    return aliases


class _Step(nn.Module):
    """model + objective as one module whose forward returns the loss (what AOTAutograd differentiates).

    A tied parameter is one input of the trace, under its first name: named_parameters lists each tensor once even
    when asked for every name (aot_export_module asks, and would make each name an input of its own: one that
    forward never reads, such as T5's `shared`, gets no gradient and the trace fails), and forward reads every
    further name as the tensor under the first. Autograd then sums the gradient of the uses, in eager's order."""

    def __init__(self, model: nn.Module, fn) -> None:
        super().__init__()
        self.m = model
        self.fn = fn
        self.aliases = {f"m.{a}": f"m.{f}" for a, f in tied_aliases(model).items()}

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return super().named_parameters(prefix, recurse, remove_duplicate=True)

    def forward(self, x, y):
        from torch.nn.utils.stateless import _reparametrize_module

        bound = {a: getattr(self.get_submodule(f.rpartition(".")[0]), f.rpartition(".")[2])
                 for a, f in self.aliases.items()}
        with _reparametrize_module(self, bound) if bound else contextlib.nullcontext():
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


def _sources(step: nn.Module, gm: fx.GraphModule, x, y, fake) -> tuple[dict[str, str], list[str]]:
    """The user's source line of each op of the traced graph's forward: one forward on fake tensors records
    which line ran which aten op, and the graph's ops take them in order (an op the forward does not show,
    such as a `detach` autograd adds, takes none). Also the keys of the forward's random draws, in order."""
    where, draws = _Where(), []
    handles = _module_hooks(step.m, where)
    try:
        with torch.random.fork_rng(), torch.no_grad(), fake, where, KeyedRandom(step.m, draws):
            step(x, y)
    except Exception:  # the lines only label messages: a model that runs only traced still compiles
        return {}, []
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
    return out, draws


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


def _data_dependent(e: BaseException) -> bool:
    name = type(e).__name__
    return "GuardOnDataDependent" in name or "data-dependent" in str(e) or "DataDependent" in name


def _library_frame(e: BaseException):
    """The innermost frame of an installed library (transformers, timm) in an exception's traceback, when the
    failure happened there rather than in the model's own code or torch's; None otherwise."""
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch_dir = os.path.dirname(torch.__file__)
    for f in reversed(traceback.extract_tb(e.__traceback__)):
        if f.filename.startswith((torch_dir, ours)) or f.filename.startswith("<"):
            continue
        return f if "site-packages" in f.filename or f.filename.startswith((sys.prefix, sys.exec_prefix)) else None
    return None


def _library_path(filename: str) -> str:
    """A library file as its package names it: `transformers/masking_utils.py`."""
    return filename.split("site-packages" + os.sep, 1)[-1]


def _guard_message(e: Exception) -> str:
    """Where torch gave up on data-dependent control flow: the library's line where a library branched, and the
    user's line."""
    text = str(e)
    where = user_frame(e)
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    lib = _library_frame(e)
    if lib is not None:
        return (f"the model's control flow depends on tensor values in {_library_path(lib.filename)}:{lib.lineno}: "
                f"`{(lib.line or '').strip()}`, called{where or ' from the model'} ({first[:200]}), even traced as "
                "torch.export traces. A training graph must be the same for every batch: give that code what it "
                "branches on (an explicit attention_mask for a Hugging Face mask helper), or pick the model's "
                "option that avoids it (attn_implementation=\"eager\")")
    return (f"the model's control flow depends on tensor values{where} ({first[:200]}). A training graph must be "
            "the same for every batch: replace the data-dependent `if`/loop with torch.where or a fixed shape")


def as_export(on: bool):
    """Library code run as torch.export runs it: torch.compiler.is_compiling() and is_exporting() true, which
    libraries read to take a path a trace can follow (Hugging Face's mask helpers then build the mask instead of
    asking whether it is all ones). The eager reference of a plan traced so runs the same way."""
    if not on:
        return contextlib.nullcontext()
    from torch._export.utils import _compiling_state_context

    return _compiling_state_context()


def portable_kernels(gpu: bool):
    """A trace, or the eager reference, that a GPU plan's device can run: `F.scaled_dot_product_attention` as torch's
    math (matrix products and softmax, every backend has them). Traced on the CPU, torch picks its CPU-only flash
    kernel (`_scaled_dot_product_flash_attention_for_cpu` and its backward), which a CUDA device cannot run.
    `gpu=False`: torch's own choice."""
    if not gpu:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def _trace(step: _Step, x: torch.Tensor, y: torch.Tensor, gpu: bool, exported: bool) -> tuple:
    """aot_export_module's joint graph and signature, with the forward's source lines and random draws."""
    from torch._functorch.aot_autograd import aot_export_module

    # Fakes: the trace needs shapes, not values (a real batch made it run the model, 4x slower on BERT-base).
    # preserve_node_meta: each backward node keeps the seq_nr of the forward op it differentiates
    with on_fakes(step) as fake, contextlib.redirect_stderr(io.StringIO()), torch.fx.traceback.preserve_node_meta(), \
            portable_kernels(gpu), as_export(exported), eager_upsampling():
        gm, sig = aot_export_module(step, (fake.from_tensor(x), fake.from_tensor(y)), trace_joint=True,
                                    output_loss_index=0)
        sources, draws = _sources(step, gm, fake.from_tensor(x), fake.from_tensor(y), fake)
    return gm, sig, sources, draws


def capture(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str = "cross_entropy",
            token_ids: bool = False, user_fn=None, gpu: bool = False) -> JointCapture:
    """The joint graph of one training step of `model` on a batch like (x, y); `gpu`: of kernels a CUDA device runs
    (`portable_kernels`)."""
    if not any(p.requires_grad for p in model.parameters()):
        raise UnsupportedModelError("every parameter of the model is frozen (requires_grad=False): "
                                    "there is nothing to train")
    step = _Step(model, objective(loss, token_ids, user_fn))
    try:
        try:
            exported = False
            gm, sig, sources, draws = _trace(step, x, y, gpu, exported)
        except Exception as e:
            if not (_data_dependent(e) and _library_frame(e) is not None):
                raise
            try:  # a library's helper branched on a tensor's value: traced as torch.export traces, it may not
                exported = True
                gm, sig, sources, draws = _trace(step, x, y, gpu, exported)
            except Exception:
                raise e from None  # the first failure names the library's line
    except UnsupportedModelError:
        raise
    except Exception as e:  # torch's own message for what it could not trace
        if _data_dependent(e):
            raise UnsupportedModelError(_guard_message(e)) from None
        raise UnsupportedModelError(f"torch could not trace the training step{user_frame(e)}: {type(e).__name__}: "
                                    f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}") from None
    _unmasked(gm)
    eager_backward_kernels(gm)
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    params = {ph: _strip(p) for ph, p in sig.inputs_to_parameters.items()}  # a tied one by its first name
    buffers = {ph: _strip(b) for ph, b in sig.inputs_to_buffers.items()}
    user = [ph for ph in placeholders if ph not in params and ph not in buffers]
    if len(user) != 2:
        raise UnsupportedModelError(f"expected the batch as two inputs (x, y), torch traced {len(user)}")
    bwd = sig.backward_signature
    grads = {node: _strip(p) for node, p in bwd.gradients_to_parameters.items()}
    constants = {f"{CONSTANT_PREFIX}{n.target}": _real(getattr(gm, n.target), n.target)
                 for n in gm.graph.nodes if n.op == "get_attr"}
    buffers.update({n.name: f"{CONSTANT_PREFIX}{n.target}" for n in gm.graph.nodes if n.op == "get_attr"})
    return JointCapture(gm=gm, constants=constants, params=params, buffers=buffers, inputs=(user[0], user[1]),
                        loss=sig.user_outputs[0], grads=grads,
                        buffer_updates={node: _strip(b) for node, b in sig.buffers_to_mutate.items()},
                        seed_keys=graph_keys(gm, draws), sources=sources,
                        exported=exported)
