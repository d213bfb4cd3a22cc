"""NeuroFlux's Controller/Worker (Algorithm 2): block-wise local learning with a storage cache.

The Controller walks the plan's blocks in order. For each block a Worker trains its layers, each on its own
auxiliary head's loss (the layer's output is detached before the next layer: no gradient crosses layers), at
the block's own batch size (AB-LL), for ``epochs`` epochs, or, with ``patience``, until the best validation
accuracy of the block's heads has not improved for ``patience`` epochs (``epochs`` then caps it). Then one
pass in eval mode measures every head's validation and test accuracy and writes the block's outputs for all
three splits to a memory-mapped :mod:`activation cache <edgetrain.runtime.python.activation_cache>`, which is
the next block's input: trained blocks never run again. ``cache=False`` gives classic local learning (inputs
re-run through the trained layers).

Resume: after every epoch the whole state (weights, BN statistics, SGD momentum) goes to
``state_b{block}_e{epoch}.safetensors`` and then ``progress.json`` (both written atomically) points at it.
A process killed anywhere restarts from the last finished epoch of the current block (an unfinished cache is
rebuilt) and, since each epoch's shuffle is seeded by (seed, block, epoch), ends with the same weights as a
run that was never interrupted.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from . import cuda_memory
from .activation_cache import ActivationCache, CacheWriter
from .integrity import file_sha256
from .local_layers import build
from .local_memory import step_bytes

__all__ = ["Splits", "train_local", "scaled_lr", "PROGRESS"]

PROGRESS = "progress.json"
SPLITS = ("train", "val", "test")


@dataclass
class Splits:
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    def x(self, split: str) -> torch.Tensor:
        return getattr(self, f"{split}_x")

    def y(self, split: str) -> torch.Tensor:
        return getattr(self, f"{split}_y")


class _Tensors:
    def __init__(self, x: torch.Tensor) -> None:
        self.x, self.n = x, len(x)

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return self.x[idx]


class _Rerun:
    """Classic local learning: a batch is re-run through the trained layers before the current block."""

    def __init__(self, base, trunk: list[nn.Module], device) -> None:
        self.base, self.trunk, self.device, self.n = base, trunk, device, base.n

    @torch.no_grad()
    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.base.gather(idx).to(self.device)
        for m in self.trunk:
            x = m.eval()(x)
        return x


def _atomic_json(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _state(layers, heads, opts) -> dict[str, torch.Tensor]:
    out = {}
    for i, (layer, head, opt) in enumerate(zip(layers, heads, opts)):
        for kind, mod in (("layer", layer), ("head", head)):
            for k, v in mod.state_dict().items():
                out[f"{kind}.{i}.{k}"] = v.detach().cpu().contiguous().clone()
            for k, p in mod.named_parameters():
                buf = opt.state.get(p, {}).get("momentum_buffer")
                if buf is not None:
                    out[f"momentum.{kind}.{i}.{k}"] = buf.detach().cpu().contiguous().clone()
    return out


def _load_state(tensors: dict[str, torch.Tensor], layers, heads, opts, device) -> None:
    for i, (layer, head, opt) in enumerate(zip(layers, heads, opts)):
        for kind, mod in (("layer", layer), ("head", head)):
            pre = f"{kind}.{i}."
            mod.load_state_dict({k[len(pre):]: v for k, v in tensors.items() if k.startswith(pre)})
            for k, p in mod.named_parameters():
                buf = tensors.get(f"momentum.{kind}.{i}.{k}")
                if buf is not None:
                    opt.state[p]["momentum_buffer"] = buf.to(device).clone()


class TrainingStateError(RuntimeError):
    """A working folder cannot be resumed: another run's, or its checkpoint is missing or corrupt."""


