"""`edgetrain run`: execute a compiled plan with the Python runtime, and check it against autograd."""
from __future__ import annotations

import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from edgetrain.codegen.python_q8 import PREFIX_FLOATS
from edgetrain.runtime.python.device_api import Trainer, state_path
from edgetrain.runtime.python.fused_kernels import FUSED_ATOL, FUSED_RTOL, FUSED_OP
from edgetrain.runtime.python.integrity import verify_folder
from edgetrain.runtime.python.threads import pinned_threads

from edgetrain.compiler.schedule_file import format as schedule_format
from .data import fashion_mnist_batches, random_batches
from edgetrain.compiler.scheduling.steps import Step
from edgetrain.compiler.errors import EdgetrainError
from edgetrain.compiler.graph.ir import TrainingGraph
from .check_rules import ROUNDING_FACTOR, NearBounds, TensorCheck, against_float64, plain
from .reference import check_draws, train_reference
from .evaluate import Evaluator
from .int8_check import Int8Reference, boundary_mismatches, has_int8_prefix
from .run_data import (HOLDOUT, NAMED, check_trainable, dataset_batches, epochs_to_steps, held_out, open_source,
                       steps_per_epoch)
from edgetrain.compiler.scheduling.validator import validate

RTOL, ATOL = 1e-5, 1e-6
DATA_SOURCES = NAMED  # by name; also a .npz/.safetensors file or an image folder


def _target(body: dict):
    from edgetrain.targets import Target

    return Target(**body["target"])


def schedule_batches(body: dict, data: str, steps: int, seed: int) -> list:
    shape = body["graph"]["input_shape"]
    if data == "random":
        labels = next(x for x in body["graph"]["nodes"] if x["kind"] == "labels")
        if labels["dtype"].startswith("float"):  # regression targets
            g = torch.Generator().manual_seed(seed)
            return [(torch.randn(*shape, generator=g), torch.randn(*labels["shape"], generator=g)) for _ in range(steps)]
        classes = body["model"]["num_classes"]  # the model's output's, recorded at compile
        return list(random_batches(tuple(shape[1:]), classes, shape[0], steps, seed,
                                   input_high=body["graph"].get("input_high"), label_shape=tuple(labels["shape"][1:])))
    if body["graph"].get("input_dtype", "float32") != "float32":
        raise EdgetrainError(f"--data {data} holds images; this model takes token ids: use --data random")
    if data == "fashion-mnist":
        return list(fashion_mnist_batches(tuple(shape[1:]), shape[0], steps, seed))
    raise EdgetrainError(f"unknown data {data!r}; choose one of {', '.join(DATA_SOURCES)}")


