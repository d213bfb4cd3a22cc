"""Early exits of a locally trained network (NeuroFlux), and their export.

After local learning every layer's auxiliary head is a trained classifier, so the network truncated after
layer k and finished by head k is a complete model: an *early exit*. :func:`select_exit` picks one from
validation accuracies (the best, with ties within a tolerance going to the smaller model);
:func:`exit_model` assembles it from the trained modules; :func:`export_safetensors` and
:func:`export_onnx` write it for deployment, :func:`load_safetensors` and :func:`check_onnx` read it back.

ONNX export uses torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``), which needs ``onnx`` and
``onnxscript``; the parity check runs ``onnxruntime`` on the CPU. Both are imported lazily, so the rest of
edgetrain works without them and a missing one gives an error that says what to install.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import nn

from edgetrain.compiler.errors import EdgetrainError

__all__ = [
    "ExportError", "OnnxUnavailableError", "DEFAULT_TOLERANCE_POINTS", "DEFAULT_OPSET",
    "select_exit", "exit_model", "count_params", "export_safetensors", "load_safetensors",
    "export_onnx", "check_onnx",
]

DEFAULT_TOLERANCE_POINTS = 0.5
# Opset 18 is what the dynamo exporter emits natively for these ops and what current ONNX Runtime, TensorRT
# and TFLite converters all read; pinned so an exported file does not change with the torch version.
DEFAULT_OPSET = 18
_ONNX_HINT = "pip install onnx onnxruntime onnxscript"


class ExportError(EdgetrainError, ValueError):
    """An exported file does not match the model it is loaded into, or the export inputs are malformed."""


class OnnxUnavailableError(EdgetrainError, ImportError):
    """onnx / onnxruntime / onnxscript is not installed."""


# -- choosing the exit -----------------------------------------------------------------------------


def select_exit(val_accuracy: Sequence[float], params: Sequence[int],
                tolerance_points: float = DEFAULT_TOLERANCE_POINTS) -> int:
    """Index k of the early exit to keep.

    ``val_accuracy[k]``: validation accuracy of exit k in percent points; ``params[k]``: parameters of the
    exit model (trunk layers 0..k + head k). Every exit whose accuracy is within ``tolerance_points`` of the
    best (inclusive) is a candidate; the one with the fewest parameters wins, then the earlier exit. The
    tolerance is what makes "best accuracy and fewest parameters" one rule: a deeper exit must beat a
    smaller one by more than validation noise to be worth its parameters.
    """
    acc = [float(a) for a in val_accuracy]
    n_params = [int(p) for p in params]
    if not acc:
        raise ValueError("select_exit: no exits (empty val_accuracy)")
    if len(acc) != len(n_params):
        raise ValueError(f"select_exit: {len(acc)} accuracies but {len(n_params)} parameter counts")
    if not all(math.isfinite(a) for a in acc):
        raise ValueError(f"select_exit: non-finite accuracy in {acc}")
    if any(p < 0 for p in n_params):
        raise ValueError(f"select_exit: negative parameter count in {n_params}")
    if not (math.isfinite(tolerance_points) and tolerance_points >= 0):
        raise ValueError(f"select_exit: tolerance_points must be >= 0, got {tolerance_points}")
    # 1e-9: "within 0.5 points" must hold for 90.3 vs 89.8, whose float difference is 0.5000000000000142.
    floor = max(acc) - tolerance_points - 1e-9
    return min((k for k, a in enumerate(acc) if a >= floor), key=lambda k: (n_params[k], k))


def _module(layer) -> nn.Module:
    # heads.split_layers gives TrainableLayer records; take their module so both kinds can be passed.
    mod = getattr(layer, "module", layer)
    if not isinstance(mod, nn.Module):
        raise TypeError(f"exit_model: expected nn.Module layers, got {type(layer).__name__}")
    return mod


def exit_model(layers: Sequence[nn.Module], heads: Sequence[nn.Module], k: int) -> nn.Sequential:
    """Layers 0..k followed by head k, sharing the modules (no copy): ``layer0 .. layer{k}``, ``head``.

    ``layers`` may also be :class:`~edgetrain.compiler.local.heads.TrainableLayer` records.
    """
    if len(layers) != len(heads):
        raise ValueError(f"exit_model: {len(layers)} layers but {len(heads)} heads")
    if not 0 <= k < len(layers):
        raise ValueError(f"exit_model: exit {k} out of range [0, {len(layers)})")
    mods: OrderedDict[str, nn.Module] = OrderedDict((f"layer{i}", _module(layers[i])) for i in range(k + 1))
    mods["head"] = _module(heads[k])
    return nn.Sequential(mods)


def count_params(module: nn.Module) -> int:
    """Parameters of ``module``, each shared tensor once (what a deployed copy stores)."""
    return sum(p.numel() for p in module.parameters())


# -- safetensors -----------------------------------------------------------------------------------


def export_safetensors(model: nn.Module, path: str | Path,
                       metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``model.state_dict()`` (parameters and buffers: BN running stats, ``num_batches_tracked``) as
    safetensors: plain tensors and a JSON header, nothing executable (unlike a pickled ``torch.save``).

    Tensors are written as contiguous CPU copies, so views and shared storages need no special handling.
    """
    from safetensors.torch import save_file

    meta = dict(metadata or {})
    bad = {k: v for k, v in meta.items() if not (isinstance(k, str) and isinstance(v, str))}
    if bad:
        raise ExportError(f"export_safetensors: metadata must map str to str; offending entries: {bad}")
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta or None)
    return path


