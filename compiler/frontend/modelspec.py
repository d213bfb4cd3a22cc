"""Resolve a model given as a zoo name, `path/file.py:factory` or `package.module:attr`."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field

import torch.nn as nn

from . import zoo
from edgetrain.compiler.errors import ModelSpecError


@dataclass
class ResolvedModel:
    spec: str
    module: nn.Module
    input_shape: tuple[int, ...] | None  # (C, H, W) without the batch
    num_classes: int | None  # the model's own `num_classes` attribute, which overrides its output's class count
    kwargs: dict = field(default_factory=dict)
    input_dtype: str = "float32"  # "int64": token ids in [0, input_high)
    input_high: int | None = None


def _input_facts(model: nn.Module, obj=None) -> dict:
    """A model's own word on its input (transformers carry input_shape, input_dtype, input_high)."""
    facts = {}
    for key in ("input_shape", "num_classes", "input_dtype", "input_high"):
        v = getattr(model, key, None) or getattr(obj, key, None)
        if v is not None:
            facts[key] = tuple(v) if key == "input_shape" else v
    return facts


def _load_file(path: str):
    if not os.path.isfile(path):
        raise ModelSpecError(f"model file {path!r} does not exist")
    name = "edgetrain_user_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    except Exception as e:
        raise ModelSpecError(f"importing {path!r} failed: {type(e).__name__}: {e}") from None
    return mod


def _check_factory(spec: str, factory, kwargs: dict) -> None:
    """A factory must build the model from no arguments (or the keyword arguments edgetrain passes)."""
    import inspect

    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    missing = [p.name for p in sig.parameters.values()
               if p.default is inspect.Parameter.empty and p.name not in kwargs
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)]
    if missing:
        raise ModelSpecError(f"{spec}: the factory needs argument(s) {', '.join(missing)}; give defaults to them "
                             f"or point at a function that takes none (e.g. def model(): return "
                             f"{getattr(factory, '__name__', 'factory')}(...))")


def resolve(spec: str, **kwargs) -> ResolvedModel:
    if ":" not in spec:
        if spec not in zoo.ZOO:
            raise ModelSpecError(f"unknown model {spec!r}: not a zoo name ({', '.join(sorted(zoo.ZOO))}); "
                                 "give a file as path/file.py:factory or a module as package.module:attr")
        e = zoo.ZOO[spec]
        model = zoo.build(spec, **kwargs)
        # num_classes only from the model itself: the class count is its output's (frontend/labels.py)
        facts = {"input_shape": tuple(e.input_shape), "num_classes": None, **_input_facts(model)}
        return ResolvedModel(spec, model, kwargs=kwargs, **facts)
    where, attr = spec.rsplit(":", 1)
    if where.endswith(".py"):
        mod = _load_file(where)
    else:
        try:
            mod = importlib.import_module(where)
        except ImportError as e:
            raise ModelSpecError(f"cannot import module {where!r}: {e}") from None
    if not hasattr(mod, attr):
        raise ModelSpecError(f"{where!r} has no attribute {attr!r}")
    obj = getattr(mod, attr)
    if callable(obj) and not isinstance(obj, nn.Module):
        _check_factory(spec, obj, kwargs)
        try:
            model = obj(**kwargs)
        except Exception as e:
            raise ModelSpecError(f"{spec}: building the model failed: {type(e).__name__}: {e}") from None
    else:
        model = obj
    if not isinstance(model, nn.Module):
        raise ModelSpecError(f"{spec!r} is neither an nn.Module nor a callable returning one")
    facts = {"input_shape": None, "num_classes": None, **_input_facts(model, obj)}
    return ResolvedModel(spec, model, kwargs=kwargs, **facts)
