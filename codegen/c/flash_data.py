"""The plan's constant data: the parameters' and buffers' initial values as C initializers (float32 as stored, an
int8 prefix's int8 weights and int32 biases computed from them), and the streamed weights' CRC-checked blocks for
the device's page store (in the dtype the kernels read: an int8 prefix's the same integers)."""
from __future__ import annotations

import os
import struct
import zlib
from math import prod

import numpy as np
from safetensors.numpy import load_file

from edgetrain.compiler.graph.quantize import conv_integers, q8_layers  # an int8 prefix's integer weights

from .names import c_comment, c_float
from .ops import CodegenError

STORAGE_DIR = "storage"  # the streamed weights' blocks, to be copied onto the device's page store
WEIGHT_PAGE_BASE = 0x10000  # page ids of streamed weights: above any activation page's
BLOCK_PAGES = 0x100  # page ids per streamed weight: one per block of output channels where it is paged by blocks
BLOCK_MAGIC = 0x47505445  # runtime/c/storage.h: "ETPG"


def _numel(shape) -> int:
    return prod(shape) if shape else 1


C_TYPES = {"float32": "float", "int8": "int8_t", "int32": "int32_t"}  # a parameter's C type, by its dtype


def q8_integers(em, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The int8 weights and int32 biases of an int8 prefix's convolutions, flat: computed from the float values the
    model holds (weights.safetensors) and the scales the graph pass chose (compiler/graph/quantize.py)."""
    out = {}
    for q in (q for n in em.graph.nodes for q in q8_layers(n.attrs) if "weight" in q):  # a tiled prefix's too
        floats = {p: weights[p].reshape(em.params[p]["shape"]) for p in (q["weight"], q["bias"]) if p}
        out.update({p: v.reshape(-1) for p, v in conv_integers(q, floats).items()})
    return out


def read_weights(path: str, state: dict, kind: str = "param") -> dict[str, np.ndarray]:
    """The initial values of the parameters (kind "param") or buffers ("buffer"), flat: float32 as stored (an
    int8 prefix's parameters are stored as the float values they are quantised from), buffers in their dtype."""
    tensors = load_file(path)
    out = {}
    for name, spec in state.items():
        key = f"{kind}/{name}"
        if key not in tensors:
            raise CodegenError(f"{path} has no tensor for {kind} `{c_comment(name)}`; recompile the model")
        dtype = "float32" if kind == "param" else spec.get("dtype", "float32")
        a = np.ascontiguousarray(tensors[key], dtype=dtype).reshape(-1)
        if a.size != _numel(spec["shape"]):
            raise CodegenError(f"{path}: {kind} `{c_comment(name)}` has {a.size} values, the schedule {spec['shape']}")
        out[name] = a
    return out


def buffer_rows(values: np.ndarray, dtype: str) -> list[str]:
    if dtype == "float32":
        return float_rows(values)
    ints = [str(int(v)) for v in values.tolist()]
    return [", ".join(ints[i:i + 24]) for i in range(0, len(ints), 24)]


def float_rows(values: np.ndarray, per_row: int = 6) -> list[str]:
    lits = [c_float(v) for v in values.tolist()]
    return [", ".join(lits[i:i + per_row]) for i in range(0, len(lits), per_row)]


def _block(page: int, payload: bytes) -> bytes:
    """A page-store block (runtime/c/storage.h): magic, id, size, CRC-32 of those 12 bytes and the payload."""
    head = struct.pack("<3I", BLOCK_MAGIC, page, len(payload))
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


STORE_DTYPES = {"float32": "<f4", "int8": "i1", "int32": "<i4"}  # a streamed weight's bytes in the store


def write_storage(out_dir: str, em, weights: dict[str, np.ndarray]) -> list[dict]:
    """The streamed weights as blocks in OUT/storage/ (one file per page, the page store's names); their table.
    `weights`: the values as the kernels read them (an int8 prefix's: q8_integers'), each written in the dtype
    the schedule gives it, little-endian."""
    table = []
    readers = {p: [n["name"] for n in em.nodes if p in n.get("streamed", ())] for p in em.streamed}
    for p, page in em.streamed.items():
        shape, dtype = em.params[p]["shape"], em.params[p].get("dtype", "float32")
        values = _exactly(weights[p], STORE_DTYPES[dtype], p).reshape(shape)
        for page, r0, r1 in em.blocks.get(p, [(page, 0, shape[0])]):  # one page, or one per block of rows
            data = values[r0:r1].tobytes()
            rel = f"{STORAGE_DIR}/et_page_{page:08x}.bin"
            path = os.path.join(out_dir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "wb") as f:
                f.write(_block(page, data))
            os.replace(path + ".tmp", path)
            table.append({"param": p, "page": page, "bytes": len(data), "file": rel, "shape": [r1 - r0, *shape[1:]],
                          "rows": [r0, r1], "dtype": dtype, "readers": readers[p]})
    return table


def _exactly(values: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """`values` as `dtype`, refused where that would change one (float values where integers are due)."""
    out = np.ascontiguousarray(values, dtype=dtype).reshape(-1)
    if np.dtype(dtype).kind == "i" and not np.array_equal(out, values.reshape(-1)):
        raise CodegenError(f"streamed weight `{c_comment(name)}` is {np.dtype(dtype).name} in the schedule, but its "
                           "values are not those integers; recompile the model")
    return out
