"""The runtime keeps freed tensor memory in the C heap for the next step instead of page-faulting it back in."""
from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys

import pytest
import torch

from edgetrain.runtime.python import heap

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")


def _faults_of_a_fresh_step(mb: int) -> int:
    """Minor page faults of allocating, writing and freeing `mb` MB, after the same was done once already."""
    for k in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = torch.ones(mb << 18)  # written in full: every page touched
        del t
        after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    return after - before


@glibc
def test_a_freed_large_tensor_is_reused_without_page_faults():
    """Run in a fresh interpreter each way: the setting is the process's, and once made it stays."""
    code = ("import sys; from edgetrain.runtime.python import heap; "
            "import tests.test_runtime_heap as t; kept = heap.keep_freed_memory(); "
            "print(int(kept), t._faults_of_a_fresh_step(96))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(env_extra):
        env = {k: v for k, v in os.environ.items() if k != heap.OPT_OUT} | env_extra
        out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                             check=True)
        kept, faults = out.stdout.split()
        return kept == "1", int(faults)

    kept, faults = run({})
    assert kept and faults < 500, faults  # 96 MB is 24,576 pages: reused, not faulted back in
    kept, faults = run({heap.OPT_OUT: "1"})
    assert not kept and faults > 20_000, faults  # glibc's own settings: a fresh mapping, every page faulted


def test_the_runtime_sets_it_once(monkeypatch, tmp_path):
    from safetensors.torch import save_file

    from edgetrain.runtime.python import Runtime

    calls = []
    monkeypatch.setattr(heap, "_state", {})
    monkeypatch.setattr(heap, "_set_thresholds", lambda: calls.append(1) or True)
    save_file({"param/w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    for _ in range(2):
        Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)
    assert calls == [1] and heap.keep_freed_memory()
