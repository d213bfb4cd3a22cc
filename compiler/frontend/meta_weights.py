"""Frozen weights on torch's meta device, their values in safetensors files the model names.

A model too large to build in the compiling machine's memory (LLaMA-2-7B's 13.5 GB of bf16 weights) is built on
the meta device (shapes and dtypes, no data: `with torch.device("meta")`), its trainable parameters (LoRA
adapters) real. The trace needs shapes only (capture.on_fakes), and the plan's weights file is written one
tensor at a time from the source (codegen/python_plan.write_weights), so the whole model is never held.
The model names its source in the attribute `weights_source`: a safetensors file, a list of them (a shard
set) or a folder of them, whose keys are the model's parameter and buffer names as named_parameters() and
named_buffers() give them.
"""
from __future__ import annotations

import glob
import os

import torch
import torch.nn as nn

from edgetrain.compiler.errors import UnsupportedModelError
from edgetrain.runtime.python.streamed_weights import DTYPES

ATTR = "weights_source"


def meta_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors on the meta device: `param/<name>` and `buffer/<name>` -> the tensor."""
    out = {f"param/{k}": p for k, p in model.named_parameters() if p.is_meta}
    out.update({f"buffer/{k}": b for k, b in model.named_buffers() if b.is_meta})
    return out


def source_files(model: nn.Module) -> list[str]:
    """The safetensors files the model names as its weights' source (none: [])."""
    src = getattr(model, ATTR, None)
    if src is None:
        return []
    paths = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    files = []
    for p in map(str, paths):
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "*.safetensors")))
            if not found:
                raise UnsupportedModelError(f"the model's {ATTR} folder {p!r} holds no .safetensors file")
            files += found
        elif not os.path.isfile(p):
            raise UnsupportedModelError(f"the model's {ATTR} {p!r} does not exist: point it at the safetensors "
                                        "file (or shard folder) holding its weights")
        else:
            files.append(p)
    return files


class WeightSource:
    """Key -> file for every tensor of a source's files; `get(name)` reads one tensor (and only it)."""

    def __init__(self, files: list[str]) -> None:
        from safetensors import safe_open

        self.files, self.where, self.meta = files, {}, {}
        for f in files:
            try:
                with safe_open(f, framework="pt") as h:
                    for k in h.keys():
                        s = h.get_slice(k)
                        self.where.setdefault(k, f)
                        self.meta.setdefault(k, (s.get_dtype(), tuple(s.get_shape())))
            except Exception as e:
                raise UnsupportedModelError(f"the model's {ATTR} {f!r} is not a readable safetensors file "
                                            f"({type(e).__name__}: {str(e)[:200]})") from None

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(self.where[name], framework="pt") as h:
            return h.get_tensor(name)


_ST = {v: k for k, v in DTYPES.items()}  # torch dtype -> the safetensors header's name for it


def check_meta_weights(model: nn.Module) -> WeightSource | None:
    """The source of the model's meta tensors, every one checked there (name, shape, dtype) before any trace;
    None when the model has none. A trainable meta parameter, or a meta tensor with no source, is refused."""
    metas = meta_tensors(model)
    if not metas:
        return None
    trained = [k for k, t in metas.items() if t.requires_grad]
    if trained:
        raise UnsupportedModelError(f"the trainable parameter '{trained[0].split('/', 1)[1]}' is on the meta device "
                                    "(no values to train from): build the trainable parameters (the adapters) with "
                                    "real values; only frozen weights may be meta")
    files = source_files(model)
    first = next(iter(metas))
    if not files:
        t = metas[first]
        raise UnsupportedModelError(
            f"{len(metas)} of the model's tensors are on the meta device with no values (first: "
            f"'{first.split('/', 1)[1]}', shape {list(t.shape)}): set model.{ATTR} to the safetensors file (or a "
            "list or folder of shards) that holds them, keyed by the model's own parameter and buffer names, "
            "or build the model with real weights")
    src = WeightSource(files)
    for key, t in metas.items():
        name = key.split("/", 1)[1]
        if name not in src.meta:
            raise UnsupportedModelError(f"the model's {ATTR} ({', '.join(files)}) has no tensor '{name}' for its "
                                        f"meta {key.split('/')[0]}: its keys must be the model's own names")
        dtype, shape = src.meta[name]
        if shape != tuple(t.shape) or dtype != _ST.get(t.dtype):
            raise UnsupportedModelError(f"the model's {ATTR} holds '{name}' as {dtype} {list(shape)}, the model "
                                        f"has it as {_ST.get(t.dtype, t.dtype)} {list(t.shape)}: give the source "
                                        "that matches the model's configuration")
    return src
