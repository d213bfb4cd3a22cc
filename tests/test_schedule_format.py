"""The schedule file: round trip, JSON Schema, deterministic output, and no pickle anywhere."""
from __future__ import annotations

import ast
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from edgetrain.compiler.schedule_file import format as schedule_format
from edgetrain.compiler.pipeline import CompileOptions, compile_model
from edgetrain.compiler.errors import ScheduleFormatError

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("compiler", "codegen", "runtime", "targets")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fmt") / "small_cnn"
    compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="100%", out=str(out), batch_size=2))
    return out


def _bare(body: dict) -> dict:
    """What a compiler hands to `save`: the body without the fields `save` adds."""
    return {k: v for k, v in body.items() if k not in ("format", "version", "checksum")}


# -- round trip ------------------------------------------------------------------------------------------

def test_round_trip_is_lossless_and_byte_stable(compiled, tmp_path):
    original = (compiled / "schedule.json").read_text()
    body = schedule_format.load(str(compiled))
    assert body["format"] == schedule_format.FORMAT and body["version"] == schedule_format.FORMAT_VERSION
    assert body["checksum"].startswith("sha256:")
    assert body == json.loads(original)
    path = schedule_format.save(_bare(body), str(tmp_path))
    assert path == str(tmp_path / "schedule.json")
    assert Path(path).read_text() == original
    assert schedule_format.load(str(tmp_path)) == body
    assert schedule_format.load(path) == body  # a file path works as well as its folder
    assert schedule_format.dumps(body) == original  # re-saving a loaded body changes nothing
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write leaves no temporary behind


def test_checksum_covers_every_field(compiled):
    body = schedule_format.load(str(compiled))
    base = schedule_format._checksum(body)
    for key in _bare(body):
        edited = dict(body)
        edited[key] = None
        assert schedule_format._checksum(edited) != base, key


# -- the JSON Schema ------------------------------------------------------------------------------------

REQUIRED = ["edgetrain", "model", "target", "budget", "graph", "summary", "steps", "predicted", "store_all", "solver",
            "scheduler", "seed"]


@pytest.mark.parametrize("key", REQUIRED)
def test_schema_rejects_a_missing_required_key(compiled, tmp_path, key):
    body = schedule_format.load(str(compiled))
    del body[key]
    body["checksum"] = schedule_format._checksum(body)  # only the schema can catch it now
    (tmp_path / "schedule.json").write_text(json.dumps(body))
    with pytest.raises(ScheduleFormatError, match="does not match the format") as e:
        schedule_format.load(str(tmp_path))
    assert repr(key) in str(e.value)


@pytest.mark.parametrize("edit, where", [
    (lambda b: b["steps"][0].pop("action"), "steps/0"),
    (lambda b: b["steps"][1].update(action="teleport"), "steps/1/action"),
    (lambda b: b["steps"][2].update(stage=-1), "steps/2/stage"),
    (lambda b: b["graph"]["nodes"][1].pop("op"), "graph/nodes/1"),
    (lambda b: b["graph"]["nodes"][1].update(kind="magic"), "graph/nodes/1/kind"),
    (lambda b: b["budget"].update(bytes="2MB"), "budget/bytes"),
    (lambda b: b["model"].update(loss="hinge"), "model/loss"),
])
def test_schema_rejects_nested_damage(compiled, tmp_path, edit, where):
    body = schedule_format.load(str(compiled))
    edit(body)
    body["checksum"] = schedule_format._checksum(body)
    (tmp_path / "schedule.json").write_text(json.dumps(body))
    with pytest.raises(ScheduleFormatError, match="does not match the format") as e:
        schedule_format.load(str(tmp_path))
    assert str(e.value).rstrip().endswith(where)


def test_save_refuses_to_write_a_body_the_schema_rejects(compiled, tmp_path):
    body = _bare(schedule_format.load(str(compiled)))
    del body["steps"]
    with pytest.raises(jsonschema.ValidationError):
        schedule_format.save(body, str(tmp_path))
    assert not list(tmp_path.iterdir())


def test_another_format_is_refused(tmp_path):
    (tmp_path / "schedule.json").write_text(json.dumps({"format": "something.else", "version": 1}))
    with pytest.raises(ScheduleFormatError, match="not an edgetrain schedule"):
        schedule_format.load(str(tmp_path))
    (tmp_path / "schedule.json").write_text("[1, 2, 3]")
    with pytest.raises(ScheduleFormatError, match="not an edgetrain schedule"):
        schedule_format.load(str(tmp_path))


# -- deterministic output -------------------------------------------------------------------------------



def _masked_schedule(text: str) -> str:
    body = json.loads(text)
    assert "seconds" in body["solver"]
    body["solver"]["seconds"] = "<masked>"
    if "greedy_starts" in body["solver"]:  # the warm starts' own wall time
        body["solver"]["greedy_starts"]["seconds"] = "<masked>"
    body["checksum"] = "<masked>"
    return json.dumps(body, indent=1, sort_keys=True)


