"""What binds a compiled folder together: the sha256 of every generated file and the table of its weights.

`edgetrain compile` records both in schedule.json (under `outputs`, covered by the schedule's checksum);
the runtime checks them before it imports plan.py or reads a weight, so a truncated, edited or swapped
file is refused by name instead of running. Torch and the standard library only: it runs on the device.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

SCHEDULE = "schedule.json"
CODE_SUFFIXES = (".py", ".c", ".h", ".mk")


class IntegrityError(RuntimeError):
    """A compiled folder's file does not match what compile recorded (truncated, edited, swapped, missing)."""


class WeightsError(ValueError):
    """A weights file does not hold the tensors (names, shapes, dtypes) the schedule was compiled for."""


def json_checksum(body: dict) -> str:
    """sha256 of a JSON object in canonical form, without its own `checksum` field."""
    canon = json.dumps({k: v for k, v in body.items() if k != "checksum"}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def generated_files(folder: str | os.PathLike) -> list[str]:
    """Every file under a freshly written `folder` except the schedule itself, as sorted relative paths."""
    folder = Path(folder)
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel_root = Path(root).relative_to(folder)
        out += [(rel_root / name).as_posix() for name in files if (rel_root / name).as_posix() != SCHEDULE]
    return sorted(out)


def file_table(folder: str | os.PathLike) -> dict[str, str]:
    """{relative path: sha256} of every generated file in `folder`."""
    return {rel: file_sha256(Path(folder) / rel) for rel in generated_files(folder)}


def tensor_table(tensors: dict[str, torch.Tensor]) -> dict[str, dict]:
    """{key: {"shape": [...], "dtype": "float32"}}: what a weights file must hold."""
    return {k: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for k, t in sorted(tensors.items())}


def read_outputs(folder: str | os.PathLike) -> dict | None:
    """The `outputs` section of a folder's schedule.json, its checksum verified; None if it records none."""
    path = Path(folder) / SCHEDULE
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise IntegrityError(f"{path} is missing: this is not a compiled folder (run `edgetrain compile --out "
                             f"{folder}`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IntegrityError(f"{path} is corrupt (not valid JSON: {e}); recompile the model") from None
    if not isinstance(body, dict) or body.get("checksum") != json_checksum(body):
        raise IntegrityError(f"{path}: checksum mismatch: the schedule was edited or corrupted after compile "
                             "wrote it; recompile the model")
    return body.get("outputs")


def verify_folder(folder: str | os.PathLike) -> dict | None:
    """Refuse a compiled folder whose generated files differ from what its schedule recorded, naming the file.

    Returns the `outputs` section (None for a folder compiled before outputs were recorded)."""
    outputs = read_outputs(folder)
    if outputs is None:
        return None
    recorded = outputs.get("files", {})
    for rel, digest in sorted(recorded.items()):
        path = Path(folder) / rel
        if not path.is_file():
            raise IntegrityError(f"{path} is missing from the compiled folder; recompile the model")
        if file_sha256(path) != digest:
            raise IntegrityError(f"{path} is not the file compile wrote (sha256 differs: truncated, edited or "
                                 "replaced); recompile the model, and do not edit generated files")
    extra = sorted(p.name for p in Path(folder).iterdir() if p.is_file() and p.name not in recorded
                   and (p.suffix in CODE_SUFFIXES or p.name == "Makefile"))
    if extra:
        raise IntegrityError(f"{Path(folder) / extra[0]} was not written by compile (code added to a compiled "
                             "folder); remove it or recompile into a fresh folder")
    return outputs


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, dict], source: str) -> None:
    """Refuse weights whose names, shapes or dtypes differ from the schedule's table, naming the first."""
    got = tensor_table(tensors)
    missing = sorted(set(expected) - set(got))
    unknown = sorted(set(got) - set(expected))
    if missing:
        raise WeightsError(f"{source} lacks {len(missing)} tensor(s) the plan needs, e.g. '{missing[0]}'; "
                           "these weights are not the compiled model's: use the weights compile wrote")
    if unknown:
        raise WeightsError(f"{source} holds {len(unknown)} tensor(s) the plan does not know, e.g. "
                           f"'{unknown[0]}'; these weights are not the compiled model's")
    for key, want in expected.items():
        have = got[key]
        if have["shape"] != list(want["shape"]) or have["dtype"] != want["dtype"]:
            raise WeightsError(f"{source}: '{key}' is {have['dtype']}{have['shape']}, the plan was compiled for "
                               f"{want['dtype']}{list(want['shape'])}; recompile the model for these weights "
                               "or use the weights compile wrote")


def read_weights(path: str | os.PathLike, expected: dict[str, dict] | None = None,
                 streamed: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """A weights file's tensors, refused with a clear error when missing, unreadable or not as expected;
    `streamed` (parameter name -> its empty tensor) are not read, only checked against `expected`."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    skip = {f"param/{p}" for p in streamed or {}}
    try:
        if skip:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys() if k not in skip}
        else:
            tensors = load_file(str(path), device="cpu")
    except FileNotFoundError:
        raise WeightsError(f"{path} is missing; recompile the model (compile writes it)") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightsError(f"{path} is corrupt or not a safetensors file ({e}); recompile the model") from None
    if expected is not None:
        check_tensors({**tensors, **{f"param/{p}": t for p, t in (streamed or {}).items()}}, expected, str(path))
    return tensors


def weights_table(path: str | os.PathLike) -> dict[str, dict]:
    """The table of a weights file just written (what `check_tensors` will hold later loads to)."""
    return tensor_table(read_weights(path))