def _read_checkpoint(workdir: str, prog: dict) -> dict[str, torch.Tensor]:
    """The checkpoint progress.json names, refused unless its bytes are the ones written (sha256)."""
    path = os.path.join(workdir, prog["state"]) if prog.get("state") else None
    way_out = (f"delete {workdir} (or give another --work) to start this run over; the checkpoint cannot be "
               "trusted")
    if path is None:
        raise TrainingStateError(f"{workdir}/{PROGRESS} names no checkpoint; {way_out}")
    if not os.path.isfile(path):
        raise TrainingStateError(f"checkpoint {path} is missing; {way_out}")
    expected = prog.get("state_sha256")
    if expected is None or file_sha256(path) != expected:
        raise TrainingStateError(f"checkpoint {path} is corrupt (its sha256 is not the one recorded when it was "
                                 f"written); {way_out}")
    return load_file(path)


def _save_state(workdir: str, name: str, tensors: dict) -> None:
    tmp = os.path.join(workdir, name + ".tmp")
    save_file(tensors, tmp)
    os.replace(tmp, os.path.join(workdir, name))


def _epoch_order(n: int, seed: int, block: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + block * 1009 + epoch))


def scaled_lr(optimizer: dict, batch: int) -> float:
    """``lr`` is per ``lr_reference_batch`` samples (None: no scaling): the linear scaling rule."""
    ref = optimizer.get("lr_reference_batch")
    return optimizer["lr"] * (batch / ref if ref else 1.0)


