"""The workbench's sweep: one model on one target, every (budget, deadline, scheduler) combination solved.

The model is traced and lowered once; the training graph travels to the workers as JSON
(`TrainingGraph.to_json`) and each worker rebuilds its liveness once. Solves run in a local process pool.

Files in the output directory:
- `sweep.json`: what was swept (model, target, batch, seed) and the graph's fixed figures (store-all time and
  energy, smallest feasible budget, fixed bytes); a later sweep into the same folder must match it.
- `graph.json`: the lowered training graph (`TrainingGraph.to_json`), for `edgetrain plot`.
- `rows.jsonl`: one JSON row per finished combination, appended (flush + fsync) as each solve finishes;
  a rerun skips the keys already there, so an interrupted sweep resumes without redoing finished solves.
- `solves/<key>.json`: per solved combination, its steps and stage peaks (written before its row).
- `results.csv`, `results.json`: every row, rewritten from `rows.jsonl` at the end of each run.

A combination that does not fit (BudgetError: below the smallest budget, over the deadline, no schedule)
is a row with status `infeasible` and the message; any other failure is a row with status `error`.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
import time
import traceback
import uuid
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
import multiprocessing

from edgetrain.compiler.scheduling.budget import parse_budget, parse_deadline
from edgetrain.compiler.errors import BudgetError, EdgetrainError

DEFAULT_BUDGETS = ("100%", "90%", "80%", "70%", "min")
DEFAULT_DEADLINES = ("none",)  # a deadline is a question of its own: asked for, never implied
DEFAULT_SCHEDULERS = ("poet", "checkmate", "paging", "dtr", "checkpoint")
EXECUTORS = ("local", "ray")  # a process pool, or tasks on a Ray cluster

COLUMNS = (
    "key", "model", "target", "batch_size", "budget", "budget_bytes", "deadline", "deadline_s", "scheduler",
    "status", "schedule", "solver_name", "solver_status", "solver_gap", "solver_seconds", "solver_variables",
    "solver_constraints", "energy_j", "time_s", "peak_bytes", "recomputes", "page_ins", "page_outs",
    "paged_bytes", "wall_s", "time_limit", "error", "error_type", "run_id", "solve_file",
)


@dataclass
class SweepOptions:
    model: str
    target: str
    out: str
    budgets: list[str] = field(default_factory=lambda: list(DEFAULT_BUDGETS))
    deadlines: list[str] = field(default_factory=lambda: list(DEFAULT_DEADLINES))
    schedulers: list[str] = field(default_factory=lambda: list(DEFAULT_SCHEDULERS))
    time_limit: float = 60.0
    batch_size: int = 8
    jobs: int = 2
    solver: str = "auto"
    seed: int = 0
    input_shape: tuple[int, ...] | None = None
    executor: str = "local"  # local: a process pool; ray: tasks on a Ray cluster
    ray_address: str | None = None  # None: a local Ray instance (started here unless one is running)


def split_list(text: str | list[str]) -> list[str]:
    items = text if isinstance(text, list) else str(text).split(",")
    return [s.strip() for s in items if s.strip()]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text.replace("%", "pct")).strip("-") or "x"


def combo_key(budget: str, deadline: str, scheduler: str) -> str:
    """A file-name-safe key: `poet_b60pct_dnone`, `dtr_bmin_d1.2`."""
    return f"{_slug(scheduler)}_b{_slug(budget)}_d{_slug(deadline)}"


def _norm_deadline(text: str) -> str:
    s = str(text).strip().lower()
    return "none" if s in ("none", "-", "") else s


def _check_specs(opts: SweepOptions) -> None:
    from edgetrain.compiler.scheduling.schedulers import SCHEDULERS

    if not opts.budgets or not opts.deadlines or not opts.schedulers:
        raise BudgetError("--budgets, --deadlines and --schedulers each need at least one value")
    for b in opts.budgets:
        if parse_budget(b).device:  # raises BudgetError naming a bad value
            raise BudgetError(f"--budgets {b}: a sweep takes sizes (2MB), percentages (60%) or min; auto is "
                              "compile's default for one microcontroller")
    for d in opts.deadlines:
        if _norm_deadline(d) != "none":
            parse_deadline(d, 1.0)
    for s in opts.schedulers:
        if s not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {s!r} in --schedulers; choose from {', '.join(SCHEDULERS)}")
    if opts.jobs < 1:
        raise ValueError("--jobs must be at least 1")
    if opts.executor not in EXECUTORS:
        raise ValueError(f"unknown executor {opts.executor!r}; choose one of {', '.join(EXECUTORS)}")


# -- workers ---------------------------------------------------------------------------------------------

_W: dict = {}


def _worker_init(graph_json: str, target_dict: dict) -> None:
    from edgetrain.targets.loader import Target

    from edgetrain.compiler.graph.ir import TrainingGraph
    from edgetrain.compiler.graph.liveness import analyze

    g = TrainingGraph.from_json(json.loads(graph_json))
    _W.update(graph=g, lv=analyze(g), target=Target(**target_dict), ident=(hash(graph_json), repr(target_dict)))


def _pool_worker_init(graph_json: str, target_dict: dict) -> None:
    """A pool worker: exits when the sweep that started it dies (a killed parent leaves no orphans solving)."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="edgetrain-parent-watch").start()
    _worker_init(graph_json, target_dict)


