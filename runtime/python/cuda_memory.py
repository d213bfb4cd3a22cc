"""GPU memory the memory model cannot see: the cuBLAS workspace, kept small where the runtime trains on CUDA.

torch gives each cuBLAS handle a workspace from the caching allocator on its first matrix product and keeps it for
the process's life: by default 32 MiB plus cuBLASLt's 1 MiB on compute capability 9.0 (measured on an H200: between
steps the allocator held 34.6 MB more than the ledger on every model, 0.27 MB with the setting below), less on
older GPUs. No schedule counts it, so a plan's real GPU memory exceeded its budget by that much (ResNet-18,
jetson-agx-orin, 100%: 177.4 MB allocator peak against a 147.0 MB budget). `:16:8`, one of the two
configurations torch documents for deterministic cuBLAS, is eight 16 KiB buffers: the same step then peaked at
143.0 MB. A workspace the user configured is left as it is; one already created before the runtime is not resized.
"""
from __future__ import annotations

import os

CUBLAS_CONFIG = ":16:8"  # eight 16 KiB workspaces
CUBLASLT_KIB = "128"  # cuBLASLt's workspace within cuBLAS's (torch warns when it asks for more)


def bound_library_workspace() -> bool:
    """Set the small cuBLAS workspace unless the process configured one; True where this call set it."""
    if "CUBLAS_WORKSPACE_CONFIG" in os.environ:
        return False
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_CONFIG
    os.environ.setdefault("CUBLASLT_WORKSPACE_SIZE", CUBLASLT_KIB)
    return True
