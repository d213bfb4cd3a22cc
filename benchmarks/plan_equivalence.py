"""Plan equivalence: another checkout's plan.py and this checkout's, rendered from one schedule, train alike.

    .venv/bin/python benchmarks/plan_equivalence.py --baseline /path/to/other/checkout [--steps 3]
        [--case 'small_cnn --target rpi4 --budget 85%'] ... [--json build/bench/plan_equivalence.json]

Per case, the baseline checkout compiles the model (its own CLI, in its own virtual environment,
`<baseline>/.venv/bin/python`); this checkout renders plan.py again from that very schedule.json into a copy of
the folder (the copy's recorded file hashes updated, as compile writes them). Each plan then trains --steps
steps from the folder's weights on the same random batches, the baseline's with the baseline's runtime and this
one's with this runtime (each through its own device API, which checks the ledger's peak against the schedule's
prediction at every step), and every tensor of the training state (parameters, buffers, optimizer state) is
compared bit for bit. A case passes when all are identical. Prints one row per case; exits 1 if any differs.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from benchmarks.output import write_json  # noqa: E402
from edgetrain.codegen.python_plan import render_python_plan  # noqa: E402
from edgetrain.compiler.workbench.run import schedule_batches  # noqa: E402
from edgetrain.runtime.python.integrity import file_table, json_checksum  # noqa: E402

CASES = ("small_cnn --target rpi4 --budget 85%", "gpt_tiny --target rpi4 --budget 85%",
         "mobilenetv2 --target rpi4 --budget 85%", "small_cnn --target rpi4 --budget 85% --train biases",
         "small_cnn --target rpi4 --budget 85% --optimizer adamw")

# Run by either checkout's interpreter: train a folder on saved batches, save the training state.
_TRAIN = """
import sys
from safetensors.torch import load_file, save_file
from edgetrain.runtime.python import Trainer
folder, batches, out = sys.argv[1:4]
b = load_file(batches)
with Trainer(folder, device="cpu") as t:
    losses = [t.step(b[f"x{k}"], b[f"y{k}"]) for k in range(len(b) // 2)]
    save_file(t.training_state(), out, metadata={"losses": repr(losses), "peak": str(t.rt.ledger.peak_bytes)})
"""


def rerender(old: Path, new: Path) -> None:
    """`old` copied to `new` with plan.py rendered by this checkout from old's schedule, its hashes recorded."""
    shutil.copytree(old, new, ignore=shutil.ignore_patterns("pages*", "__pycache__"))
    body = json.loads((new / "schedule.json").read_text())
    render_python_plan(body, str(new))
    body["outputs"]["files"] = file_table(new)
    body["checksum"] = json_checksum(body)
    (new / "schedule.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def _state(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors differ in any bit (or exist on one side only)."""
    out = sorted(set(a) ^ set(b))
    for k in sorted(set(a) & set(b)):
        x, y = a[k], b[k]
        bits = [t.reshape(-1).contiguous().view(torch.uint8) for t in (x, y)]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(*bits):
            out.append(k)
    return out


def run_case(case: str, baseline: Path, python: str, steps: int, work: Path) -> dict:
    old, new = work / "old", work / "new"
    subprocess.run([str(Path(python).parent / "edgetrain"), "compile", *shlex.split(case),
                    "--time-limit", "20", "--out", str(old)], check=True, cwd=baseline, stdout=subprocess.DEVNULL)
    rerender(old, new)
    body = json.loads((old / "schedule.json").read_text())
    batches = {}
    for k, (x, y) in enumerate(schedule_batches(body, "random", steps, seed=3)):
        batches[f"x{k}"], batches[f"y{k}"] = x.contiguous(), y.contiguous()
    save_file(batches, str(work / "batches.safetensors"))
    for side, exe, folder in (("old", python, old), ("new", sys.executable, new)):
        subprocess.run([exe, "-c", _TRAIN, str(folder), str(work / "batches.safetensors"),
                        str(work / f"{side}.safetensors")], check=True)
    (a, ma), (b, mb) = _state(work / "old.safetensors"), _state(work / "new.safetensors")
    diff = differing(a, b)
    return {"case": case, "tensors": len(a), "differing": diff, "losses_old": ma["losses"],
            "losses_new": mb["losses"], "peak_old": int(ma["peak"]), "peak_new": int(mb["peak"]),
            "identical": not diff and ma == mb}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, metavar="DIR", help="the other checkout (with DIR/.venv)")
    ap.add_argument("--case", action="append", help="compile arguments after `compile` (repeatable)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", default="build/bench/plan_equivalence.json", metavar="PATH")
    args = ap.parse_args(argv)
    baseline = Path(args.baseline).resolve()
    python = str(baseline / ".venv" / "bin" / "python")
    rows = []
    for case in args.case or CASES:
        with tempfile.TemporaryDirectory(prefix="plan-eq-") as work:
            row = run_case(case, baseline, python, args.steps, Path(work))
        rows.append(row)
        verdict = "identical" if row["identical"] else f"DIFFER: {', '.join(row['differing'][:5]) or 'losses'}"
        print(f"{case}: {row['tensors']} tensors after {args.steps} steps, peak {row['peak_new']} B, "
              f"losses {row['losses_new']}: {verdict}", flush=True)
    write_json(args.json, rows)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
