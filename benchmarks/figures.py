"""The figures of README.md and docs/, redrawn from the benchmark data committed under docs/data/.

    .venv/bin/python benchmarks/figures.py          # or: make figures

- docs/data/sweep_<model>_<target>/: a sweep's sweep.json, graph.json, rows.jsonl and the solve files its
  schedule and memory figures are drawn from -> docs/figures/<model>_<target>/*.png, *.svg;
- docs/data/local_learning_<model>.json (benchmarks/local_learning.py --json) ->
  docs/figures/local_learning_<model>.png, .svg;
- docs/data/peers.json (benchmarks/peers.py --json) -> docs/figures/peers_<model>.png, .svg.
To refresh the data itself: rerun the sweep or the benchmark (see docs/figures.md), copy the small files in.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.peers_figure import plot_peers  # noqa: E402
from edgetrain.compiler.workbench.local_figures import plot_local_learning  # noqa: E402
from edgetrain.compiler.workbench.plot import plot_sweep  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "docs", "data"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "figures"))
    a = ap.parse_args(argv)
    files: list[str] = []
    for d in sorted(glob.glob(os.path.join(a.data, "sweep_*"))):
        name = os.path.basename(d)[len("sweep_"):]
        r = plot_sweep(d, report=False, plots_dir=os.path.join(a.out, name))
        files += r["files"]
    for path in sorted(glob.glob(os.path.join(a.data, "local_learning_*.json"))):
        with open(path) as f:
            result = json.load(f)
        files += plot_local_learning(result, a.out, os.path.splitext(os.path.basename(path))[0])["files"]
    peers = os.path.join(a.data, "peers.json")
    if os.path.exists(peers):
        with open(peers) as f:
            files += plot_peers(json.load(f), a.out)
    for f in files:
        print(os.path.relpath(f, ROOT))
    return files


if __name__ == "__main__":
    main()
