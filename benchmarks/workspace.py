"""Kernel scratch benchmark: each op's real transient memory beyond its outputs, against the compiler's rule.

    .venv/bin/python benchmarks/workspace.py [--threads 1,2,4] [--device cpu] [--repeats 3]
                                             [--only TEXT] [--channels-last] [--json build/bench/workspace.json]

Per case (an aten op and operand shapes: convolutions forward and backward of the zoo's kinds - 3x3, strided,
pointwise, depthwise, transposed, the first layer's, wide layers on small maps, a frozen layer's backward for
the input gradient alone, a first layer's (or one after a frozen prefix) for the weight's gradient without the
input's - and a few ops that have no rule: matrix products, batch norm, pooling, elementwise,
softmax, layer norm), the op runs once to warm up (oneDNN builds its kernels on first use), then --repeats
times, each in a measured span
(benchmarks/memory_probe.py): on the CPU the resident set's high-water growth with glibc malloc made
to return freed blocks at once, on CUDA the caching allocator's peak. `measured` is the most of those growths
less the outputs the op returns (held until the span's end; on the CPU the pages their blocks map, each
block its own mapping with its header); `rule` is `compiler/graph/workspace.py: kernel_scratch_bytes` for
the same op, shapes and thread count; `ok` says the rule is not below
what was measured (to two pages, the figure's resolution). Prints a table per thread count and writes JSON rows;
exits 1 if any rule is below.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.output import write_json  # noqa: E402
from benchmarks.memory_probe import Probe, isolate_malloc  # noqa: E402

ISOLATED = isolate_malloc()  # before torch allocates anything

import torch  # noqa: E402

from edgetrain.compiler.graph.ir import TensorSpec  # noqa: E402
from edgetrain.compiler.graph.workspace import kernel_scratch_bytes  # noqa: E402

aten = torch.ops.aten


def _conv(b, cin, cout, hw, k, s=1, p=None, groups=1, transposed=False):
    """(label, forward case, backward case) of a 2-d convolution."""
    p = k // 2 if p is None else p
    x = (b, cin, hw, hw)
    w = (cin, cout // groups, k, k) if transposed else (cout, cin // groups, k, k)
    out_pad = [0, 0]
    fwd = ("aten.convolution.default", [x, w, None, [s, s], [p, p], [1, 1], transposed, out_pad, groups])
    label = f"{'convT' if transposed else 'conv'} {cin}->{cout} k{k} s{s}{f' g{groups}' if groups > 1 else ''} {b}x{hw}x{hw}"
    return label, fwd


CONVS = [
    _conv(8, 3, 64, 32, 3), _conv(8, 64, 64, 32, 3), _conv(8, 64, 128, 32, 3, 2), _conv(8, 64, 128, 32, 1, 2, 0),
    _conv(8, 128, 128, 16, 3), _conv(8, 256, 256, 8, 3), _conv(8, 256, 512, 8, 3, 2), _conv(8, 512, 512, 4, 3),
    _conv(8, 512, 512, 2, 3), _conv(8, 144, 144, 32, 3, 1, None, 144), _conv(8, 144, 144, 32, 3, 2, None, 144),
    _conv(8, 576, 576, 8, 3, 1, None, 576), _conv(8, 24, 144, 32, 1, 1, 0), _conv(8, 144, 24, 32, 1, 1, 0),
    _conv(8, 960, 160, 4, 1, 1, 0), _conv(32, 64, 64, 32, 3), _conv(1, 512, 512, 4, 3), _conv(2, 256, 256, 4, 3),
    _conv(8, 64, 32, 16, 4, 2, 1, 1, True), _conv(32, 512, 512, 3, 3), _conv(32, 128, 128, 6, 3),
    _conv(2, 512, 512, 2, 3),
]
# Backward for the input gradient alone (a frozen convolution without a trained bias): the shapes that take one
# weight-gradient buffer per thread when the weight's gradient is asked for.
INPUT_GRAD_ONLY = [_conv(8, 512, 512, 2, 3), _conv(2, 512, 512, 2, 3), _conv(8, 128, 128, 2, 5)]
# Backward without the input gradient (a first layer, or one after a frozen prefix): the output gradient and the
# input re-laid out (its channels padded to oneDNN's block), no blocked input gradient.
WEIGHT_GRAD_ONLY = [_conv(8, 3, 16, 32, 3), _conv(8, 3, 64, 32, 3), _conv(8, 3, 32, 64, 3), _conv(1, 3, 16, 128, 3, 2),
                    _conv(32, 3, 64, 32, 3), _conv(8, 3, 32, 32, 5), _conv(8, 3, 16, 32, 7, 2, 3), _conv(8, 1, 16, 28, 3),
                    _conv(16, 1, 16, 28, 3), _conv(8, 1, 8, 28, 5), _conv(8, 2, 16, 28, 3), _conv(8, 4, 16, 28, 3),
                    _conv(8, 16, 32, 16, 3), _conv(8, 32, 16, 16, 3), _conv(8, 16, 32, 32, 3), _conv(8, 64, 64, 32, 3),
                    _conv(8, 24, 144, 32, 1, 1, 0), _conv(8, 144, 144, 16, 3, 1, None, 144)]
OTHERS = [  # label, op, operand shapes (tensors) and literals
    ("addmm 512x4096 @ 4096x1000", "aten.addmm.default", [(1000,), (512, 4096), (4096, 1000)]),
    ("mm 8x1280 @ 1280x1000", "aten.mm.default", [(8, 1280), (1280, 1000)]),
    ("batch norm 8x64x32x32", "aten._native_batch_norm_legit_functional.default",
     [(8, 64, 32, 32), (64,), (64,), (64,), (64,), True, 0.1, 1e-5]),
    ("max pool 3x3 s2 8x64x32x32", "aten.max_pool2d_with_indices.default", [(8, 64, 32, 32), [3, 3], [2, 2], [1, 1]]),
    ("relu 8x64x32x32", "aten.relu.default", [(8, 64, 32, 32)]),
    ("softmax 8x4x64x64", "aten._softmax.default", [(8, 4, 64, 64), -1, False]),
    ("masked softmax 8x8x256x256", "aten._safe_softmax.default", [(8, 8, 256, 256), -1]),
    ("layer norm 8x64x256", "aten.native_layer_norm.default", [(8, 64, 256), [256], (256,), (256,), 1e-5]),
]


LAYOUT = {"format": torch.contiguous_format}  # --channels-last: 4-D operands as a fused plan holds them


def _laid_out(t):
    """`t` in the layout asked for; a one-channel image stays as it is, as a channels-last plan keeps it."""
    if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[1] > 1:
        return t.contiguous(memory_format=LAYOUT["format"])
    return t


def _materialise(args, device):
    g = torch.Generator().manual_seed(0)
    return [_laid_out(torch.randn(*a, generator=g).to(device)) if isinstance(a, tuple) else a for a in args]


def _spec_args(args):
    return [TensorSpec(a, "float32") if isinstance(a, tuple) else a for a in args]


PAGE = 4096
BLOCK_HEADER = 128  # glibc's chunk header and torch's 64-byte alignment, in a block's own mapping
RESOLUTION = 2 * PAGE  # what an op without scratch measured at most beyond its outputs' pages


def _mapped(outs, device) -> int:
    """Bytes the outputs hold: on the CPU the pages their blocks map (each its own mapping, header included)."""
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    sizes = [o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor)]
    if device.type != "cpu":
        return sum(sizes)
    return sum(-(-(b + BLOCK_HEADER) // PAGE) * PAGE for b in sizes if b)


def _backward_case(fwd_args, device, mask=(True, True, True)):
    """convolution_backward's arguments for a forward case: (grad_output, input, weight, ...), the gradients in
    `mask` (input, weight, bias) made."""
    x, w = _materialise(fwd_args[:2], device)
    out = aten.convolution.default(x, w, *fwd_args[2:])
    go = torch.randn_like(out)  # in the layout the convolution gave its output
    bias_sizes = [w.shape[1] * fwd_args[8] if fwd_args[6] else w.shape[0]]
    return [go, x, w, bias_sizes, *fwd_args[3:], list(mask)]


def measure(op: str, args: list, probe: Probe, repeats: int, device) -> tuple[int, int]:
    """The most scratch the op showed over `repeats` runs, and its first output's bytes."""
    fn = getattr(getattr(aten, op.split(".")[1]), op.split(".")[2])
    with torch.no_grad():
        first = fn(*args)  # warm-up: kernels built, caches filled
        first = first[0] if isinstance(first, (tuple, list)) else first
        out_bytes = first.numel() * first.element_size() if isinstance(first, torch.Tensor) else 0
        del first
        worst = None
        for _ in range(repeats):
            with probe.span() as s:
                outs = fn(*args)
            extra = s.growth - _mapped(outs, device)
            del outs
            worst = extra if worst is None else max(worst, extra)
    return worst, out_bytes