def test_compiling_twice_gives_the_same_files(tmp_path):
    """A fresh process with another hash seed (so another order of string sets) and another torch thread count
    than this one must write the same files as a compile in this process.

    Known, accepted difference: `solver.seconds` (and the warm starts' `seconds`, and the result's `phases`) is wall time and sits inside the checksummed body, so the
    schedule's checksum differs between compiles. plan.py quotes a hash of the plan's content only, so it
    and the weights must be byte-identical.
    """
    a, b = tmp_path / "here", tmp_path / "there"
    args = ["compile", "small_cnn", "--target", "rpi4", "--budget", "85%", "--batch-size", "2"]
    seed = "1" if os.environ.get("PYTHONHASHSEED") == "0" else "0"  # differs from this process's seed
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain.compiler.workbench.cli", *args, "--out", str(b), "--json"], cwd=ROOT,
                            env=dict(os.environ, PYTHONHASHSEED=seed), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        here = compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="85%", out=str(a), batch_size=2))
    finally:
        stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    there = json.loads(stdout)
    assert here["recomputes"] + here["page_ins"] > 0  # a real solve, not store-all
    wall = ("solver", "out", "phases")  # wall times, and where each compile wrote
    assert {k: v for k, v in here.items() if k not in wall} == \
        {k: v for k, v in there.items() if k not in (*wall, "ok")}
    sa, sb = (a / "schedule.json").read_text(), (b / "schedule.json").read_text()
    assert _masked_schedule(sa) == _masked_schedule(sb)
    # Only those two fields differ: the files are otherwise byte-identical, line by line.
    assert len(sa.splitlines()) == len(sb.splitlines())
    diff = [(x, y) for x, y in zip(sa.splitlines(), sb.splitlines()) if x != y]
    assert all('"checksum"' in x or '"seconds"' in x for x, _ in diff), diff
    pa, pb = (a / "plan.py").read_text(), (b / "plan.py").read_text()
    assert pa == pb
    assert (a / "weights.safetensors").read_bytes() == (b / "weights.safetensors").read_bytes()


def test_masking_would_not_hide_a_real_difference(compiled):
    text = (compiled / "schedule.json").read_text()
    body = json.loads(text)
    body["steps"][0]["reason"] += "!"
    assert _masked_schedule(json.dumps(body)) != _masked_schedule(text)


# -- no pickle ------------------------------------------------------------------------------------------

PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}


def pickle_uses(source: str, filename: str = "<src>") -> list[str]:
    """Every import of a pickle-based module and every call that unpickles or pickles (torch.load/save,
    np.load/save with allow_pickle, Tensor/Module __reduce__ helpers), as `file:line: what`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]] + [a.name for a in node.names]
        elif isinstance(node, ast.Attribute):
            dotted = ast.unparse(node)
            if dotted in ("torch.load", "torch.save", "torch.serialization", "numpy.load", "np.load") or \
                    node.attr in ("pickle", "_pickle", "cPickle"):
                found.append(f"{filename}:{node.lineno}: {dotted}")
            continue
        elif isinstance(node, ast.keyword) and node.arg in ("allow_pickle", "pickle_module"):
            found.append(f"{filename}:{getattr(node, 'lineno', '?')}: {node.arg}=")
            continue
        else:
            continue
        found += [f"{filename}:{node.lineno}: import {n}" for n in names if n in PICKLE_MODULES]
    return found


@pytest.mark.parametrize("bad", [
    "import pickle", "import cPickle as p", "from pickle import loads", "import dill", "from joblib import dump",
    "import torch\ntorch.load('w.pt')", "import torch\ntorch.save({}, 'w.pt')", "import numpy as np\nnp.load('a', allow_pickle=True)",
    "from torch import serialization\nx = serialization._pickle", "import shelve",
])
def test_the_pickle_scan_finds_pickle(bad):
    assert pickle_uses(bad)


def _sources():
    for d in SOURCE_DIRS:
        yield from sorted((ROOT / d).rglob("*.py"))


def test_no_pickle_in_compiler_codegen_runtime_targets():
    files = list(_sources())
    assert len(files) > 15 and any(f.name == "executor.py" for f in files)
    found = [hit for f in files for hit in pickle_uses(f.read_text(), str(f.relative_to(ROOT)))]
    assert not found, found
    for tpl in (ROOT / "codegen").rglob("*.j2"):
        text = tpl.read_text()
        assert "pickle" not in text and "torch.load" not in text and "torch.save" not in text, tpl


def test_generated_files_use_no_pickle(compiled):
    assert not pickle_uses((compiled / "plan.py").read_text(), "plan.py")
    raw = (compiled / "weights.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])  # safetensors: a little-endian header length, then a JSON header
    header = json.loads(raw[8:8 + n])
    assert any(k.startswith("param/") for k in header) and any(k.startswith("buffer/") for k in header)
    assert b"\x80\x02" != raw[:2] and not raw.startswith(b"PK")  # neither a pickle nor a torch zip file
    assert sorted(os.listdir(compiled)) == ["plan.py", "schedule.json", "weights.safetensors"]
