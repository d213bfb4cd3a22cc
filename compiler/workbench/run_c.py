"""`edgetrain run DIR [--qemu]` for C firmware: draw the batches, run the firmware (the C backend's runner:
codegen/c/runner.py, on the host or under QEMU on the target's board), and hold the weights it trained
against PyTorch autograd from the same initial weights and data (with an int8 prefix: the prefix bit for bit against
the integer reference, the head against autograd from that prefix's output, int8_check.py). The run is gated on the
firmware's exit code and status. A plan that reads its input batch from storage patch by patch reports the bytes it
read each step (the driver's reads.bin) beside the compiler's figure.
"""
from __future__ import annotations

import os
from functools import partial

import numpy as np
import torch

from edgetrain.codegen.c.runner import STATUS, run_program, verified_firmware
from .check_rules import ATOL, ROUNDING_FACTOR, RTOL, NearBounds, check_tensors, tensors_of
from .int8_check import Int8Reference, boundary_mismatches
from .reference import train_reference

def run_firmware(out_dir: str, *, qemu: bool, steps: int = 1, data: str = "random", check: bool = False,
                 seed: int = 1, cycle: int | None = None, timeout_s: float = 600.0, corrupt_page: int | None = None,
                 corrupt_step: int = 0) -> dict:
    from .run import schedule_batches

    body, manifest = verified_firmware(out_dir)
    if cycle:  # the first `cycle` batches in turn
        base = schedule_batches(body, data, min(cycle, steps), seed)
        batches = [base[k % len(base)] for k in range(steps)]
    else:
        batches = schedule_batches(body, data, steps, seed)
    ran = run_program(out_dir, body, manifest, batches, qemu=qemu, timeout_s=timeout_s, corrupt_page=corrupt_page,
                      corrupt_step=corrupt_step)
    where, r, missing, sizes = ran.where, ran.result, ran.missing_page, ran.sizes
    result: dict = {
        "ok": ran.exit_code == 0, "build": where, "exit_code": ran.exit_code, "steps": len(batches), "data": data,
        "cycle": cycle,
        "checked": check, "arena_bytes": manifest["arena_bytes"], "budget_bytes": manifest["budget_bytes"],
        "state_bytes": manifest["state_bytes"], "predicted_peak_bytes": manifest["predicted_peak_bytes"],
        "predicted_paged_bytes_per_step": manifest["paged_bytes_per_step"], "max_abs_err": None,
        "max_rel_err": None, "instructions_per_step": None, "waited_for_pid": ran.waited_for,
    }
    result.update(sizes)
    if ran.exit_code not in (0, 3):
        meaning = {1: "the MCU faulted (HardFault/BusFault/...)", 2: "the driver could not read data.bin or "
                   "write its results"}.get(ran.exit_code, "unexpected exit code")
        result["error_kind"] = "FirmwareFault"
        result["error"] = f"the firmware exited with {ran.exit_code} ({where}): {meaning}. {ran.output[-500:]}"
        return result
    done = r["steps_done"]
    if manifest.get("input_in_storage"):  # the batch read from storage patch by patch: its bytes, as streamed weights'
        reads = np.fromfile(os.path.join(out_dir, f"run-{where}", "reads.bin"), dtype="<u4").tolist()
        result.update(predicted_input_read_bytes_per_step=manifest["input_read_bytes_per_step"],
                      input_read_bytes=reads, input_read_bytes_per_step=sum(reads) / len(reads) if reads else None)
    result.update(steps_done=done, losses=r["losses"], status=STATUS.get(r["status"], str(r["status"])),
                  paged_bytes=r["paged_out"] + r["paged_in"],
                  paged_bytes_per_step=(r["paged_out"] + r["paged_in"]) / done if done else None,
                  params_sha256=r["params_sha256"])
    if qemu and done:
        instr = [t * manifest["instructions_per_tick"] for t in r["ticks"]]
        result.update(instructions=instr, instructions_per_step=sum(instr) / len(instr))
    if r["status"] != 0:
        result["ok"] = False
        result["error_kind"] = "FirmwareStatus"
        result["error"] = (f"training step {done} stopped with {result['status']} ({r['status']})"
                           + (": a page failed its CRC check at page-in; the step never used it"
                              if r["status"] == -4 else "")
                           + (f": page file {missing} is missing from the medium" if missing else ""))
        return result
    if check:
        weights = os.path.join(out_dir, "weights.safetensors")
        int8 = Int8Reference(body, weights) if manifest.get("int8_boundary_floats") else None
        try:
            if int8 is not None and manifest.get("qas_grad_floats"):  # int8 bias training: its int32 biases, bit for bit
                grads = np.fromfile(os.path.join(out_dir, f"run-{where}", "qas_grads.bin"), dtype="<f4")
                want = int8.replay_qas(body, grads, batches)
                bad_b = sum(int(np.count_nonzero(r["int32_params"][b] != v.reshape(r["int32_params"][b].shape)))
                            for b, v in want.items())
                result.update(int8_biases=sorted(want), int8_bias_values=sum(v.size for v in want.values()),
                              int8_bias_mismatches=bad_b,
                              int8_biases_moved=sum(int(np.count_nonzero(v != int8.initial[b])) for b, v in want.items()))
                if bad_b:
                    result.update(ok=False, error_kind="CheckMismatch", error=(
                        f"the firmware's int32 biases (int8 bias training) differ from the Python integer reference in "
                        f"{bad_b} of their {result['int8_bias_values']} values after {len(batches)} steps (bit for bit "
                        "expected)"))
                    return result
            if int8 is not None and batches:  # the int8 prefix first: bit for bit, or the head's check means nothing
                bad_bits = boundary_mismatches(r["int8_boundary"], int8.flat(batches[-1][0]))
                result.update(int8_boundary_floats=manifest["int8_boundary_floats"], int8_boundary_mismatches=bad_bits)
                if bad_bits:
                    result.update(ok=False, error_kind="CheckMismatch", error=(
                        f"the firmware's int8 prefix differs from the Python integer reference in {bad_bits} of its "
                        f"{manifest['int8_boundary_floats']} boundary values (bit for bit expected)"))
                    return result
        except OverflowError:  # the integer reference refuses a sum past int32, which the C kernels wrap
            result.update(ok=False, error_kind="Int8Overflow", error=(
                "an int8 convolution's sum leaves int32 in the integer reference (the firmware's kernels wrap it), "
                "so the check cannot hold the firmware to it. With --int8-biases a trained int32 bias moves by lr * "
                "gradient / (s_x * s_w[oc]) a step, a large integer step where the region's activation scales are "
                "tiny (an untrained model's): lower --lr, or fine-tune a trained model"))
            return result
        reference = partial(train_reference, body, weights, batches, torch.device("cpu"),
                            feed=int8.feed if int8 is not None else None)
        model, ref_losses = reference()
        integers = int8.values if int8 is not None else {}  # const in flash, held by the prefix's check

        def held(m) -> dict:
            return {k: t for k, t in tensors_of(m, r["params"]).items() if k not in integers}
        eager = held(model)
        checks = check_tensors(r["params"], eager, lambda: held(reference(dtype=torch.float64)[0]))
        model.eval()  # et_predict is inference: batch norm with its running statistics
        if int8 is not None and int8.per_step is not None and batches:  # the trained region's boundary
            int8.refresh(model, batches[-1][0])
        with torch.no_grad():
            ref_logits = model(batches[-1][0]).reshape(-1) if batches else torch.zeros(0)
        logit_err = float((r["logits"] - ref_logits).abs().max()) if batches else 0.0
        bad = [c for c in checks if c.rule == "failed"]
        result.update(max_abs_err=max((c.max_abs_err for c in checks), default=0.0),
                      max_rel_err=max((c.max_rel_err for c in checks), default=0.0), reference_losses=ref_losses,
                      mismatched=[f"param {c.name}" for c in bad][:20], predict_max_abs_err=logit_err,
                      check_rtol=RTOL, check_atol=ATOL, check_rounding_factor=ROUNDING_FACTOR,
                      within_rtol=sum(c.rule == "rtol" for c in checks),
                      check_tensors=[c.to_json() for c in checks if c.rule != "rtol"])
        if bad:
            near = NearBounds()  # rounding that decides a ReLU mask? The same steps again, watching its inputs
            reference(watch=near)
            result["ok"] = False
            result["error_kind"] = "CheckMismatch"
            result["near_bound_relu_inputs"] = dict(near.counts)
            result["error"] = (f"{len(bad)} tensors differ from autograd beyond rtol={RTOL}, atol={ATOL}, and from a "
                               f"float64 run of the same steps by more than {ROUNDING_FACTOR:g}x eager float32's "
                               f"error: {'; '.join(c.describe() for c in bad[:5])}{near.describe()}")
    return result