def _ray_task(graph_json: str, target_dict: dict, task: dict) -> dict:
    """One solve as a Ray task; a worker process rebuilds the graph only when it changes."""
    if _W.get("ident") != (hash(graph_json), repr(target_dict)):
        _worker_init(graph_json, target_dict)
    return _solve_task(task)


def _run_ray(opts: SweepOptions, graph_json: str, target_dict: dict, todo: list[dict], record) -> None:
    try:
        import ray
    except ImportError:
        raise EdgetrainError("--executor ray needs Ray: pip install 'edgetrain[ray]' (or pip install ray)") from None
    started = False
    if not ray.is_initialized():
        kw = {"address": opts.ray_address} if opts.ray_address else {"num_cpus": opts.jobs}
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False, **kw)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=1)(_ray_task)
        gref, tref = ray.put(graph_json), ray.put(target_dict)
        by_ref = {remote.remote(gref, tref, t): t for t in todo}
        pending = list(by_ref)
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                task = by_ref[ref]
                try:
                    res = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a task that died: record, go on
                    res = {"key": task["key"], "status": "error", "error": f"Ray task failed: {e}",
                           "error_type": type(e).__name__}
                record(task, res)
    except BaseException:
        for ref in list(by_ref) if "by_ref" in locals() else []:
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def _solve_task(task: dict) -> dict:
    """Solve one combination in a worker. Never raises: failures come back as rows."""
    from edgetrain.compiler.scheduling.schedulers import run_scheduler

    t0 = time.perf_counter()
    out = {"key": task["key"], "status": "ok", "error": None, "error_type": None}
    try:
        res = run_scheduler(_W["graph"], _W["lv"], _W["target"], task["budget_bytes"], scheduler=task["scheduler"],
                            deadline_s=task["deadline_s"], time_limit=task["time_limit"], solver=task["solver"])
        rep = res.report
        out.update(schedule=res.name, solver=res.solver, report=rep.to_json(), stage_peaks=rep.stage_peaks,
                   steps=[s.to_json() for s in res.steps])
    except BudgetError as e:
        out.update(status="infeasible", error=str(e), error_type=type(e).__name__)
    except Exception as e:  # noqa: BLE001 - a sweep records every failure as a row
        msg = str(e) if isinstance(e, EdgetrainError) else f"{e}\n{traceback.format_exc(limit=4)}"
        out.update(status="error", error=msg, error_type=type(e).__name__)
    out["wall_s"] = time.perf_counter() - t0
    return out


# -- rows ------------------------------------------------------------------------------------------------

def read_rows(out: str) -> list[dict]:
    """Rows of rows.jsonl in order; a torn last line (a killed write) is ignored; later rows win per key."""
    path = os.path.join(out, "rows.jsonl")
    if not os.path.exists(path):
        return []
    rows: dict[str, dict] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(r, dict) and "key" in r:
                rows.pop(r["key"], None)
                rows[r["key"]] = r
    return list(rows.values())


