"""The `edgetrain` command: compile, run, inspect. Every command takes --json and then prints one object."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

from edgetrain.compiler.errors import EdgetrainError, InternalError, Interrupted, ValidationError
from edgetrain.codegen.backends import EMITS
from edgetrain.compiler.graph.ir import LOSSES, OptimizerConfig
from edgetrain.runtime.python.optimizers import DEFAULT as DEFAULT_OPTIMIZER, OPTIMIZERS
from edgetrain.compiler.scheduling.interrupt import solvers_running
from edgetrain.compiler.scheduling.milp.registry import CHOICES as SOLVER_CHOICES
from edgetrain.compiler.scheduling.schedulers import REPEATS, SCHEDULERS

from .choices import Choices
from .run_data import NAMED as DATA_SOURCES
from .errors_out import (ANTICIPATED, EXIT_ERROR, EXIT_FAILED, EXIT_INTERNAL, EXIT_INTERRUPTED, describe, dumps,
                         error_object)
from .local_cli import add_compile_options, add_train_parser, compile_local_cmd, inspect_local, train_cmd
from .report import console

EXECUTORS = Choices("edgetrain.compiler.workbench.sweep", "EXECUTORS")


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--input-shape {text!r}: write C,H,W (e.g. 3,32,32)") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"--input-shape {text!r}: dimensions must be positive")
    return dims


def _phases() -> tuple[float, float]:
    """(the first solve's share of --time-limit, what --lns and --cuts may share: the last solve needs some)."""
    from edgetrain.compiler.scheduling.phased import FIRST_SHARE  # imported here: the solver stack is not needed to parse arguments

    return FIRST_SHARE, 1.0 - FIRST_SHARE


def _share(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    first, phases = _phases()
    if not 0.0 <= x < phases:
        raise argparse.ArgumentTypeError(f"{text!r}: a share of the time limit in [0, {phases:g}) (the first "
                                         f"solve takes {first:.0%})")
    return x


def _seconds(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a time limit must be a positive, finite number of seconds")
    return x


def _loss(text: str) -> str:
    if text in LOSSES or (":" in text and text.rpartition(":")[0].endswith(".py")):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: choose one of {', '.join(LOSSES)} or give path/file.py:fn")


def _betas(text: str) -> tuple[float, float]:
    try:
        b1, b2 = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--betas {text!r}: write beta1,beta2 (e.g. 0.9,0.999)") from None
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise argparse.ArgumentTypeError(f"--betas {text!r}: each must lie in [0, 1)")
    return b1, b2


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return n


def _fraction(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= x < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: a share of the data in [0, 1), e.g. 0.1")
    return x


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error under --json still prints one JSON object (then exits 2 as argparse does)."""

    json_errors = False
    argv: list[str] = []

    def error(self, message: str):
        m = re.match(r"argument (--[\w-]+): expected one argument", message)
        if m:  # `--budget -1MB`: argparse reads a value that starts with '-' as another option
            opt = m.group(1)
            k = _Parser.argv.index(opt) if opt in _Parser.argv else -1
            if 0 <= k < len(_Parser.argv) - 1 and _Parser.argv[k + 1].startswith("-"):
                val = _Parser.argv[k + 1]
                message = (f"{opt} {val}: a value starting with '-' is read as an option, so {opt} got none; "
                           f"a negative value is not allowed here (to pass it anyway, write {opt}={val})")
        if _Parser.json_errors:
            print(json.dumps(error_object("UsageError", message)))
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="edgetrain", description="Compile PyTorch training to fit a device's memory.")
    p.add_argument("--debug", action="store_true",
                   help="on a failure, print the traceback too (accepted anywhere on the command line)")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    c = sub.add_parser("compile", help="model -> validated schedule -> generated plan")
    c.add_argument("model", help="zoo name, path/file.py:factory or package.module:attr")
    c.add_argument("--target", required=True)
    c.add_argument("--budget", default="auto",
                   help="2MB, 512KiB, 1.5GB, B%% of plain backprop's peak (100%%: plain backprop), min (the smallest feasible budget) or "
                        "auto (the default; microcontroller targets only: the RAM less the firmware's stack, runtime "
                        "and batch buffers)")
    c.add_argument("--deadline", help="multiple of the store-all time (1.2) or seconds (0.5s)")
    c.add_argument("--scheduler", default="poet",
                   choices=list(SCHEDULERS), help="; ".join(f"{k}: {v}" for k, v in SCHEDULERS.items()))
    c.add_argument("--batch-size", type=_positive_int, default=8)
    c.add_argument("--input-shape", type=_shape)
    c.add_argument("--time-limit", type=_seconds, default=60.0,
                   help="seconds for the whole compile, tracing included; the solve gets at least half of it")
    c.add_argument("--solver", default="auto", choices=SOLVER_CHOICES,
                   help="MILP backend (default auto: Gurobi with a full license, else HiGHS)")
    c.add_argument("--lns", type=_share, default=0.0,
                   help="share of --time-limit for large-neighbourhood search when the first 20%% does not prove "
                        "the gap (e.g. 0.45; default 0: one solve)")
    c.add_argument("--cuts", type=_share, default=0.0,
                   help="with --lns: most share of --time-limit for window and memory cuts before the last solve "
                        "(e.g. 0.15)")
    c.add_argument("--repeats", default="auto", choices=REPEATS,
                   help="repeated blocks (decoder layers): reuse solves one block's decisions for every identical "
                        "block, each decided from its own backward on; flat solves every stage; auto (default) "
                        "reuses where the flat model would be large")
    c.add_argument("--loss", default="cross_entropy", type=_loss,
                   help=f"{', '.join(LOSSES)} (the model's forward(x, y) returns the loss) or path/file.py:fn")
    c.add_argument("--optimizer", default=DEFAULT_OPTIMIZER, choices=OPTIMIZERS)
    c.add_argument("--lr", type=float, help=f"learning rate ({_takers('lr')})")
    c.add_argument("--momentum", type=float, help=_takers("momentum"))
    c.add_argument("--nesterov", action="store_const", const=True, help=f"Nesterov momentum ({_takers('nesterov')})")
    c.add_argument("--weight-decay", type=float, help=_takers("weight_decay"))
    c.add_argument("--betas", type=_betas, help=f"beta1,beta2 ({_takers('betas')})")
    c.add_argument("--eps", type=float, help=_takers("eps"))
    c.add_argument("--train", metavar="PATTERNS",
                   help="which parameters train, the rest frozen: comma-separated fnmatch patterns over parameter "
                        "names ('classifier.*,features.16.*'), biases (names ending in bias), last:N (the last N "
                        "modules with parameters) or all; default: the model's requires_grad flags")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--quantize-frozen", choices=["int8"],
                   help="with --emit c: run the frozen forward prefix (convolutions, ReLU/ReLU6, residual adds from the "
                        "input on) in int8, per-channel weights, the trained head in float32 from its dequantised "
                        "output; activation ranges measured on 4 batches of --calibrate")
    c.add_argument("--int8-biases", action="store_true",
                   help="with --quantize-frozen int8 --emit c: the int8 region goes on over the convolutions whose "
                        "bias alone trains (--train), their int32 biases trained in integers by QAS SGD")
    c.add_argument("--calibrate", default="random", metavar="SOURCE",
                   help="with --quantize-frozen: the batches its activation ranges come from: random (the default: "
                        "standard normal, what `run --data random` trains on), fashion-mnist or digits")
    c.add_argument("--emit", default="python", choices=list(EMITS),
                   help="python: a plan for the torch runtime (Jetson, Pi, host); c: C training firmware for "
                        "runtime/c (Cortex-M: plan.c/plan.h, drivers, Makefile)")
    exact = c.add_mutually_exclusive_group()
    exact.add_argument("--fuse", action="store_true",
                       help="Python plans: run chains of pointwise ops, and batch norms' recomputes from their held "
                            "statistics, as kernels torch's inductor generates (compiled at the plan's first step, kept "
                            "for the process); checked within a tolerance, not bitwise")
    exact.add_argument("--exact", action="store_true",
                       help="every op torch's own eager kernel, bitwise as autograd (the default)")
    c.add_argument("--out", required=True)
    c.add_argument("--json", action="store_true")
    add_compile_options(c)
    r = sub.add_parser("run", help="execute a compiled plan")
    r.add_argument("dir")
    length = r.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_positive_int, help="training steps (default 1)")
    length.add_argument("--epochs", type=_positive_int, help="passes over a dataset (not with random data)")
    r.add_argument("--data", default="random", metavar="SOURCE",
                   help=f"{', '.join(DATA_SOURCES)}, a .npz or .safetensors file with arrays x and y, or a "
                        "folder with one sub-folder of images per class")
    r.add_argument("--eval-data", metavar="SOURCE",
                   help="held-out data measured as each epoch ends (a dataset, a file or a folder, as --data)")
    r.add_argument("--holdout", type=_fraction, metavar="FRACTION",
                   help="without --eval-data: the share of --data kept out of training to measure it on (default "
                        "0.1; 0: none)")
    r.add_argument("--save", metavar="OUT.safetensors",
                   help="write the trained weights (the model's own state_dict keys) and, beside them, "
                        "OUT.state.safetensors (weights, optimizer state, step: what --resume reads)")
    r.add_argument("--save-trained", action="store_true",
                   help="with --save: write only the parameters that train (a LoRA model's adapters) to "
                        "OUT.safetensors, under the model's own keys (load_state_dict(strict=False) takes them "
                        "back); the state file still holds everything --resume needs")
    r.add_argument("--resume", action="store_true",
                   help="with --save: continue from the state in that file, if it exists: the steps it holds "
                        "count towards --steps/--epochs, so rerunning a killed command finishes it exactly as an "
                        "uninterrupted run would have")
    r.add_argument("--save-every", type=_positive_int, metavar="N",
                   help="with --save: also save every N steps (what --resume continues from after a kill)")
    r.add_argument("--check", action="store_true", help="compare with PyTorch autograd from the same weights and data")
    r.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    r.add_argument("--seed", type=int, default=1, help="seed of the data")
    r.add_argument("--qemu", action="store_true",
                   help="C firmware: build with arm-none-eabi-gcc and run on a Cortex-M4F under qemu-system-arm "
                        "(default for C firmware: build and run on the host)")
    r.add_argument("--cycle", type=_positive_int,
                   help="C firmware: train on the first N batches in turn (a memorization check: the loss falls)")
    r.add_argument("--timeout", type=_seconds, default=600.0, help="C firmware: seconds before the run is stopped")
    r.add_argument("--inject-corrupt-page", type=int, metavar="ID",
                   help="C firmware, fault injection: flip a bit of page ID on the medium right after the first "
                        "step pages it out (the CRC check must stop the step)")
    r.add_argument("--json", action="store_true")
    i = sub.add_parser("inspect", help="what a schedule does")
    i.add_argument("dir")
    i.add_argument("--json", action="store_true")
    w = sub.add_parser("sweep", help="solve every (budget, deadline, scheduler) combination; CSV and JSON results")
    w.add_argument("model", help="zoo name, path/file.py:factory or package.module:attr")
    w.add_argument("--target", required=True)
    w.add_argument("--budgets", default="100%,90%,80%,70%,min",
                   help="comma-separated budgets: sizes (2MB), percentages (60%%) or min (the smallest feasible)")
    w.add_argument("--deadlines", default="none",
                   help="comma-separated deadlines: none (the default), multiples of the store-all time (1.2) or "
                        "seconds (0.5s)")
    w.add_argument("--schedulers", default="poet,checkmate,paging,dtr,checkpoint")
    w.add_argument("--time-limit", type=_seconds, default=60.0, help="solver time limit per solve, seconds")
    w.add_argument("--batch-size", type=_positive_int, default=8)
    w.add_argument("--input-shape", type=_shape)
    w.add_argument("--solver", default="auto", choices=SOLVER_CHOICES)
    w.add_argument("--jobs", type=_positive_int, default=2,
                   help="solves at once (local process pool; with --executor ray, the CPUs of a local Ray instance)")
    w.add_argument("--executor", default="local", choices=EXECUTORS,
                   help="local: a process pool; ray: tasks on a Ray cluster (pip install ray)")
    w.add_argument("--ray-address", help="with --executor ray: the cluster to join (ray.init(address=...)); "
                   "default: a local Ray instance")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--out", required=True, help="results folder; a rerun into it resumes the sweep")
    w.add_argument("--json", action="store_true")
    add_train_parser(sub)
    pl = sub.add_parser("plot", help="figures of a sweep (PNG and SVG) in DIR/plots/ and a self-contained "
                        "DIR/report.html")
    pl.add_argument("dir")
    pl.add_argument("--solve", metavar="KEY", help="the solve to draw schedule matrices and memory for "
                    "(default: POET at the tightest budget); keys are in results.csv")
    pl.add_argument("--memory-steps", action="store_true",
                    help="memory figure: one column per runtime step instead of one bar per stage at its peak")
    pl.add_argument("--json", action="store_true")
    return p


def _cmd_compile(a) -> dict:
    from edgetrain.compiler.pipeline import CompileOptions, compile_model
    from .calibration import calibration_of

    if a.calibrate != "random" and a.quantize_frozen is None:
        raise EdgetrainError(f"--calibrate {a.calibrate} chooses the batches an int8 prefix is calibrated on: give "
                             "--quantize-frozen int8 too, or drop it")
    if a.mode == "local":
        if a.int8_biases:
            raise EdgetrainError("--int8-biases trains an int8 backbone's biases in backprop's plan (--mode poet); "
                                 "--mode local trains every layer: drop one of them")
        if a.quantize_frozen is not None:
            raise EdgetrainError("--quantize-frozen makes an int8 prefix for backprop's plan (--mode poet); --mode "
                                 "local trains every layer: drop one of them")
        if a.train is not None:
            raise EdgetrainError("--train selects what backprop trains; --mode local trains every layer block by "
                                 "block: drop --train or use --mode poet")
        if a.json or not sys.stderr.isatty():
            return compile_local_cmd(a, _optimizer(a))
        with console(stderr=True).status("compiling (local learning)") as status:
            return compile_local_cmd(a, _optimizer(a), progress=lambda msg: status.update(msg))

    if a.cuts > 0 and a.lns == 0:
        raise EdgetrainError("--cuts works inside the phased solve: give --lns too (e.g. --lns 0.45 --cuts 0.15)")
    first, phases = _phases()
    if a.lns + a.cuts >= phases:
        raise EdgetrainError(f"--lns {a.lns} and --cuts {a.cuts} leave no time for the last solve (the first "
                             f"takes {first:.0%}): keep their sum below {phases:g}")
    opts = CompileOptions(model=a.model, target=a.target, budget=a.budget, out=a.out, scheduler=a.scheduler,
                          deadline=a.deadline, batch_size=a.batch_size, input_shape=a.input_shape,
                          time_limit=a.time_limit, solver=a.solver, loss=a.loss, seed=a.seed, emit=a.emit,
                          lns=a.lns, cuts=a.cuts, train=a.train, repeats=a.repeats, fuse=a.fuse,
                          optimizer=_optimizer(a), quantize_frozen=a.quantize_frozen, calibrate=a.calibrate,
                          int8_biases=a.int8_biases,
                          calibration=calibration_of(a.calibrate))
    if a.json or not sys.stderr.isatty():  # a log or a pipe: one line per step, as it happens
        return compile_model(opts, progress=_progress_line)
    with console(stderr=True).status("compiling") as status:
        return compile_model(opts, progress=lambda msg: status.update(msg))


def _progress_line(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


OPTIMIZER_SETTINGS = ("lr", "momentum", "nesterov", "weight_decay", "betas", "eps")  # each is an option: --weight-decay


def _takers(setting: str) -> str:
    """Which optimizers take a setting, with their defaults (`--help`): 'sgd 0.01, adam/adamw 0.001'."""
    by_default: dict[str, list[str]] = {}
    for name, unit in OPTIMIZERS.items():
        if setting in unit.defaults:
            v = unit.defaults[setting]
            by_default.setdefault(",".join(map(str, v)) if isinstance(v, tuple) else str(v), []).append(name)
    return ", ".join("/".join(names) if v in ("True", "False") else f"{'/'.join(names)} {v}"
                     for v, names in by_default.items())


def _optimizer(a) -> OptimizerConfig:
    """The optimizer's settings: those given, else its unit's defaults. An option the optimizer does not take is
    refused rather than ignored."""
    given = {k: getattr(a, k) for k in OPTIMIZER_SETTINGS if getattr(a, k) is not None}
    unit = OPTIMIZERS[a.optimizer]
    for k in given:
        if k not in unit.defaults:
            takers = [n for n, u in OPTIMIZERS.items() if k in u.defaults]
            raise EdgetrainError(f"--{k.replace('_', '-')} is not a setting of {a.optimizer}; drop it, or use "
                                 f"{' or '.join(f'--optimizer {n}' for n in takers)}")
    problem = unit.check(unit.settings(given))
    if problem:
        raise EdgetrainError(f"--optimizer {a.optimizer}: {problem}")
    return OptimizerConfig.of(a.optimizer, **given)


def _cmd_run(a) -> dict:
    from .run import run_plan
    from edgetrain.codegen.c.runner import is_c_plan

    from .run_c import run_firmware

    if is_c_plan(a.dir):
        if a.epochs or a.save or a.resume or a.save_every or a.save_trained:
            raise EdgetrainError("--epochs, --save and --resume train with the Python runtime; C firmware "
                                 "takes --steps")
        return run_firmware(a.dir, qemu=a.qemu, steps=a.steps or 1, data=a.data, check=a.check, seed=a.seed,
                            cycle=a.cycle, timeout_s=a.timeout, corrupt_page=a.inject_corrupt_page)
    if a.qemu or a.cycle or a.inject_corrupt_page is not None:
        raise EdgetrainError(f"{a.dir} holds a plan for the Python runtime; --qemu, --cycle and "
                             "--inject-corrupt-page need C firmware: compile with `--emit c`")
    from .run import epoch_line

    opts = dict(steps=a.steps, epochs=a.epochs, data=a.data, check=a.check, device=a.device, seed=a.seed,
                save=a.save, resume=a.resume, save_every=a.save_every, save_trained=a.save_trained,
                eval_data=a.eval_data, holdout=a.holdout,
                on_epoch=None if a.json else lambda rec: print(epoch_line(rec), flush=True))
    if a.json or not sys.stderr.isatty():
        return run_plan(a.dir, **opts)
    from rich.progress import Progress

    with Progress(console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("training steps", total=None)
        return run_plan(a.dir, **opts, progress=lambda k, n: bar.update(task, completed=k, total=n))


def _cmd_inspect(a) -> dict:
    from edgetrain.compiler.schedule_file import format as schedule_format
    from edgetrain.runtime.python.integrity import verify_folder
    from .inspect_schedule import summarize

    body = schedule_format.load(a.dir)
    verify_folder(a.dir)  # the files beside the schedule are the ones compile wrote
    return inspect_local(body) if body.get("mode") == "local" else summarize(a.dir)


def _cmd_train(a) -> dict:
    return train_cmd(a, console(stderr=True))


def _cmd_sweep(a) -> dict:
    from .sweep import SweepOptions, run_sweep

    opts = SweepOptions(model=a.model, target=a.target, out=a.out, budgets=a.budgets, deadlines=a.deadlines,
                        schedulers=a.schedulers, time_limit=a.time_limit, batch_size=a.batch_size, jobs=a.jobs,
                        solver=a.solver, seed=a.seed, input_shape=a.input_shape, executor=a.executor,
                        ray_address=a.ray_address)
    if a.json or not sys.stderr.isatty():
        return run_sweep(opts)
    with console(stderr=True).status("sweeping") as status:
        return run_sweep(opts, progress=lambda msg: status.update(msg))


def _cmd_plot(a) -> dict:
    from .plot import plot_sweep

    r = plot_sweep(a.dir, solve=a.solve, memory_steps=a.memory_steps)
    r.pop("data")  # the drawn data is for callers in Python; the command reports files
    return r


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while a failure or the result was being reported
        print("edgetrain: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    if solvers_running():  # a solver stopped by Ctrl-C still winding down in C: the process does not wait for it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _interrupted(a) -> str:
    """What an aborted command leaves: compile writes nothing, the previous output stays whole."""
    if a.cmd == "compile":
        return f"nothing was written, {a.out} is as it was"
    return "stopped"


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # anywhere on the line: show the traceback of a failure
    argv = [x for x in argv if x != "--debug"]
    _Parser.json_errors = "--json" in argv
    _Parser.argv = argv
    a = _parser().parse_args(argv)
    handlers = {"compile": _cmd_compile, "run": _cmd_run, "inspect": _cmd_inspect, "sweep": _cmd_sweep,
                "plot": _cmd_plot,
                "train": _cmd_train}
    as_json = getattr(a, "json", False)
    try:
        result = handlers[a.cmd](a)
    except Interrupted as e:  # Ctrl-C during the solve, before any schedule fitted
        return _fail(a.cmd, "Interrupted", f"{e}: {_interrupted(a)}", as_json, debug, EXIT_INTERRUPTED)
    except InternalError as e:  # edgetrain refused its own work: say so, and what to report
        return _fail(a.cmd, "internal", str(e), as_json, debug, EXIT_INTERNAL)
    except ValidationError as e:
        if a.cmd != "compile":
            return _fail(a.cmd, *describe(e), as_json, debug, EXIT_ERROR)
        # compile validates only schedules it built itself: a refusal there is a bug, not the user's input
        return _fail(a.cmd, "internal", str(InternalError("a schedule it built breaks the memory model", e)),
                     as_json, debug, EXIT_INTERNAL)
    except ANTICIPATED as e:  # a message for the user: no traceback unless --debug
        kind, message = describe(e)
        return _fail(a.cmd, kind, message, as_json, debug, EXIT_ERROR)
    except SystemExit as e:  # sys.exit() inside a model file or a plan: reported, not a silent exit
        return _fail(a.cmd, "UnexpectedExit", f"the model file or plan called sys.exit({e.code!r}) while "
                     "edgetrain was running it; remove the call (a model file must only define the model)",
                     as_json, debug, EXIT_ERROR)
    except KeyboardInterrupt:  # Ctrl-C outside the solve (tracing, writing), or a second one
        return _fail(a.cmd, "Interrupted", f"interrupted (Ctrl-C): {_interrupted(a)}", as_json, debug,
                     EXIT_INTERRUPTED)
    except Exception as e:  # a bug: still one JSON object, and always the traceback
        return _fail(a.cmd, "internal", f"{type(e).__name__}: {e} (an edgetrain bug; please report it with the "
                     "traceback above)", as_json, True, EXIT_INTERNAL)
    result.setdefault("ok", True)  # every --json object says whether the command succeeded
    if not result["ok"] and isinstance(result.get("error"), str):  # one error shape for every failure
        result["error"] = {"kind": result.pop("error_kind", "Failed"), "message": result["error"]}
    if a.json:
        print(dumps(result))
    else:
        from .report import print_human

        print_human(a.cmd, result)
    return 0 if result.get("ok", True) else EXIT_FAILED


def _fail(cmd: str, kind: str, message: str, as_json: bool, debug: bool, code: int) -> int:
    if debug:
        import traceback

        traceback.print_exc()
    if as_json:
        print(dumps(error_object(kind, message)))
    print(f"edgetrain {cmd}: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
