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
    """Minor page faults of allocating, writing and freeing `mb` MB three times, after five times before (the
    heap's first rounds grow it: an aligned block does not fit exactly where the last one was freed)."""
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = torch.ones(mb << 18)  # written in full: every page touched
        del t
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return sum(faults[5:])


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
    assert not kept and faults > 3 * 20_000, faults  # glibc's own settings: a fresh mapping, every page faulted


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


def test_the_finite_check_finds_every_non_finite_value_and_passes_large_finite_ones():
    """It sums first: a finite sum clears a tensor, and a sum that overflows finite values is checked again."""
    from edgetrain.runtime.python.checks import first_non_finite

    big = torch.full((4,), 3e38)  # finite, but its sum overflows float32
    assert not torch.isfinite(big.sum()) and first_non_finite({"big": big, "half": big.half()[:0]}) is None
    for bad in (float("nan"), float("inf"), float("-inf")):
        for dtype in (torch.float32, torch.float16, torch.float64):
            t = torch.zeros(1000, dtype=dtype)
            t[517] = bad
            assert first_non_finite({"ok": torch.ones(3), "w": t, "i": torch.ones(2, dtype=torch.int64)}) == "w"
    both = torch.tensor([float("inf"), float("-inf")])  # they cancel into NaN, still not finite
    assert first_non_finite({"b": both}) == "b"


def test_a_cuda_runtime_keeps_cublas_workspace_small_unless_configured(monkeypatch, tmp_path):
    """No schedule counts cuBLAS's workspace (32 MiB + 1 MiB by default on compute capability 9.0): a runtime on
    CUDA asks for the small one before its first matrix product; a process's own setting is kept."""
    import os

    from safetensors.torch import save_file

    from edgetrain.runtime.python import Runtime, cuda_memory

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    save_file({"param/w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    if not torch.cuda.is_available():  # set before the weights go to the GPU, which fails here
        with pytest.raises((RuntimeError, AssertionError)):
            Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cuda", lr=0.1)
    else:
        Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cuda", lr=0.1)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)  # the CPU needs none

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE", raising=False)
    assert cuda_memory.bound_library_workspace()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8" and os.environ["CUBLASLT_WORKSPACE_SIZE"] == "128"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert not cuda_memory.bound_library_workspace()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@pytest.fixture
def allocator_settings(monkeypatch):
    """The caching allocator's settings as the process left them ('' where it configured nothing), restored after."""
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    from edgetrain.runtime.python.cuda_memory import allocator_settings

    before = allocator_settings()
    torch._C._accelerator_setAllocatorSettings("")
    yield allocator_settings
    torch._C._accelerator_setAllocatorSettings(before)


def test_a_cuda_runtime_splits_the_allocators_blocks_unless_configured(allocator_settings, monkeypatch, tmp_path):
    """By default the CUDA caching allocator hands out a cached block whole when 1 MiB or less of it would be left,
    which the memory model cannot count: a runtime on CUDA turns on expandable segments (blocks split to 512-byte
    granules) before its weights are allocated; a process that configured its allocator keeps its settings."""
    from safetensors.torch import save_file

    from edgetrain.runtime.python import Runtime, cuda_memory

    save_file({"param/w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cpu", lr=0.1)
    assert allocator_settings() == ""  # the CPU's allocator is another one
    if not torch.cuda.is_available():  # set before the weights go to the GPU, which fails here
        with pytest.raises((RuntimeError, AssertionError)):
            Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cuda", lr=0.1)
    else:
        Runtime(tmp_path / "w.safetensors", tmp_path / "pages", device="cuda", lr=0.1)
    assert allocator_settings() == "expandable_segments:True"

    torch._C._accelerator_setAllocatorSettings("max_split_size_mb:64")  # configured in the process
    assert not cuda_memory.exact_allocator_blocks()
    assert allocator_settings() == "max_split_size_mb:64"
    torch._C._accelerator_setAllocatorSettings("")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")  # or in its environment
    assert not cuda_memory.exact_allocator_blocks()
    assert allocator_settings() == ""
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert cuda_memory.exact_allocator_blocks() and allocator_settings() == "expandable_segments:True"
