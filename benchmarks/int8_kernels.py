"""int8 kernels against float32 on a Cortex-M under QEMU: instructions per MAC, plain int8, fast int8 (SMLAD), float32.

    .venv/bin/python benchmarks/int8_kernels.py [--boards mps2-an386,mps2-an500] [--json build/bench/int8_kernels.json]

Builds runtime/c/selftest/q8_selftest.c for each board with arm-none-eabi-gcc (the board's CPU flags, -O2) and runs
it under `qemu-system-arm -M <machine> -icount shift=0`, where the board's timer counts a fixed number of
instructions a tick. Every case runs the plain and the fast int8 kernel and the float32 kernel of the same shape;
every int8 result is first held bit for bit against the numpy reference (runtime/python/int8_reference.py) - a
row whose bits differ is reported and fails the run. Prints a table and writes JSON: per board, case and direction
(forward, input gradient, weight gradient), the instructions of each variant, per MAC (conv, linear) or per output
element (pools, activations), and the speed-ups. Instruction counts are not cycles: SMLAD is one instruction for
two multiply-adds, a float VFMA one for one.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.output import write_json  # noqa: E402
from edgetrain.runtime.python import int8_reference as ref  # noqa: E402
from edgetrain.targets.boards import load_board  # noqa: E402

C_DIR = os.path.join(ROOT, "runtime", "c")
HARNESS = os.path.join(C_DIR, "selftest", "q8_selftest.c")
WARN = ["-Wall", "-Wextra", "-Werror", "-std=c99", "-pedantic", "-Wvla"]
KIND = {1: "conv", 2: "linear", 3: "maxpool", 4: "avgpool", 5: "relu", 6: "relu6"}
DIRECTIONS = ("forward", "input_grad", "weight_grad")  # the ticks page: 3 variants each (plain, fast, float32)
VARIANTS = ("int8", "int8_fast", "float32")
BOARDS = ("mps2-an386", "mps2-an500")  # the Cortex-M4F and the Cortex-M7
MIN_MACS, MIN_ELEMENTS = 4096, 1024  # the measured cases' least work (a tick is 40 instructions)
APT = "apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm"
QEMU_ARGS = ["-nographic", "-monitor", "none", "-semihosting-config", "enable=on,target=native", "-icount", "shift=0"]


def sources(mcu: bool) -> list[str]:
    """The whole runtime (the float32 kernels are measured too) with one storage back end."""
    skip = "storage_stdio.c" if mcu else "storage_semihost.c"
    return [p for p in sorted(glob.glob(os.path.join(C_DIR, "*.c")) + glob.glob(os.path.join(C_DIR, "kernels", "*.c")))
            if os.path.basename(p) != skip]


def build_host(out: str, page_dir: str, emulate_dsp: bool) -> str:
    """The harness for this host; `emulate_dsp` builds the fast kernels with the DSP helpers in plain C."""
    exe = os.path.join(out, "q8_selftest_fast" if emulate_dsp else "q8_selftest")
    cmd = ["gcc", *WARN, "-O2", "-ffp-contract=off", *(["-DET_Q8_EMULATE_DSP"] if emulate_dsp else []),
           f"-I{C_DIR}", f'-DPAGE_DIR="{page_dir}"', HARNESS, *sources(False), "-o", exe, "-lm"]
    _check(subprocess.run(cmd, capture_output=True, text=True), cmd)
    return exe


def build_board(out: str, page_dir: str, board) -> str:
    """The harness for a board's CPU, timed by its timer, linked with its port."""
    port = os.path.join(C_DIR, "port", board.port)
    elf = os.path.join(out, f"q8_selftest_{board.name}.elf")
    cmd = ["arm-none-eabi-gcc", *WARN, *board.cpu_flags.split(), "-O2", "-ffp-contract=off", f"-I{C_DIR}",
           f'-DPAGE_DIR="{page_dir}"', f"-DQ8_TIMER_BASE={board.timer_base:#x}u", HARNESS, *sources(True),
           os.path.join(port, "startup.c"), "--specs=nano.specs", "--specs=rdimon.specs", "-nostartfiles",
           "-T", os.path.join(port, "link.ld"), "-lm", "-o", elf]
    _check(subprocess.run(cmd, capture_output=True, text=True), cmd)
    return elf


