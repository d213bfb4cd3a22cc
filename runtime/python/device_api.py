"""The device program's API: load a compiled folder, train step by step, save what was trained, resume.

    from edgetrain.runtime.python.device_api import Trainer

    trainer = Trainer("build/example", device="cpu")     # checks every file, then loads plan and weights
    loss = trainer.step(x, y)                            # one scheduled step, every check of checks.py
    trainer.save("trained.safetensors")                  # state_dict keys; the training state beside
    trainer = Trainer("build/example", resume="trained.safetensors")   # continues exactly where it stopped

`save` writes the trained tensors under the keys of the model's own `state_dict()`, so
`model.load_state_dict(safetensors.torch.load_file(path))` takes them back, and beside them
(`<stem>.state.safetensors`) the training state `resume` reads alone to continue bit-identically: the
weights again, the optimizer state, the step count and a checksum. Each file is written atomically
(temporary file, fsync, rename), the state first. Torch and safetensors only.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from . import load_plan, runtime_for
from .checks import NonFiniteError, checked_step, first_non_finite
from .run_dirs import remove_stale_pages

OPTIMIZER_SUFFIX = ".state.safetensors"
_META_PLAN, _META_STEP, _META_SUM = "edgetrain.schedule_content", "edgetrain.step", "edgetrain.sha256"


class ResumeError(ValueError):
    """A saved state cannot continue this plan: another plan's, missing or corrupt."""


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].detach().to("cpu").contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return "sha256:" + h.hexdigest()


def state_path(weights_path: str | os.PathLike) -> Path:
    """Where `save` puts the training state of `weights_path` (model.safetensors -> model.state.safetensors)."""
    p = Path(weights_path)
    stem = p.name[: -len(".safetensors")] if p.name.endswith(".safetensors") else p.name
    return p.with_name(stem + OPTIMIZER_SUFFIX)


def _atomic_save(tensors: dict, path: Path, metadata: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k).clone() for k in f.keys()}, dict(f.metadata() or {})
    except FileNotFoundError:
        raise ResumeError(f"{path} is missing: --resume needs the file an earlier --save wrote") from None
    except Exception as e:  # safetensors' own error types for a damaged header
        raise ResumeError(f"{path} is corrupt or not a safetensors file ({e})") from None


