"""edgetrain's Python runtime (torch, safetensors and xxhash only): aten op calls, optimizers, ledger, page store,
executor, plan loader."""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import ModuleType

from .executor import PlanError, Runtime
from .integrity import IntegrityError, WeightsError, verify_folder
from .ledger import Ledger, LedgerError
from .optim import OPTIMIZERS, Optimizer
from .storage import FileStore, PageStoreError
from .threads import PLAN_THREADS

__all__ = ["Ledger", "LedgerError", "FileStore", "PageStoreError", "PlanError", "Runtime", "OPTIMIZERS", "Optimizer",
           "load_plan", "runtime_for", "IntegrityError", "WeightsError", "verify_folder"]

PLAN_KEYS = ("weights", "optimizer", "seed")


def load_plan(plan_dir) -> ModuleType:
    """Import `<plan_dir>/plan.py`; it must define a dict `PLAN` (weights, optimizer, seed) and `train_step(rt)`,
    or `train(splits, workdir, epochs)` for a local-learning plan (`PLAN["mode"] == "local"`)."""
    plan_dir = Path(plan_dir)
    path = plan_dir / "plan.py"
    if not path.is_file():
        raise FileNotFoundError(f"no plan.py in {plan_dir}")
    # plan.py is code: it runs only if every generated file is the one compile wrote.
    outputs = verify_folder(plan_dir) if (plan_dir / "schedule.json").exists() else None
    tag = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"edgetrain_plan_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plan = getattr(module, "PLAN", None)
    if not isinstance(plan, dict):
        raise PlanError(f"{path}: defines no PLAN dict")
    entry = "train" if plan.get("mode") == "local" else "train_step"
    if not callable(getattr(module, entry, None)):
        raise PlanError(f"{path}: defines no {entry}()")
    missing = [k for k in PLAN_KEYS if k not in plan]
    if missing:
        raise PlanError(f"{path}: PLAN lacks {', '.join(missing)}")
    module.PLAN_DIR = plan_dir
    module.OUTPUTS = outputs
    return module


def runtime_for(plan: ModuleType, storage_dir=None, device=None) -> Runtime:
    """A Runtime set up as a loaded plan says: weights relative to the plan's folder, its optimizer, seed,
    thread count (1 for a plan from before plans named one) and memory format."""
    p, plan_dir = plan.PLAN, Path(plan.PLAN_DIR)
    opt = p["optimizer"]
    outputs = getattr(plan, "OUTPUTS", None)
    return Runtime(plan_dir / p["weights"], storage_dir if storage_dir is not None else plan_dir / "pages",
                   device=device, optimizer=opt, trainable=p.get("trainable"), seed=p["seed"],
                   expected_tensors=outputs["tensors"] if outputs else None, threads=p.get("threads", PLAN_THREADS),
                   streamed=p.get("streamed"), memory_format=p.get("memory_format"))


from .device_api import Trainer  # noqa: E402  (it builds on load_plan and runtime_for above)

__all__.append("Trainer")