class _EpochWatch:
    """What a user watches as training goes: as each epoch of a dataset ends (and at the last step), its mean
    loss and the held-out loss and accuracy, handed to `on_epoch` and appended to the metrics file."""

    def __init__(self, trainer, ds, eval_ds, body, steps_total, device, save, resume, on_epoch, int8=None) -> None:
        self.trainer, self.ds, self.on_epoch, self.steps_total = trainer, ds, on_epoch, steps_total
        self.per = steps_per_epoch(ds, body["graph"]["input_shape"][0]) if ds is not None else None
        self.eval_ds = eval_ds
        self.evaluator = Evaluator(body, device, int8) if eval_ds is not None else None
        self.path = metrics_path(save) if save and ds is not None else None
        self.mode = "a" if resume else "w"
        self.records: list[dict] = []
        self._file, self._since, self._t0 = None, 0, time.perf_counter()

    def __enter__(self):
        if self.path is not None:
            self._file = open(self.path, self.mode)
        return self

    def __exit__(self, *exc) -> None:
        if self._file is not None:
            self._file.close()

    def stepped(self, last: bool) -> None:
        self._since += 1
        done = self.trainer.steps_done
        if self.per is None or not (done % self.per == 0 or last):
            return
        losses = self.trainer.rt.losses[-self._since:]
        rec = {"epoch": round(done / self.per, 3), "epochs": round(self.steps_total / self.per, 3), "step": done,
               "loss": sum(losses) / len(losses), "wall_s": time.perf_counter() - self._t0,
               "eval_loss": None, "eval_accuracy": None, "eval_examples": 0}
        if self.evaluator is not None:
            rec.update(self.evaluator.evaluate(self.trainer.state_dict(), self.eval_ds))
        self._since = 0
        self.records.append(rec)
        if self._file is not None:
            self._file.write(json.dumps(rec) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        if self.on_epoch:
            self.on_epoch(rec)


def epoch_line(rec: dict) -> str:
    """One line a user reads as an epoch ends."""
    line = f"epoch {rec['epoch']:g}/{rec['epochs']:g} (step {rec['step']}): loss {rec['loss']:.4f}"
    if rec["eval_loss"] is not None:
        line += f", held-out loss {rec['eval_loss']:.4f}"
        if rec["eval_accuracy"] is not None:
            line += f", accuracy {rec['eval_accuracy']:.1f}%"
        line += f" ({rec['eval_examples']} examples)"
    return line + f", {rec['wall_s']:.1f} s"


def _device(device: str | None):
    if not device:
        return None
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise EdgetrainError(f"unknown device {device!r}; use cpu or cuda (cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EdgetrainError(f"device {device!r} asked for, but this torch has no usable CUDA device; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise EdgetrainError(f"device {device!r} is not supported; use cpu or cuda")
    return dev


def _same_kernels(check: bool, device: torch.device):
    """Where a checked run trains the plan and its reference on the same kernels: on CUDA with cuDNN off. Eager
    batch norm takes cuDNN's kernel there, the joint graph holds torch's native one (MobileNetV2 at batch 8, which
    amplifies the difference, had its loss 2% from eager's after three steps); with cuDNN off both sides run
    torch's own kernels and agree bit for bit. A run without --check keeps cuDNN."""
    if check and device.type == "cuda":
        return torch.backends.cudnn.flags(enabled=False)
    return nullcontext()


def tolerance(model) -> tuple[float, float]:
    """(rtol, atol) of the check. float32: RTOL and ATOL. A model with half-precision tensors (bf16, fp16) is held
    to its coarsest dtype's machine epsilon instead: torch's own joint graph (aot_autograd's decompositions) already
    differs from eager autograd in the last float32 bits, and a half-precision activation rounds such a difference
    to a whole unit of its last place (a bf16 Llama's LoRA gradients differ from eager's by ~5e-4 before any plan
    runs)."""
    eps = [torch.finfo(t.dtype).eps for t in (*model.parameters(), *model.buffers())
           if t.is_floating_point() and t.dtype in (torch.bfloat16, torch.float16)]
    return (max(eps), max(eps)) if eps else (RTOL, ATOL)


def fused_kernels_in(body: dict) -> int:
    """How many of a schedule's nodes run as fused kernels (`--fuse`): their plan is checked within
    FUSED_RTOL, not bit for bit."""
    return sum(n["op"] == FUSED_OP for n in body["graph"]["nodes"])


def check_tolerance(model, body: dict) -> tuple[float, float]:
    """(rtol, atol) of a plan's check: the model's (`tolerance`), widened to FUSED_RTOL, FUSED_ATOL where the plan
    runs fused kernels (inductor's arithmetic is not eager's to the bit) or holds its convolution weights
    channels-last (oneDNN's sums run in another order than the reference's)."""
    rtol, atol = tolerance(model)
    if fused_kernels_in(body) or body["graph"].get("memory_format", "contiguous") != "contiguous":
        return max(rtol, FUSED_RTOL), max(atol, FUSED_ATOL)
    return rtol, atol


def _compare(model, rt, body: dict, integers=None) -> tuple[float, float, list[str]]:
    """`integers`: an int8 prefix's parameters (name -> the integers conv_integers derives from the float model's),
    which the plan holds in place of the model's floats: each equal to them, element for element."""
    max_abs = max_rel = 0.0
    integers = integers or {}
    bad = [f"param {k}" for k, v in integers.items()  # a streamed one from its file
           if not torch.equal((rt.params[k] if k in rt.params else rt.streamed_copy(k)).cpu(), torch.from_numpy(v))]
    rtol, atol = check_tolerance(model, body)
    ours = {**{f"param {k}": v for k, v in rt.params.items()}, **{f"buffer {k}": v for k, v in rt.buffers.items()}}
    theirs = {**{f"param {k}": v for k, v in model.named_parameters() if k not in integers},
              **{f"buffer {k}": v for k, v in model.named_buffers()}}
    for k, ref in theirs.items():
        mine = ours[k] if k in ours else rt.streamed_copy(k.removeprefix("param "))  # a streamed weight: from its file
        a, b = mine.detach().to("cpu"), ref.detach().to("cpu")
        if a.dtype != b.dtype or not a.is_floating_point():
            if not torch.equal(a, b):
                bad.append(k)
            continue
        a, b = a.double(), b.double()
        diff = (a - b).abs()
        max_abs = max(max_abs, float(diff.max()) if diff.numel() else 0.0)
        rel = diff / b.abs().clamp_min(atol)
        max_rel = max(max_rel, float(rel.max()) if rel.numel() else 0.0)
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            bad.append(k)
    return max_abs, max_rel, bad


def _stream(body: dict, data: str, start: int, count: int, seed: int, ds) -> list:
    """Batches for global steps start .. start+count-1 (a resumed run continues the same stream)."""
    if ds is None:  # random: the seeded stream from its beginning, the steps already done skipped
        return schedule_batches(body, "random", start + count, seed)[start:]
    return dataset_batches(ds, body["graph"]["input_shape"][0], start, count, seed)


def metrics_path(save: str) -> Path:
    """Where a run saving to `save` writes its per-epoch lines: trained.safetensors -> trained.metrics.jsonl."""
    p = Path(save)
    return p.with_name(p.name.removesuffix(".safetensors") + ".metrics.jsonl")


def _split(data: str, ds, eval_data: str | None, holdout: float | None, body: dict, seed: int):
    """(training set, held-out set or None): --eval-data, else a seeded --holdout share of the data."""
    if ds is None:
        if eval_data or holdout:
            raise EdgetrainError("--eval-data and --holdout measure training on a dataset: give --data too")
        return None, None
    if eval_data:
        if holdout:
            raise EdgetrainError("--eval-data is the held-out set; drop --holdout")
        if eval_data == "random":
            raise EdgetrainError("--eval-data random measures nothing: give a dataset, a file or a folder")
        return ds, open_source(eval_data, body)
    share = HOLDOUT if holdout is None else holdout
    return held_out(ds, share, seed) if share > 0 else (ds, None)


def run_plan(out_dir: str, *, steps: int | None = 1, data: str = "random", check: bool = False, seed: int = 1,
             device: str | None = None, progress=None, epochs: int | None = None, save: str | None = None,
             resume: bool = False, save_every: int | None = None, save_trained: bool = False,
             eval_data: str | None = None, holdout: float | None = None, on_epoch=None) -> dict:
    """Train `steps` (or `epochs`) in all; with `resume`, the steps `save` already holds count towards them,
    so rerunning the same command after a kill finishes the run exactly as if it had never stopped.

    On a dataset, `holdout` (default 0.1; 0: none) of it is kept out of training, or `eval_data` is; as each
    epoch ends, its mean loss and the held-out loss and accuracy go to `on_epoch(record)`, to the result's
    `epochs`, and with `save` to `metrics_path(save)` (JSON lines, appended by a resumed run)."""
    body = schedule_format.load(out_dir)
    if body["mode"] == "local":
        raise EdgetrainError(f"{out_dir} is a local-learning plan: use `edgetrain train {out_dir} --data ...` "
                             "(`run` trains backprop plans)")
    verify_folder(out_dir)  # every generated file as compiled, before plan.py is imported
    graph = TrainingGraph.from_json(body["graph"])
    # The schedule is replayed once more before it runs: a plan that could exceed its budget never runs.
    report = validate(graph, [Step(**s) for s in body["steps"]], _target(body), body["budget"]["bytes"])
    if resume and not save:
        raise EdgetrainError("--resume continues the state an earlier --save wrote: give --save FILE too")
    if save_trained and not save:
        raise EdgetrainError("--save-trained chooses what --save writes: give --save FILE too")
    if save_every and not save:
        raise EdgetrainError("--save-every writes the --save file: give --save FILE too")
    if resume and check:
        raise EdgetrainError("--check trains autograd from the compiled weights; it cannot follow --resume")
    if check:
        check_draws(body)  # a random op no eager run can draw: refused before any step
    ds = open_source(data, body)  # None for random data
    batch = body["graph"]["input_shape"][0]
    ds, eval_ds = _split(data, ds, eval_data, holdout, body, seed)
    if ds is not None:
        check_trainable(ds, batch)
    if epochs is not None:
        steps = epochs_to_steps(ds, batch, epochs)
    steps = 1 if steps is None else steps
    int8 = None
    if has_int8_prefix(body):  # its int8 ops compute with numpy (runtime/python/q8_ops.py)
        if device and device.split(":")[0] != "cpu":
            raise EdgetrainError(f"--device {device}: this plan's int8 prefix runs with numpy on the CPU; run it "
                                 "with --device cpu (or leave --device out)")
        device = "cpu"
        # the integer reference, from the prefix's float parameters as the model had them: the check's, and the
        # held-out evaluation's prefix
        int8 = Int8Reference(body, os.path.join(out_dir, PREFIX_FLOATS))
    dev = _device(device)
    resume_from = save if resume and state_path(save).exists() else None
    # The runtime pins a CPU plan's steps to the plan's thread count (its kernel scratch was counted for it).
    with Trainer(out_dir, device=dev, resume=resume_from) as trainer:
        if trainer.plan.PLAN.get("schedule_content") != schedule_format.content_hash(body):
            raise EdgetrainError(f"{out_dir}/plan.py was generated from another schedule; recompile the model")
        if save:
            trainer.claim_save(save)  # its name, its folder and one writer, before any training
        rt = trainer.rt
        if check and int8 is not None:  # the boundary tensors as the plan's step makes them, for the check
            rt.observe = frozenset(n.name for n in int8.boundary)
        start = trainer.steps_done
        batches = _stream(body, data, start, max(0, steps - start), seed, ds)
        same_kernels = _same_kernels(check, rt.device)
        watch = _EpochWatch(trainer, ds, eval_ds, body, steps, rt.device, save, resume, on_epoch, int8)
        t0 = time.perf_counter()
        with same_kernels, watch:
            for k, (x, y) in enumerate(batches):
                trainer.step(x, y)
                if save_every and trainer.steps_done % save_every == 0 and k + 1 < len(batches):
                    trainer.save(save, trained_only=save_trained)  # a checkpoint a killed run resumes from
                watch.stepped(k + 1 == len(batches))
                if progress:
                    progress(k + 1, len(batches))
        wall = time.perf_counter() - t0
        saved = [str(p) for p in trainer.save(save, trained_only=save_trained)] if save else None
    result = {
        "ok": True, "steps": len(batches), "first_step": start, "steps_total": steps, "data": data, "device": str(rt.device),
        "losses": rt.losses, "saved": saved, "resumed_from": str(resume_from) if resume_from else None,
        "budget_bytes": body["budget"]["bytes"], "predicted_peak_bytes": report.peak_bytes,
        "measured_peak_bytes": rt.ledger.peak_bytes, "cuda_max_memory_allocated": rt.cuda_max_memory_allocated,
        "paged_bytes": rt.paged_bytes, "view_copied_bytes": rt.view_copied_bytes, "wall_s": wall,
        "checked": check, "max_abs_err": None, "max_rel_err": None,
        "cudnn": None if rt.device.type != "cuda" else not check,  # on CUDA: whether cuDNN's kernels ran
        "epochs": watch.records, "eval_data": eval_ds.name if eval_ds is not None else None,
        "metrics": str(watch.path) if watch.path else None,
    }
    if rt.ledger.peak_bytes > body["budget"]["bytes"]:
        result["ok"] = False
        result["error_kind"] = "BudgetExceeded"
        result["error"] = f"measured peak {rt.ledger.peak_bytes} B exceeds the budget {body['budget']['bytes']} B"
    if check and int8 is not None and batches:  # the int8 prefix first: bit for bit, or the head's check means nothing
        ours = np.concatenate([rt.observed[n.name].reshape(-1).numpy() for n in int8.boundary])
        bad_bits = boundary_mismatches(ours, int8.flat(batches[-1][0]))
        result.update(int8_boundary_floats=int(ours.size), int8_boundary_mismatches=bad_bits)
        if bad_bits:
            result.update(ok=False, error_kind="CheckMismatch", error=(
                f"the plan's int8 prefix differs from the Python integer reference in {bad_bits} of its {ours.size} "
                "boundary values on the last batch (bit for bit expected)"))
            return result
    if check:
        # an int8 prefix: the model's own float weights, its head fed the integer reference's boundary
        prefix = {} if int8 is None else {"feed": int8.feed, "floats": os.path.join(out_dir, PREFIX_FLOATS)}

        def reference(**kw):
            """The same steps by autograd, on the plan's thread count (oneDNN's sums then run in its order)."""
            threads = pinned_threads(rt.threads) if rt.threads is not None else nullcontext()
            with threads, _same_kernels(check, rt.device):
                return train_reference(body, os.path.join(out_dir, "weights.safetensors"), batches, rt.device,
                                       **prefix, **kw)
        model, ref_losses = reference()
        max_abs, max_rel, bad = _compare(model, rt, body, int8.values if int8 is not None else None)
        rtol, atol = check_tolerance(model, body)
        held = []
        if bad and not_bitwise(body):  # float32 rounding, or a wrong kernel? A float64 run of the same steps says
            model64, _ = reference(dtype=torch.float64)
            held = _held_to_float64(bad, model, model64, rt)
            bad = [c.name for c in held if c.rule == "failed"]
        result.update(max_abs_err=max_abs, max_rel_err=max_rel, check_rtol=rtol, check_atol=atol,
                      fused_kernels=fused_kernels_in(body),
                      memory_format=body["graph"].get("memory_format", "contiguous"),
                      reference_losses=ref_losses, mismatched=bad[:20])
        if held:
            result.update(check_rounding_factor=ROUNDING_FACTOR, check_tensors=[c.to_json() for c in held])
        if bad:
            near = NearBounds()  # rounding that decides a ReLU mask? The same steps again, watching its inputs
            reference(watch=near)
            result["ok"] = False
            result["error_kind"] = "CheckMismatch"
            result["near_bound_relu_inputs"] = dict(near.counts)
            beyond = f" and from a float64 run by more than {ROUNDING_FACTOR:g}x eager float32's error" if held else ""
            result["error"] = (f"{len(bad)} tensors differ from autograd beyond rtol={rtol:g}, atol={atol:g}{beyond}: "
                               f"{', '.join(bad[:5])}{near.describe()}")
    return result


def not_bitwise(body: dict) -> bool:
    """Whether a plan's arithmetic is not eager's to the bit: fused kernels, or convolution weights channels-last."""
    return bool(fused_kernels_in(body)) or body["graph"].get("memory_format", "contiguous") != "contiguous"


def _held_to_float64(bad: list[str], model, model64, rt) -> list[TensorCheck]:
    """The tensors (`bad`: "param k" / "buffer k") that missed the tolerance, held to float64 as a firmware's are
    (check_rules.py): each passes when the plan is no further from float64 than eager float32, within
    ROUNDING_FACTOR. A non-floating tensor stays failed."""
    eager = {f"param {k}": v for k, v in model.named_parameters()} | {f"buffer {k}": v for k, v in model.named_buffers()}
    eager64 = {f"param {k}": v for k, v in model64.named_parameters()} | \
        {f"buffer {k}": v for k, v in model64.named_buffers()}
    ours = {**{f"param {k}": v for k, v in rt.params.items()}, **{f"buffer {k}": v for k, v in rt.buffers.items()}}
    out = []
    for k in bad:
        if k not in eager or k not in ours or not eager[k].is_floating_point():
            out.append(TensorCheck(k, "failed", 0.0, 0.0))
            continue
        a, b = ours[k].detach().cpu(), eager[k].detach().cpu()
        missed = plain(k, a.double(), b.double())
        out.append(against_float64(missed, a, b, eager64[k].detach().cpu().double()))
    return out
