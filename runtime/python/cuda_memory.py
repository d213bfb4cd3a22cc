"""GPU memory the memory model cannot see: the cuBLAS workspace, kept small where the runtime trains on CUDA.

torch gives each cuBLAS handle a workspace from the caching allocator on its first matrix product and keeps it for
the process's life: by default 32 MiB plus cuBLASLt's 1 MiB on compute capability 9.0 (measured on an H200: between
steps the allocator held 34.6 MB more than the ledger on every model, 0.27 MB with the setting below), less on
older GPUs. No schedule counts it, so a plan's real GPU memory exceeded its budget by that much (ResNet-18,
jetson-agx-orin, 100%: 177.4 MB allocator peak against a 147.0 MB budget). `:16:8`, one of the two
configurations torch documents for deterministic cuBLAS, is eight 16 KiB buffers: the same step then peaked at
143.0 MB. A workspace the user configured is left as it is; one already created before the runtime is not resized.

The caching allocator's own rounding is another: by default it hands out a cached block whole when what would
be left of it is 1 MiB or less, and `max_memory_allocated` counts the whole block (c10's `should_split`), so a
tensor can cost up to 1 MiB more than its bytes: the likely cause of MobileNetV2's 13.4 MB above the ledger and
cuBLAS's workspace on the H200 (jetson-agx-orin, 100%), not yet confirmed on a GPU. With expandable segments the
allocator splits every large block down to 512-byte granules, as it does small ones. `exact_allocator_blocks`
turns them on where the process left the allocator as it comes; a configuration of its own is kept.
"""
from __future__ import annotations

import os

import torch

CUBLAS_CONFIG = ":16:8"  # eight 16 KiB workspaces
CUBLASLT_KIB = "128"  # cuBLASLt's workspace within cuBLAS's (torch warns when it asks for more)


def bound_library_workspace() -> bool:
    """Set the small cuBLAS workspace unless the process configured one; True where this call set it."""
    if "CUBLAS_WORKSPACE_CONFIG" in os.environ:
        return False
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_CONFIG
    os.environ.setdefault("CUBLASLT_WORKSPACE_SIZE", CUBLASLT_KIB)
    return True


EXPANDABLE = "expandable_segments:True"


def allocator_settings() -> str:
    """The caching allocator's settings as the process configured them ('' for none): torch's accelerator-wide
    record, or, in a torch without it, the environment's."""
    get = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if get is not None:
        return get()
    return os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))


def exact_allocator_blocks() -> bool:
    """Expandable segments for the CUDA caching allocator unless the process configured it (PYTORCH_ALLOC_CONF,
    PYTORCH_CUDA_ALLOC_CONF or a call before); True where this call set them. Applies to allocations from now on:
    blocks split to 512-byte granules, so the allocator's peak follows the bytes the ledger counts."""
    if allocator_settings() or "PYTORCH_ALLOC_CONF" in os.environ or "PYTORCH_CUDA_ALLOC_CONF" in os.environ:
        return False
    put = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    (put or torch.cuda.memory._set_allocator_settings)(EXPANDABLE)
    return True