def run_host(exe: str) -> None:
    _check(subprocess.run([exe], capture_output=True, text=True, timeout=300), [exe])


def run_board(elf: str, board) -> None:
    cmd = ["qemu-system-arm", "-M", board.qemu_machine, *QEMU_ARGS, "-kernel", elf]
    _check(subprocess.run(cmd, capture_output=True, text=True, timeout=300), cmd)


def _check(res: subprocess.CompletedProcess, cmd: list[str]) -> None:
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed with {res.returncode}:\n{res.stdout}{res.stderr}")


def toolchain_missing() -> str | None:
    missing = [t for t in ("arm-none-eabi-gcc", "qemu-system-arm") if shutil.which(t) is None]
    return f"{', '.join(missing)} not found ({APT})" if missing else None


# -- the pages ---------------------------------------------------------------------------------------------------

def _page(page_dir: str, page_id: int) -> bytes | None:
    path = os.path.join(page_dir, f"et_page_{page_id:08x}.bin")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        raw = f.read()
    magic, pid, size, crc = struct.unpack_from("<4I", raw)
    if (magic, pid, size) != (0x47505445, page_id, len(raw) - 16) or zlib.crc32(raw[16:], zlib.crc32(raw[:12])) != crc:
        raise ValueError(f"{path}: not an intact page block")
    return raw[16:]


def read_cases(page_dir: str) -> list[dict]:
    """Every case the harness paged out: its header, int8/int32 arrays by slot, and the ticks."""
    count = np.frombuffer(_page(page_dir, 0xFFFF00), "<i4")[0]
    cases = []
    for k in range(count):
        def arr(slot, dtype, k=k):
            raw = _page(page_dir, (k + 1) * 256 + slot)
            return None if raw is None else np.frombuffer(raw, dtype).copy()
        head = arr(0, "<i4")
        cases.append({"kind": KIND[int(head[-1])], "head": head, "arr": arr, "ticks": arr(20, "<u4")})
    return cases


def _conv_geometry(h: np.ndarray) -> dict:
    n, c_in, h_in, w_in, c_out, h_out, w_out, k_h, k_w, sh, sw, ph, pw, dh, dw, groups = (int(v) for v in h[:16])
    return dict(n=n, c_in=c_in, hw_in=(h_in, w_in), c_out=c_out, hw_out=(h_out, w_out), k=(k_h, k_w), stride=(sh, sw),
                pad=(ph, pw), dil=(dh, dw), groups=groups)