def train_local(plan: dict, splits: Splits, workdir: str, epochs: int, *, cache: bool = True,
                device: str = "cpu", progress: Callable[[str, int, int], None] | None = None,
                eval_each_epoch: bool = False, initial: dict[str, torch.Tensor] | None = None,
                patience: int | None = None, on_epoch: Callable[[dict], None] | None = None) -> dict:
    """Train every block of ``plan`` (the generated plan's ``PLAN``); returns what happened, as a JSON dict.

    ``initial``: the starting weights (``layer.{i}.*``, ``head.{i}.*``); default the plan's weights file.
    ``eval_each_epoch`` also records each epoch's test accuracy of the block's last head (outside the timed
    training) for time-to-accuracy curves, and the exit the validation split would choose at that moment (the
    head with the best validation accuracy of all trained so far) with its test accuracy.
    ``patience``: a block stops after that many epochs without a new best validation accuracy of its heads
    (evaluated after every epoch, untimed); ``epochs`` is then the cap per block.
    ``on_epoch(record)``: called as each epoch of a block ends, with the mean local loss of the block's last
    layer and every block head's validation accuracy (evaluated untimed).
    """
    if patience is not None and patience < 1:
        raise ValueError(f"patience must be at least 1, got {patience}")
    os.makedirs(workdir, exist_ok=True)
    dev = torch.device(device)
    if dev.type == "cuda":
        cuda_memory.bound_library_workspace()  # as the backprop runtime: no block's budget counts cuBLAS's
        cuda_memory.exact_allocator_blocks()
    layers = [build(l["spec"]).to(dev) for l in plan["layers"]]
    heads = [build(h).to(dev) for h in plan["heads"]]
    o = plan["optimizer"]
    opts = [torch.optim.SGD([*l.parameters(), *h.parameters()], lr=o["lr"], momentum=o["momentum"],
                            weight_decay=o["weight_decay"]) for l, h in zip(layers, heads)]
    tag = {"content": plan["schedule_content"], "epochs": int(epochs), "cache": bool(cache), "n_train": len(splits.train_y),
           "patience": patience}
    prog_path = os.path.join(workdir, PROGRESS)
    if os.path.isfile(prog_path):
        with open(prog_path) as f:
            prog = json.load(f)
        if prog["tag"] != tag:
            raise TrainingStateError(f"{workdir} holds a run of another plan or settings ({prog['tag']} vs "
                                     f"{tag}); use another working folder or delete this one")
        _load_state(_read_checkpoint(workdir, prog), layers, heads, opts, dev)
    else:
        _load_state(initial if initial is not None else load_file(plan["weights_path"]), layers, heads, opts, dev)
        prog = {"tag": tag, "block": 0, "epoch": 0, "state": None, "wall_s": 0.0, "blocks": [], "timeline": [],
                "resumed": 0}
    if prog["state"] is not None:
        prog["resumed"] += 1
    seed = int(plan["seed"])
    sources = {s: _Tensors(splits.x(s)) for s in SPLITS}
    if 0 < prog["block"] < len(plan["blocks"]):  # resuming mid-way: the previous block's caches feed this one
        prev = plan["blocks"][prog["block"] - 1]
        sources = {s: _source_after(workdir, prev, layers, splits, s, cache, dev) for s in SPLITS}
    for block in plan["blocks"][prog["block"]:]:
        b, idx, batch = block["index"], block["layers"], int(block["batch"])
        n = sources["train"].n
        # Kept in progress.json: a resumed block keeps the peak its first step measured before the kill.
        for i in idx:  # linear lr scaling with the block's batch (per-sample step size kept)
            for g in opts[i].param_groups:
                g["lr"] = scaled_lr(o, batch)
        peak = prog.setdefault("peak", {"counted_bytes": 0, "cuda_max_allocated": None})
        stop = prog.setdefault("stop", {"best_val": None, "since_best": 0})
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        for epoch in range(prog["epoch"], epochs):
            if patience is not None and stop["since_best"] >= patience:
                break  # a resumed block that had already stopped
            t0 = time.perf_counter()
            for m in (*(layers[i] for i in idx), *(heads[i] for i in idx)):
                m.train()
            order = _epoch_order(n, seed, b, epoch)
            loss_sum, loss_steps = 0.0, 0
            for step, start in enumerate(range(0, n, batch)):
                sel = order[start:start + batch]
                x = sources["train"].gather(sel).to(dev)
                y = splits.train_y[sel].to(dev)
                for i in idx:
                    if step == 0 and epoch == 0:
                        sb, out = step_bytes(layers[i], heads[i], x, y, opts[i])
                        peak["counted_bytes"] = max(peak["counted_bytes"], sb.peak)
                    else:
                        opts[i].zero_grad(set_to_none=True)
                        out = layers[i](x)
                        loss = nn.functional.cross_entropy(heads[i](out), y)
                        loss.backward()
                        opts[i].step()
                        if on_epoch is not None and i == idx[-1]:
                            loss_sum, loss_steps = loss_sum + float(loss.detach()), loss_steps + 1
                    x = out.detach()
                if progress:
                    progress(f"block {b} epoch {epoch + 1}/{epochs}", min(start + batch, n), n)
            name = f"state_b{b}_e{epoch + 1}.safetensors"
            _save_state(workdir, name, _state(layers, heads, opts))
            prog["state_sha256"] = file_sha256(os.path.join(workdir, name))  # verified on resume
            prog["wall_s"] += time.perf_counter() - t0  # the checkpoint is part of the method's cost
            old, prog["state"], prog["epoch"] = prog["state"], name, epoch + 1
            val = None
            if eval_each_epoch or patience is not None or on_epoch is not None:  # untimed: the block's heads on val
                val = _accuracy(layers, heads, idx, idx, sources["val"], splits.val_y, batch, dev)
                if stop["best_val"] is None or max(val.values()) > stop["best_val"]:
                    stop["best_val"], stop["since_best"] = max(val.values()), 0
                else:
                    stop["since_best"] += 1
            if eval_each_epoch:  # untimed: every head of the block on the test split
                acc = _accuracy(layers, heads, idx, idx, sources["test"], splits.test_y, batch, dev)
                best = max(acc.values())
                scores = prog.setdefault("heads", {})  # layer -> [val, test]; finished blocks keep their last
                scores.update({str(i): [val[i], acc[i]] for i in idx})
                exit_layer = max(scores, key=lambda k: (scores[k][0], -int(k)))  # ties: the earlier, smaller exit
                prog["timeline"].append({"block": b, "epoch": epoch + 1, "wall_s": prog["wall_s"],
                                         "layer": idx[-1], "test_accuracy": acc[idx[-1]],
                                         "heads_test_accuracy": {str(i): a for i, a in acc.items()},
                                         "heads_val_accuracy": {str(i): a for i, a in val.items()},
                                         "exit_layer": int(exit_layer),
                                         "exit_test_accuracy": scores[exit_layer][1],
                                         "best_exit_test_accuracy": max(
                                             [best, *(t["best_exit_test_accuracy"] for t in prog["timeline"])])})
            _atomic_json(prog_path, prog)
            if on_epoch is not None:
                on_epoch({"block": b, "blocks": len(plan["blocks"]), "epoch": epoch + 1, "epochs": epochs,
                          "layer": plan["layers"][idx[-1]]["name"],
                          "loss": loss_sum / loss_steps if loss_steps else None,
                          "val_accuracy": {plan["layers"][i]["name"]: a for i, a in val.items()},
                          "wall_s": prog["wall_s"]})
            if old and old != name and os.path.exists(os.path.join(workdir, old)):
                os.remove(os.path.join(workdir, old))
            if patience is not None and stop["since_best"] >= patience:
                break
        if dev.type == "cuda":
            peak["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(dev))
        # One eval pass per split: every head's accuracy, and the block's outputs cached for the next block.
        t0 = time.perf_counter()
        last = b == len(plan["blocks"]) - 1
        accs, cache_bytes = {}, 0
        for s in SPLITS:
            writer = None
            if s == "train" and not (cache and not last):
                continue  # the training split's pass only feeds the cache; its accuracies are not used
            if cache and not last:
                shape = tuple(plan["layers"][idx[-1]]["out_shape"])
                writer = CacheWriter(_cache_dir(workdir, b, s), sources[s].n, shape, plan["cache_dtype"])
            accs[s] = _accuracy(layers, heads, idx, idx, sources[s], splits.y(s), batch, dev, writer)
            if writer is not None:
                c = writer.close()
                cache_bytes += c.nbytes
        cache_s = time.perf_counter() - t0
        prog["wall_s"] += cache_s
        prog["blocks"].append({
            "index": b, "layers": idx, "batch": batch, "steps_per_epoch": (n + batch - 1) // batch,
            "epochs": prog["epoch"],
            "val_accuracy": {str(i): accs["val"][i] for i in idx},
            "test_accuracy": {str(i): accs["test"][i] for i in idx},
            "cache_bytes": cache_bytes, "cache_s": cache_s, **dict(peak),
        })
        prog["block"], prog["epoch"] = b + 1, 0
        del prog["peak"], prog["stop"]
        _atomic_json(prog_path, prog)
        # Older blocks' caches are no longer needed, even by a resume: storage holds two caches at most.
        for old_block in range(b):
            shutil.rmtree(os.path.dirname(_cache_dir(workdir, old_block, "train")), ignore_errors=True)
        if not last:
            sources = {s: _source_after(workdir, block, layers, splits, s, cache, dev) for s in SPLITS}
    save_file({k: v for k, v in _state(layers, heads, opts).items() if not k.startswith("momentum.")},
              os.path.join(workdir, "trained.safetensors"))
    return {"blocks": prog["blocks"], "timeline": prog["timeline"], "wall_s": prog["wall_s"],
            "resumed": prog["resumed"], "layers": layers, "heads": heads,
            "cache_bytes": sum(bl["cache_bytes"] for bl in prog["blocks"])}


def _cache_dir(workdir: str, block: int, split: str) -> str:
    return os.path.join(workdir, "cache", f"block{block}", split)


def _source_after(workdir, block, layers, splits, split, cache, dev):
    if cache:
        return ActivationCache.open(_cache_dir(workdir, block["index"], split))  # a source: .n and .gather
    return _Rerun(_Tensors(splits.x(split)), [layers[i] for i in range(block["layers"][-1] + 1)], dev)


@torch.no_grad()
def _accuracy(layers, heads, scored, idx, source, labels, batch, dev, writer=None) -> dict[int, float]:
    """Test-mode pass of the block's layers over a split: percent correct of each head in ``scored``."""
    for i in idx:
        layers[i].eval()
        heads[i].eval()
    correct = {i: 0 for i in scored}
    n = source.n
    for start in range(0, n, max(batch, 256)):
        sel = torch.arange(start, min(n, start + max(batch, 256)))
        x, y = source.gather(sel).to(dev), labels[sel].to(dev)
        for i in idx:
            x = layers[i](x)
            if i in correct:
                correct[i] += int((heads[i](x).argmax(1) == y).sum())
        if writer is not None:
            writer.append(x)
    return {i: 100.0 * c / max(n, 1) for i, c in correct.items()}
