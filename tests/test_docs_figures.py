"""The figures README.md and docs/ show exist, and `make figures` redraws every one of them from docs/data/."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pages() -> list[str]:
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def test_every_image_and_link_of_the_docs_exists():
    seen = 0
    for page in _pages():
        with open(page) as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)#\s]+)\)", text):
            if "://" in target:
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target))
            assert os.path.exists(path), f"{os.path.relpath(page, ROOT)} points at {target}, which is missing"
            seen += 1
    assert seen >= 4


@pytest.mark.slow
def test_make_figures_redraws_every_committed_figure(tmp_path):
    out = tmp_path / "figures"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "figures.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    committed = {os.path.relpath(p, os.path.join(ROOT, "docs", "figures"))
                 for p in glob.glob(os.path.join(ROOT, "docs", "figures", "**", "*.png"), recursive=True)}
    drawn = {os.path.relpath(p, out) for p in glob.glob(os.path.join(out, "**", "*.png"), recursive=True)}
    assert committed and committed <= drawn, committed - drawn