def load_safetensors(model: nn.Module, path: str | Path) -> dict[str, str]:
    """Load a file written by :func:`export_safetensors` into ``model``; returns the file's metadata.

    Every key of the model must be in the file and vice versa, with the same shape and dtype; otherwise
    :class:`ExportError` lists the differences (and ``model`` is left unchanged).
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    own = model.state_dict()
    problems = []
    missing = sorted(set(own) - set(tensors))
    unexpected = sorted(set(tensors) - set(own))
    if missing:
        problems.append(f"missing in the file: {', '.join(missing)}")
    if unexpected:
        problems.append(f"not in the model: {', '.join(unexpected)}")
    for k in sorted(set(own) & set(tensors)):
        a, b = own[k], tensors[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{k}: model {tuple(a.shape)} {a.dtype}, file {tuple(b.shape)} {b.dtype}")
    if problems:
        raise ExportError(f"{path} does not match the model ({type(model).__name__}): " + "; ".join(problems))
    model.load_state_dict(tensors, strict=True)
    return meta


# -- ONNX ------------------------------------------------------------------------------------------


def _require(*names: str):
    import importlib

    mods = []
    for name in names:
        try:
            mods.append(importlib.import_module(name))
        except ImportError as exc:
            raise OnnxUnavailableError(f"ONNX export/check needs the package {name!r}, which is not "
                                       f"installed: {_ONNX_HINT}") from exc
    return mods


@contextlib.contextmanager
def _quiet_exporter():
    """The dynamo exporter prints progress, logs that torchvision ops are skipped, and raises deprecation
    warnings from inside torch; none of it is actionable for the user of an exit model."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)


def export_onnx(model: nn.Module, sample_input: torch.Tensor, path: str | Path, *,
                opset: int = DEFAULT_OPSET, metadata: Mapping[str, str] | None = None) -> Path:
    """Export ``model`` in eval mode (BN uses its running stats) to ONNX with a dynamic batch dimension.

    Input ``input`` (batch, *sample_input.shape[1:]), output ``logits``. The opset is in the file's
    ``opset_import`` and, with ``metadata``, in its ``metadata_props`` (``edgetrain.opset``). The model's
    training mode is restored afterwards.
    """
    onnx, _ = _require("onnx", "onnxscript")
    if sample_input.dim() < 1 or sample_input.shape[0] < 1:
        raise ExportError(f"export_onnx: sample_input needs a batch dimension, got {tuple(sample_input.shape)}")
    # torch.export specialises a dimension traced at size 1 to the constant 1; trace a batch of 2.
    x = sample_input if sample_input.shape[0] >= 2 else sample_input.repeat(2, *[1] * (sample_input.dim() - 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    try:
        with _quiet_exporter(), torch.no_grad():
            torch.onnx.export(model, (x,), str(path), dynamo=True, opset_version=opset, verbose=False,
                              input_names=["input"], output_names=["logits"],
                              dynamic_shapes=({0: torch.export.Dim("batch")},))
    finally:
        model.train(was_training)
    proto = onnx.load(str(path))
    found = {o.domain: o.version for o in proto.opset_import}.get("", None)
    if found != opset:
        raise ExportError(f"export_onnx: asked for opset {opset}, the exporter wrote {found}")
    props = {"edgetrain.opset": str(opset), "edgetrain.torch": torch.__version__, **dict(metadata or {})}
    for k, v in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = str(k), str(v)
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return path


def check_onnx(model: nn.Module, path: str | Path, x: torch.Tensor) -> dict:
    """Run the ONNX file (onnxruntime, CPUExecutionProvider) and ``model`` (eval mode) on the same batch.

    Returns ``{"max_abs_diff": float, "same_predictions": fraction of rows whose argmax agrees, "n": rows,
    "opset": int}``.
    """
    onnx, ort = _require("onnx", "onnxruntime")
    proto = onnx.load(str(path), load_external_data=False)
    opset = {o.domain: o.version for o in proto.opset_import}.get("", -1)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.detach().cpu().numpy()})[0])
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            want = model(x).detach().cpu()
    finally:
        model.train(was_training)
    if got.shape != want.shape:
        raise ExportError(f"check_onnx: ONNX output {tuple(got.shape)} vs torch output {tuple(want.shape)}")
    n = int(want.shape[0])
    same = (got.argmax(-1) == want.argmax(-1)).float().mean().item() if n else 1.0
    return {"max_abs_diff": float((got - want).abs().max()) if n else 0.0,
            "same_predictions": float(same), "n": n, "opset": int(opset)}