def cases(device, only: str = ""):
    """(label, op, arguments, their specs) of every case whose label contains `only`, made as it is reached."""
    for label, (op, fargs) in CONVS:
        if only in label + " fwd":
            yield label + " fwd", op, _materialise(fargs, device), _spec_args(fargs)
        if only in label + " bwd":
            yield label + " bwd", "aten.convolution_backward.default", *_backward_specs(fargs, device)
    for label, (op, fargs) in INPUT_GRAD_ONLY:
        if only in label + " bwd input grad":
            yield label + " bwd input grad", "aten.convolution_backward.default", \
                *_backward_specs(fargs, device, (True, False, False))
    for label, (op, fargs) in WEIGHT_GRAD_ONLY:
        for mask in ((False, True, False), (False, True, True)):
            name = label + f" bwd weight{' + bias' if mask[2] else ''} grad"
            if only in name:
                yield name, "aten.convolution_backward.default", *_backward_specs(fargs, device, mask)
    for label, op, oargs in OTHERS:
        if only in label:
            yield label, op, _materialise(oargs, device), _spec_args(oargs)


def _backward_specs(fargs, device, mask=(True, True, True)):
    bargs = _backward_case(fargs, device, mask)
    return bargs, [TensorSpec(tuple(a.shape), "float32") if isinstance(a, torch.Tensor) else a for a in bargs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2,4", help="comma-separated intra-op thread counts")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the caching allocator's peak)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", metavar="TEXT", help="only the cases whose label contains TEXT")
    ap.add_argument("--json", default="build/bench/workspace.json", metavar="PATH")
    ap.add_argument("--channels-last", action="store_true",
                    help="4-D operands channels-last, as a fused plan holds a convolution's (its rule then)")
    a = ap.parse_args(argv)
    if a.channels_last:
        LAYOUT["format"] = torch.channels_last
    device = torch.device(a.device)
    probe = Probe(device)
    rows = []
    load = os.getloadavg()
    for threads in (int(t) for t in a.threads.split(",")):
        torch.set_num_threads(threads)
        for label, op, args, specs in cases(device, a.only):
            measured, out_bytes = measure(op, args, probe, a.repeats, device)
            rule = kernel_scratch_bytes(op, specs, out_bytes, threads, a.channels_last)
            rows.append({"case": label, "op": op, "threads": threads, "device": device.type, "measured_bytes": measured,
                         "rule_bytes": rule, "ok": rule + RESOLUTION >= measured, "malloc_isolated": ISOLATED})
            del args
    load_after = os.getloadavg()
    write_json(a.json, rows, load[0], load_after[0])
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"kernel scratch beyond the outputs, measured vs rule ({device.type}, torch "
                    f"{torch.__version__}; MB = 1e6 B; malloc isolated: {ISOLATED}; load {load[0]:.2f})")
    for col in ("case", "threads", "measured MB", "rule MB", "rule - measured", "ok"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["case"], str(r["threads"]), f"{r['measured_bytes'] / 1e6:.3f}", f"{r['rule_bytes'] / 1e6:.3f}",
                  f"{(r['rule_bytes'] - r['measured_bytes']) / 1e6:.3f}", "yes" if r["ok"] else "NO")
    Console(width=140).print(t)
    print(f"wrote {a.json}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
