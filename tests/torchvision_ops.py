"""torchvision importable beside the CPU torch the project pins.

torchvision's Linux wheels on the package index are built against CUDA torch: beside a CPU torch its compiled ops
(detection boxes, RoI pooling) do not load, and its import then fails registering their meta kernels, which breaks
every import of timm and of transformers (which imports torchvision when it is installed). The models the tests
build use none of those ops, so their registrations are skipped where the library is missing.
"""
from __future__ import annotations

import importlib
import sys
import types

_OP_REGISTRATIONS = ("torchvision._meta_registrations", "torchvision._autograd_registrations")


def import_torchvision_without_ops() -> None:
    """Import torchvision; where its compiled ops cannot load, import it without registering them."""
    try:
        importlib.import_module("torchvision")
        return
    except ModuleNotFoundError:
        return  # not installed: nothing imports it
    except RuntimeError as e:  # `operator torchvision::nms does not exist`
        if "torchvision::" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    for name in _OP_REGISTRATIONS:  # nothing to register for ops that are not there
        sys.modules[name] = types.ModuleType(name)
    importlib.import_module("torchvision")