class Trainer:
    """A compiled plan ready to train: `step(x, y)` -> loss, `save(path)`, `state_dict()`."""

    def __init__(self, plan_dir: str | os.PathLike, *, device=None, resume: str | os.PathLike | None = None,
                 check_peak: bool = True) -> None:
        self.plan_dir = Path(plan_dir)
        self.plan = load_plan(self.plan_dir)  # refuses a folder whose files differ from what compile wrote
        if self.plan.PLAN.get("mode") == "local":
            raise ValueError(f"{self.plan_dir} is a local-learning plan: train it with the plan's train() "
                             "(`edgetrain train`), not step by step")
        remove_stale_pages(self.plan_dir)
        try:
            self._pages = tempfile.mkdtemp(prefix=f"pages-{os.getpid()}-", dir=self.plan_dir)
        except OSError:  # a read-only plan folder: the pages go to the system's temporary folder
            self._pages = tempfile.mkdtemp(prefix="edgetrain-pages-")
        self.rt = runtime_for(self.plan, storage_dir=self._pages, device=device)
        self.check_peak = check_peak
        if resume is not None:
            self._resume(Path(resume))
        self._save_lock = None
        # Buffers may hold -inf on purpose (attention masks): only those finite now must stay finite.
        self._finite_buffers = [k for k, b in self.rt.buffers.items() if first_non_finite({k: b}) is None]
        bad = first_non_finite(self.rt.params)
        if bad is not None:  # cheap, and it names the cause instead of a NaN loss one step later
            source = resume if resume is not None else self.plan_dir / self.plan.PLAN["weights"]
            raise NonFiniteError(f"'{bad}' in {source} holds NaN or infinite values before any training "
                                 "step; these weights cannot train")

    # -- training -------------------------------------------------------------------------------------
    @property
    def steps_done(self) -> int:
        return self.rt.step

    @property
    def input_shape(self) -> list[int]:
        return list(self.plan.PLAN["input_shape"])

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One training step on a batch of exactly the compiled shape; returns its loss."""
        if list(x.shape) != self.input_shape:
            raise ValueError(f"a batch of shape {list(x.shape)}; the plan was compiled for {self.input_shape}")
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise NonFiniteError(f"step {self.rt.step}: the batch's inputs hold NaN or infinite values; training "
                                 "stopped (clean the data)")
        self._check_labels(y)
        return checked_step(self.plan, self.rt, x, y, check_peak_bytes=self.check_peak)

    def _check_labels(self, y: torch.Tensor) -> None:
        """Labels of the compiled shape and, for class ids, inside the classes the model's output scores (an id
        outside them would stop torch's loss kernel with an index error, or read past the logits)."""
        shape, classes = self.plan.PLAN.get("labels_shape"), self.plan.PLAN.get("num_classes")
        if shape is not None and list(y.shape) != list(shape):
            raise ValueError(f"labels of shape {list(y.shape)}; the plan was compiled for {list(shape)}")
        if classes is None or shape is None:  # regression targets, or a plan from before plans named them
            return
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ValueError(f"labels of dtype {y.dtype}; this plan takes integer class ids 0..{classes - 1}")
        bad = y >= classes
        if self.plan.PLAN.get("loss") != "model":  # a model's own loss reads negative ids its way (HF: -100)
            bad |= y < 0
        if bool(bad.any()):
            k = int(bad.reshape(-1).nonzero()[0])
            raise ValueError(f"step {self.rt.step}: label {int(y.reshape(-1)[k])} is outside 0..{classes - 1} "
                             f"(the model's output scores {classes} classes); relabel the data or compile a model "
                             "with more outputs")

    def close(self) -> None:
        """Remove this trainer's page store (its pages are only needed inside a step); release a claimed save."""
        import shutil

        shutil.rmtree(self._pages, ignore_errors=True)
        if self._save_lock is not None:
            self._save_lock.release()
            self._save_lock = None

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- saving and resuming --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained parameters and buffers under the model's own `state_dict()` keys (on the CPU)."""
        out = {k: v.detach().to("cpu").contiguous().clone() for k, v in self.rt.params.items()}
        out.update({k: v.detach().to("cpu").contiguous().clone() for k, v in self.rt.buffers.items()})
        return out

    def _optimizer_tensors(self) -> dict[str, torch.Tensor]:
        """The live optimizer state: `optim/<param>/<state>` (momentum, exp_avg, exp_avg_sq, step)."""
        return {f"optim/{p}/{s}": t for p, st in self.rt.optim.state.items() for s, t in st.items()}

    def optimizer_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu").contiguous().clone() for k, v in self._optimizer_tensors().items()}

    def training_state(self) -> dict[str, torch.Tensor]:
        """Everything `resume` needs in one file: the weights (`model/<key>`) and the optimizer state."""
        return {**{f"model/{k}": v for k, v in self.state_dict().items()}, **self.optimizer_state()}

    def trained_state_dict(self) -> dict[str, torch.Tensor]:
        """Only the parameters the plan trains (a LoRA model's adapters), under the model's own keys: what
        `model.load_state_dict(sd, strict=False)` or peft's `set_peft_model_state_dict` takes back."""
        return {k: v for k, v in self.state_dict().items() if k in set(self.rt.trainable)}

    def plan_files(self) -> set[Path]:
        """The compiled folder's own files (resolved), which no save may replace."""
        outputs = getattr(self.plan, "OUTPUTS", None)
        names = list(outputs["files"]) if outputs else ["plan.py", self.plan.PLAN["weights"]]
        return {(self.plan_dir / n).resolve() for n in [*names, "schedule.json"]}

    def claim_save(self, path: str | os.PathLike) -> None:
        """Check a save path before training (a .safetensors name, none of the plan's files, a writable folder)
        and hold it against other runs until `close()` (save_target.py)."""
        from .save_target import claim

        if self._save_lock is None:
            self._save_lock = claim(path, state_path(path), self.plan_files())

    def save(self, path: str | os.PathLike, trained_only: bool = False) -> tuple[Path, Path]:
        """Write the weights to `path` (`trained_only`: the trained parameters alone) and the training state
        beside it; returns both paths.

        The state file alone is what `resume` reads (weights, optimizer state, step, a checksum), and it is
        written first: a save killed between the two files leaves a state that resumes correctly. Weights that
        are no longer finite are never written: the last good save stays as it was."""
        from .save_target import check_name

        path = Path(path)
        check_name(path, state_path(path), self.plan_files())
        bad = first_non_finite(self.rt.params) or first_non_finite(
            {k: self.rt.buffers[k] for k in self._finite_buffers})
        if bad is not None:
            raise NonFiniteError(f"step {self.rt.step}: '{bad}' holds NaN or infinite values; {path} was not "
                                 "written (it keeps the last finite save). Lower the learning rate or check the "
                                 "data")
        meta = {_META_PLAN: str(self.plan.PLAN["schedule_content"]), _META_STEP: str(self.rt.step)}
        state = self.training_state()
        opt = state_path(path)
        _atomic_save(state, opt, dict(meta, **{_META_SUM: tensors_sha256(state)}))
        _atomic_save(self.trained_state_dict() if trained_only else self.state_dict(), path, meta)
        return path, opt

    def _resume(self, path: Path) -> None:
        opt_file = state_path(path)
        state, meta = _read(opt_file)
        if meta.get(_META_SUM) != tensors_sha256(state):
            raise ResumeError(f"{opt_file} is corrupt (its checksum does not match its tensors); resume from "
                              "another save or start over without --resume")
        if meta.get(_META_PLAN) != str(self.plan.PLAN["schedule_content"]):
            raise ResumeError(f"{opt_file} was saved by another compiled plan; resume with the folder it was "
                              "trained from (or start over without --resume)")
        live = {**{f"model/{k}": t for k, t in {**self.rt.params, **self.rt.buffers}.items()},
                **self._optimizer_tensors()}
        self._copy_into(state, live, opt_file)
        self.rt.step = int(meta[_META_STEP])

    @staticmethod
    def _copy_into(saved: dict[str, torch.Tensor], live: dict[str, torch.Tensor], source: Path) -> None:
        if set(saved) != set(live):
            diff = sorted(set(saved) ^ set(live))
            raise ResumeError(f"{source} does not hold this plan's tensors (e.g. '{diff[0]}')")
        for k, t in live.items():
            if saved[k].shape != t.shape or saved[k].dtype != t.dtype:
                raise ResumeError(f"{source}: '{k}' is {saved[k].dtype}{list(saved[k].shape)}, the plan has "
                                  f"{t.dtype}{list(t.shape)}")
            with torch.no_grad():
                t.copy_(saved[k])