def _repair_rows(out: str) -> None:
    """Drop a torn last line (a sweep killed mid-write), so the next appended row starts on its own line."""
    path = os.path.join(out, "rows.jsonl")
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)
            f.flush()
            os.fsync(f.fileno())


def _append_row(out: str, row: dict) -> None:
    path = os.path.join(out, "rows.jsonl")
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_results(out: str, order: list[str] | None = None) -> list[dict]:
    rows = read_rows(out)
    if order:
        rank = {k: i for i, k in enumerate(order)}
        rows.sort(key=lambda r: rank.get(r["key"], len(rank)))
    _write_atomic(os.path.join(out, "results.json"), json.dumps(rows, indent=1, default=str))
    tmp = os.path.join(out, "results.csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COLUMNS})
    os.replace(tmp, os.path.join(out, "results.csv"))
    return rows


# -- the sweep -------------------------------------------------------------------------------------------

def run_sweep(opts: SweepOptions, progress=None) -> dict:
    from edgetrain.targets import load_target

    from edgetrain.compiler.graph.liveness import analyze
    from edgetrain.compiler.pipeline import CompileOptions, build_graph, prepare_out_dir
    from edgetrain.compiler.scheduling.budget import anchors

    opts.budgets = split_list(opts.budgets)
    opts.deadlines = [_norm_deadline(d) for d in split_list(opts.deadlines)]
    opts.schedulers = split_list(opts.schedulers)
    _check_specs(opts)
    target = load_target(opts.target)
    prepare_out_dir(opts.out)
    os.makedirs(os.path.join(opts.out, "solves"), exist_ok=True)

    copts = CompileOptions(model=opts.model, target=opts.target, budget="100%", out=opts.out,
                           batch_size=opts.batch_size, input_shape=opts.input_shape, seed=opts.seed,
                           time_limit=opts.time_limit, solver=opts.solver)
    resolved, _model, graph = build_graph(copts, target)
    lv = analyze(graph)
    anchor = anchors(graph, lv, target)
    sa, activation_peak, smallest = anchor.store_all, anchor.activation_peak_bytes, anchor.min_feasible_bytes

    from edgetrain.compiler.graph.ir import GRAPH_FORMAT

    meta = {"model": resolved.spec, "target": target.name, "batch_size": opts.batch_size, "seed": opts.seed,
            "input_shape": list(graph.input_shape[1:]), "solver": opts.solver, "graph_format": GRAPH_FORMAT}
    meta_path = os.path.join(opts.out, "sweep.json")
    if os.path.exists(meta_path):
        try:
            with open(meta_path) as f:
                old = json.load(f)
        except (OSError, json.JSONDecodeError):
            old = None
        if old is not None and {k: old.get(k) for k in meta} != meta:
            diff = ", ".join(f"{k}: {old.get(k)!r} there, {meta[k]!r} now" for k in meta if old.get(k) != meta[k])
            raise EdgetrainError(f"{opts.out} holds a sweep of another configuration ({diff}); resuming it would "
                                 "mix results. Choose another --out.")
    info = dict(meta, nodes=len(graph.nodes), decision_tensors=len(lv.decision), state_bytes=lv.state_bytes,
                fixed_bytes=lv.fixed_bytes, activation_peak_bytes=activation_peak, min_feasible_bytes=smallest,
                store_all_time_s=sa.time_s, store_all_energy_j=sa.energy_j, store_all_peak_bytes=sa.peak_bytes,
                budgets=opts.budgets, deadlines=opts.deadlines, schedulers=opts.schedulers)
    _write_atomic(meta_path, json.dumps(info, indent=1))
    graph_json = json.dumps(graph.to_json())
    _write_atomic(os.path.join(opts.out, "graph.json"), graph_json)

    tasks, order = [], []
    for b in opts.budgets:
        bbytes = parse_budget(b).resolve(anchor)
        for d in opts.deadlines:
            dl = None if d == "none" else parse_deadline(d, sa.time_s)
            for s in opts.schedulers:
                key = combo_key(b, d, s)
                order.append(key)
                tasks.append({"key": key, "budget": b, "budget_bytes": bbytes, "deadline": d, "deadline_s": dl,
                              "scheduler": s, "time_limit": opts.time_limit, "solver": opts.solver})
    if len(set(order)) != len(order):
        raise ValueError("two combinations map to the same key; remove duplicate budgets, deadlines or schedulers")
    _repair_rows(opts.out)
    done = {r["key"] for r in read_rows(opts.out)}
    todo = [t for t in tasks if t["key"] not in done]
    run_id = uuid.uuid4().hex[:12]
    t_start = time.perf_counter()
    if progress:
        progress(f"{len(tasks)} combinations, {len(tasks) - len(todo)} already solved, {len(todo)} to solve")

    def record(task: dict, res: dict) -> None:
        rep = res.get("report") or {}
        sol = res.get("solver") or {}
        row = {
            "key": task["key"], "model": resolved.spec, "target": target.name, "batch_size": opts.batch_size,
            "budget": task["budget"], "budget_bytes": task["budget_bytes"], "deadline": task["deadline"],
            "deadline_s": task["deadline_s"], "scheduler": task["scheduler"], "status": res["status"],
            "schedule": res.get("schedule"), "solver_name": sol.get("name"), "solver_status": sol.get("status"),
            "solver_gap": sol.get("gap"), "solver_seconds": sol.get("seconds"),
            "solver_variables": sol.get("variables"), "solver_constraints": sol.get("constraints"),
            "energy_j": rep.get("energy_j"), "time_s": rep.get("time_s"), "peak_bytes": rep.get("peak_bytes"),
            "recomputes": rep.get("recomputes"), "page_ins": rep.get("page_ins"),
            "page_outs": rep.get("page_outs"), "paged_bytes": rep.get("paged_bytes"),
            "wall_s": res.get("wall_s"), "time_limit": task["time_limit"], "error": res.get("error"),
            "error_type": res.get("error_type"), "run_id": run_id, "solve_file": None,
        }
        if res["status"] == "ok":
            rel = os.path.join("solves", f"{task['key']}.json")
            solve = {"key": task["key"], "row": row, "solver": sol, "report": rep, "stage_peaks": res["stage_peaks"],
                     "steps": res["steps"]}
            _write_atomic(os.path.join(opts.out, rel), json.dumps(solve, default=str))
            row["solve_file"] = rel
        _append_row(opts.out, row)  # the row last: a row on disk means its solve file is complete
        if progress:
            e = "-" if row["energy_j"] is None else f"{row['energy_j']:.6g} J"
            progress(f"{task['key']}: {row['status']} {e}")

    if todo:
        if opts.executor == "ray":
            _run_ray(opts, graph_json, target.to_dict(), todo, record)
        elif opts.jobs == 1:
            _worker_init(graph_json, target.to_dict())
            for t in todo:
                record(t, _solve_task(t))
        else:
            # spawn: the parent has run torch (tracing); forked children of a threaded process can hang.
            ctx = multiprocessing.get_context("spawn")
            by_future = {}
            with ProcessPoolExecutor(max_workers=min(opts.jobs, len(todo)), mp_context=ctx,
                                     initializer=_pool_worker_init, initargs=(graph_json, target.to_dict())) as pool:
                try:
                    by_future = {pool.submit(_solve_task, t): t for t in todo}
                    pending = set(by_future)
                    while pending:
                        finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            task = by_future[fut]
                            try:
                                res = fut.result()
                            except Exception as e:  # noqa: BLE001 - a worker that died: record, go on
                                res = {"key": task["key"], "status": "error", "error": f"worker failed: {e}",
                                       "error_type": type(e).__name__}
                            record(task, res)
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    rows = write_results(opts.out, order)
    grid = set(order)
    mine = [r for r in rows if r["key"] in grid]
    counts: dict[str, int] = {}
    for r in mine:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {
        "out": opts.out, "model": resolved.spec, "target": target.name, "batch_size": opts.batch_size,
        "executor": opts.executor, "combinations": len(tasks), "solved": len(todo), "skipped": len(tasks) - len(todo), "run_id": run_id,
        "status_counts": counts, "min_feasible_bytes": smallest, "store_all_energy_j": sa.energy_j,
        "store_all_time_s": sa.time_s, "wall_s": time.perf_counter() - t_start,
        "results_csv": os.path.join(opts.out, "results.csv"), "results_json": os.path.join(opts.out, "results.json"),
        "rows": mine,
    }


def is_finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