def expected(case: dict) -> dict[str, np.ndarray]:
    """The numpy reference's results for a case, keyed by the slot names they are compared with."""
    h, arr, kind = case["head"], case["arr"], case["kind"]
    i8 = lambda slot: arr(slot, "i1")  # noqa: E731
    if kind == "conv":
        g = _conv_geometry(h)
        x = i8(1).reshape(g["n"], g["c_in"], *g["hw_in"])
        w = i8(2).reshape(g["c_out"], g["c_in"] // g["groups"], *g["k"])
        gy = i8(6).reshape(g["n"], g["c_out"], *g["hw_out"])
        x_zp, out_zp, act_min, act_max = (int(v) for v in h[16:20])
        q = ref.Requant(arr(4, "<i4"), arr(5, "<i4"), out_zp, act_min, act_max)
        gq = ref.Requant(arr(7, "<i4"), arr(8, "<i4"))
        geo = dict(stride=g["stride"], padding=g["pad"], dilation=g["dil"], groups=g["groups"])
        gw, gb = ref.conv2d_backward_weight(gy, x, x_zp, g["k"], **geo)
        return {"y": ref.conv2d_forward(x, x_zp, w, arr(3, "<i4"), q, **geo),
                "gx": ref.conv2d_backward_input(gy, w, gq, g["hw_in"], **geo), "gw": gw, "gb": gb}
    if kind == "linear":
        n, fin, fout, x_zp, out_zp = (int(v) for v in h[:5])
        x, w, gy = i8(1).reshape(n, fin), i8(2).reshape(fout, fin), i8(6).reshape(n, fout)
        gw, gb = ref.linear_backward_weight(gy, x, x_zp)
        return {"y": ref.linear_forward(x, x_zp, w, arr(3, "<i4"), ref.Requant(arr(4, "<i4"), arr(5, "<i4"), out_zp)),
                "gx": ref.linear_backward_input(gy, w, ref.Requant(arr(7, "<i4"), arr(8, "<i4"))), "gw": gw, "gb": gb}
    if kind in ("maxpool", "avgpool"):
        n, c, h_in, w_in, h_out, w_out, k_h, k_w, sh, sw, ph, pw, dh, dw, incl = (int(v) for v in h[:15])
        x, gy = i8(1).reshape(n, c, h_in, w_in), i8(6).reshape(n, c, h_out, w_out)
        if kind == "maxpool":
            y, idx = ref.maxpool2d_forward(x, (k_h, k_w), (sh, sw), (ph, pw), (dh, dw))
            return {"y": y, "idx": idx, "gx": ref.maxpool2d_backward(gy, idx, (h_in, w_in))}
        zp = int(h[15])
        return {"y": ref.avgpool2d_forward(x, zp, (k_h, k_w), (sh, sw), (ph, pw), bool(incl)),
                "gx": ref.avgpool2d_backward(gy, (h_in, w_in), (k_h, k_w), (sh, sw), (ph, pw), bool(incl))}
    count, zp, q6 = (int(v) for v in h[:3])
    x, gy = i8(1), i8(6)
    if kind == "relu":
        y = ref.relu_forward(x, zp)
        return {"y": y, "gx": ref.relu_backward(gy, y, zp)}
    y = ref.relu6_forward(x, zp, q6)
    return {"y": y, "gx": ref.relu6_backward(gy, y, zp, q6)}


# slot of each result, plain and fast (None: the kernel has no fast variant)
RESULT_SLOTS = {"y": (10, 11, "i1"), "gx": (12, 13, "i1"), "gw": (14, 15, "<i4"), "gb": (16, 17, "<i4"),
                "idx": (18, None, "<i4")}


def mismatches(case: dict) -> list[str]:
    """Which of a case's C results (plain, fast) differ from the numpy reference; [] when every bit agrees."""
    bad = []
    for name, want in expected(case).items():
        plain, fast, dtype = RESULT_SLOTS[name]
        for label, slot in (("plain", plain), ("fast", fast)):
            got = None if slot is None else case["arr"](slot, dtype)
            if got is None:
                continue
            if not np.array_equal(got, want.reshape(-1)):
                bad.append(f"{case['kind']} {name} ({label}): {int((got != want.reshape(-1)).sum())} of {got.size} differ")
    return bad


def work_units(case: dict) -> tuple[int, str]:
    """(count, unit) the instructions are divided by: MACs of a conv or linear layer, output elements otherwise."""
    h = case["head"]
    if case["kind"] == "conv":
        g = _conv_geometry(h)
        return g["n"] * g["c_out"] * g["hw_out"][0] * g["hw_out"][1] * g["c_in"] // g["groups"] * g["k"][0] * g["k"][1], "MAC"
    if case["kind"] == "linear":
        return int(h[0] * h[1] * h[2]), "MAC"
    if case["kind"] in ("maxpool", "avgpool"):
        return int(h[0] * h[1] * h[4] * h[5]), "output"
    return int(h[0]), "element"


def describe(case: dict) -> str:
    h = case["head"]
    if case["kind"] == "conv":
        g = _conv_geometry(h)
        kind = "depthwise" if g["groups"] == g["c_in"] == g["c_out"] else f"{g['k'][0]}x{g['k'][1]}"
        return (f"conv {kind} {g['c_in']}->{g['c_out']} {g['hw_in'][0]}x{g['hw_in'][1]} s{g['stride'][0]}"
                + (f" d{g['dil'][0]}" if g["dil"][0] > 1 else "") + (f" g{g['groups']}" if 1 < g["groups"] != g["c_in"] else ""))
    if case["kind"] == "linear":
        return f"linear {h[1]}->{h[2]} n{h[0]}"
    if case["kind"] in ("maxpool", "avgpool"):
        return f"{case['kind']} {h[6]}x{h[7]} s{h[8]} {h[1]}ch {h[2]}x{h[3]}"
    return f"{case['kind']} {h[0]}"


def rows_of(cases: list[dict], board, measured_from: int = 0) -> list[dict]:
    """One row per measured case and direction: instructions per variant and per work unit."""
    rows = []
    for case in cases:
        units, unit = work_units(case)
        ticks = case["ticks"]
        if units < (MIN_MACS if unit == "MAC" else MIN_ELEMENTS):
            continue  # the small shapes reach every code path; too short to time against the timer's tick
        for d, direction in enumerate(DIRECTIONS):
            instr = {v: int(ticks[3 * d + i]) * board.instructions_per_tick for i, v in enumerate(VARIANTS)}
            if not any(instr.values()):
                continue
            row = {"board": board.name, "case": describe(case), "kind": case["kind"], "direction": direction,
                   "unit": unit, "units": units, **{f"{v}_instructions": instr[v] or None for v in VARIANTS}}
            for v in VARIANTS:
                row[f"{v}_per_{unit.lower()}"] = instr[v] / units if instr[v] else None
            if instr["int8_fast"] and instr["int8"]:
                row["fast_speedup_vs_plain"] = instr["int8"] / instr["int8_fast"]
            best = instr["int8_fast"] or instr["int8"]
            if best and instr["float32"]:
                row["int8_speedup_vs_float32"] = instr["float32"] / best
            rows.append(row)
    return rows


def run_board_cases(board, work: str) -> tuple[list[dict], list[str]]:
    """Build and run the harness on `board` under QEMU; its cases and every bit that differs from the reference."""
    page_dir = os.path.join(work, f"pages-{board.name}")
    os.makedirs(page_dir)
    run_board(build_board(work, page_dir, board), board)
    cases = read_cases(page_dir)
    return cases, [m for c in cases for m in mismatches(c)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boards", default=",".join(BOARDS), help="comma-separated boards of targets/boards/")
    ap.add_argument("--json", default="build/bench/int8_kernels.json", metavar="PATH")
    a = ap.parse_args(argv)
    missing = toolchain_missing()
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    rows, bad = [], []
    with tempfile.TemporaryDirectory(prefix="edgetrain-int8-") as work:
        for name in a.boards.split(","):
            board = load_board(name)
            cases, wrong = run_board_cases(board, work)
            bad += [f"{board.name}: {m}" for m in wrong]
            rows += rows_of(cases, board)
    write_json(a.json, rows)
    head = f"{'board':11} {'case':34} {'direction':12} {'int8':>7} {'fast':>7} {'float32':>7} {'fast/plain':>10} {'f32/int8':>9}"
    print("instructions per MAC (conv, linear) or per output element (pools, activations), QEMU -icount")
    print(head)
    print("-" * len(head))
    fmt = lambda v: f"{v:7.2f}" if v else "      -"  # noqa: E731
    ratio = lambda v: f"{v:.2f}x" if v else "-"  # noqa: E731
    for r in rows:
        u = r["unit"].lower()
        print(f"{r['board']:11} {r['case']:34} {r['direction']:12} {fmt(r[f'int8_per_{u}'])} {fmt(r[f'int8_fast_per_{u}'])} "
              f"{fmt(r[f'float32_per_{u}'])} {ratio(r.get('fast_speedup_vs_plain')):>10} "
              f"{ratio(r.get('int8_speedup_vs_float32')):>9}")
    print(f"wrote {a.json}")
    for m in bad:
        print(f"NOT BIT-IDENTICAL: {m}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
