"""The device runtime installs and runs alone: `pip install ./runtime` gives `edgetrain.runtime` with torch,
safetensors, numpy and xxhash only, and a compiled plan trains there, where nothing of the compiler can be
imported.

The environment is real but assembled without a download: the runtime is built and installed from its own
pyproject.toml into a fresh folder, and torch, safetensors, numpy, xxhash and what they require are linked in
from this interpreter's site-packages; the interpreter runs with `-S -I` (no site-packages, no user paths).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from edgetrain.compiler.pipeline import CompileOptions, compile_model

ROOT = Path(__file__).resolve().parents[1]


def _requirements(dist: str, seen: set[str]) -> None:
    """`dist` and every distribution it requires (not extras), by normalized name."""
    name = re.sub(r"[-_.]+", "-", dist).lower()
    if name in seen:
        return
    seen.add(name)
    for req in metadata.distribution(name).requires or []:
        if "extra ==" in req:
            continue
        _requirements(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0], seen)


def _link_distributions(dists: set[str], into: Path) -> None:
    """Link each distribution's top-level packages and modules (and its metadata) into `into`."""
    for name in dists:
        d = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in d.files or []}
        for top in tops:
            src = Path(str(d.locate_file(top)))
            if top.endswith(".pth") or top == ".." or not src.exists() or (into / top).exists():
                continue
            (into / top).symlink_to(src, target_is_directory=src.is_dir())


@pytest.fixture(scope="module")
def device(tmp_path_factory) -> Path:
    """A folder holding the installed runtime, torch, safetensors, numpy, xxhash and their requirements, nothing else."""
    where = tmp_path_factory.mktemp("device")
    site = where / "site"
    site.mkdir()
    src = where / "runtime-src"
    shutil.copytree(ROOT / "runtime", src, ignore=shutil.ignore_patterns("c", "build", "*.egg-info", "__pycache__"))
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                        "--target", str(site), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (site / "edgetrain" / "runtime" / "python" / "executor.py").is_file()
    assert not (site / "edgetrain" / "compiler").exists()
    wanted: set[str] = set()
    for dist in ("torch", "safetensors", "numpy", "xxhash"):
        _requirements(dist, wanted)
    _link_distributions(wanted, site)
    return site


def _run(site: Path, code: str) -> subprocess.CompletedProcess:
    prelude = f"import sys; sys.path[:0] = [{str(site)!r}]\n"
    return subprocess.run([sys.executable, "-S", "-I", "-c", prelude + code], capture_output=True, text=True,
                          timeout=300, cwd=site)


def test_the_installed_runtime_declares_torch_safetensors_numpy_and_xxhash_only(device):
    meta = next(device.glob("edgetrain_runtime-*.dist-info")) / "METADATA"
    requires = sorted(line.split(":", 1)[1].strip() for line in meta.read_text().splitlines()
                      if line.startswith("Requires-Dist:"))
    assert [re.split(r"[<>=!~ ]", r)[0] for r in requires] == ["numpy", "safetensors", "torch", "xxhash"]


def test_the_compiler_cannot_be_imported_there(device):
    p = _run(device, "import edgetrain.compiler")
    assert p.returncode != 0 and "No module named 'edgetrain.compiler'" in p.stderr
    p = _run(device, "import jinja2, highspy")  # the compiler's own dependencies are not there either
    assert p.returncode != 0 and "No module named" in p.stderr


def test_a_compiled_plan_trains_with_the_runtime_alone(device, tmp_path):
    out = tmp_path / "plan"
    compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="85%", out=str(out), batch_size=2))
    p = _run(device, f"""
import json, math, torch
import edgetrain.runtime
from edgetrain.runtime.python import load_plan, runtime_for
plan = load_plan({str(out)!r})
rt = runtime_for(plan, storage_dir={str(tmp_path / "pages")!r}, device="cpu")
g = torch.Generator().manual_seed(0)
losses = []
for _ in range(2):
    x = torch.randn(*plan.PLAN["input_shape"], generator=g)
    y = torch.randint(0, 10, (x.shape[0],), generator=g)
    rt.begin_step(x, y)
    losses.append(plan.train_step(rt))
mods = sorted({{m.split(".")[0] for m in __import__("sys").modules}})
print(json.dumps(dict(losses=losses, peak=rt.ledger.peak_bytes, predicted=plan.PLAN["predicted_peak_bytes"],
                      file=edgetrain.runtime.__file__, mods=mods)))
""")
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["file"].startswith(str(device))  # the installed copy, not the checkout
    assert all(isinstance(x, float) and x > 0 for x in r["losses"]) and r["peak"] == r["predicted"]
    assert not {"jinja2", "highspy", "jsonschema", "networkx"} & set(r["mods"])
