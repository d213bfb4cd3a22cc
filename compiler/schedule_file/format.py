"""The schedule file: versioned JSON, checked against a JSON Schema and a checksum on load.

The schedule is the contract between the compiler and codegen: it holds everything codegen needs (the
graph's nodes with their kernels and attributes, the ordered steps) and the predictions to hold the run
against. Loading rejects another format version, a corrupt file and a hand-edited one, with the fix.
"""
from __future__ import annotations

import hashlib
import json
import os
from importlib import resources

import jsonschema

from edgetrain.compiler import __version__
from edgetrain.compiler.errors import ScheduleFormatError
from edgetrain.runtime.python.integrity import json_checksum
from edgetrain.runtime.python.optimizers import OPTIMIZERS

FORMAT = "edgetrain.schedule"
# 2: a `mode` field ("poet" or "local") and the local-learning section (`local`: layers, heads, partition).
FORMAT_VERSION = 2
FILENAME = "schedule.json"


def _schema() -> dict:
    schema = json.loads(resources.files(__package__).joinpath("schema.json").read_text())
    # An optimizer is one the runtime has a unit for (runtime/python/optimizers), not a list kept here.
    schema["properties"]["graph"]["properties"]["optimizer"]["properties"]["name"] = {"enum": list(OPTIMIZERS)}
    return schema


def _checksum(body: dict) -> str:
    return json_checksum(body)  # the runtime checks it too, before it trusts the `outputs` section


# What each mode's plan is made of: "poet" is one backprop step scheduled by the MILP (or a baseline),
# "local" is NeuroFlux's block-wise local learning.
PLAN_FIELDS = {
    "poet": ("format", "version", "edgetrain", "mode", "model", "target", "budget", "graph", "steps", "seed"),
    "local": ("format", "version", "edgetrain", "mode", "model", "target", "budget", "local", "seed"),
}


MODES = tuple(PLAN_FIELDS)


def content_hash(body: dict) -> str:
    """Hash of what a generated plan is made of (not the solver's wall time), so plans are reproducible."""
    canon = json.dumps({k: body[k] for k in PLAN_FIELDS[body["mode"]]}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def _target_section(target) -> dict:
    """The device profile, without its file path: a schedule must not depend on where the checkout lies."""
    return {k: v for k, v in target.to_dict().items() if k != "path"}


def backprop_body(*, spec: str, kwargs: dict, graph, target, budget_text: str, budget_bytes: int, anchor,
                  decision_tensors: int, deadline_s: float | None, scheduled, scheduler: str,
                  seed: int, backend: str) -> dict:
    """The body of a backprop schedule (`mode: poet`): the graph, its steps and what they are predicted to cost."""
    return {
        "edgetrain": __version__,
        "mode": "poet",
        "model": {"spec": spec, "kwargs": kwargs, "input_shape": list(graph.input_shape[1:]),
                  "num_classes": graph.num_classes, "loss": graph.loss,
                  **({"input_dtype": graph.input_dtype, "input_high": graph.input_high}
                     if graph.input_dtype != "float32" else {})},
        "target": _target_section(target),
        "budget": {"spec": budget_text, "bytes": budget_bytes, "min_feasible_bytes": anchor.min_feasible_bytes,
                   "fixed_bytes": anchor.fixed_bytes, "activation_peak_bytes": anchor.activation_peak_bytes,
                   "deadline_s": deadline_s},
        "graph": graph.to_json(),
        "summary": dict(graph.summary(), decision_tensors=decision_tensors),
        "steps": [s.to_json() for s in scheduled.steps],
        "predicted": scheduled.report.to_json(),
        "store_all": anchor.store_all.to_json(),
        "solver": scheduled.solver,
        "scheduler": scheduler,
        "schedule_kind": scheduled.name,
        "seed": seed,
        "backend": backend,
    }


def local_body(*, spec: str, kwargs: dict, input_shape: list[int], num_classes: int, target, budget_text: str,
               budget_bytes: int, min_feasible_bytes: int, local: dict, seed: int) -> dict:
    """The body of a local-learning schedule (`mode: local`): layers, heads and their partition into blocks."""
    return {
        "edgetrain": __version__,
        "mode": "local",
        "model": {"spec": spec, "kwargs": kwargs, "input_shape": list(input_shape), "num_classes": num_classes,
                  "loss": "cross_entropy"},
        "target": _target_section(target),
        "budget": {"spec": budget_text, "bytes": budget_bytes, "min_feasible_bytes": min_feasible_bytes,
                   "deadline_s": None},
        "local": local,
        "seed": seed,
    }


def dumps(body: dict) -> str:
    body = dict(body, format=FORMAT, version=FORMAT_VERSION)
    body["checksum"] = _checksum(body)
    jsonschema.validate(body, _schema())
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def save(body: dict, out_dir: str) -> str:
    path = os.path.join(out_dir, FILENAME)
    text = dumps(body)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # never leave a half-written schedule behind
    return path


def load(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, FILENAME)
    try:
        with open(path) as f:
            body = json.load(f)
    except FileNotFoundError:
        raise ScheduleFormatError(f"{path}: no schedule here; run `edgetrain compile ... --out DIR` first") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ScheduleFormatError(f"{path}: corrupt schedule (not valid JSON: {e}); recompile it with "
                                  "`edgetrain compile`") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ScheduleFormatError(f"{path}: not an edgetrain schedule (format field is {body.get('format')!r} "
                                  f"instead of {FORMAT!r})" if isinstance(body, dict) else f"{path}: not an edgetrain schedule")
    if body.get("version") != FORMAT_VERSION:
        raise ScheduleFormatError(f"{path}: schedule format version {body.get('version')!r}, but this edgetrain "
                                  f"reads version {FORMAT_VERSION}; recompile the model with this edgetrain")
    if body.get("checksum") != _checksum(body):
        raise ScheduleFormatError(f"{path}: checksum mismatch: the schedule was edited or corrupted after it "
                                  "was written; recompile it with `edgetrain compile` instead of editing it")
    try:
        jsonschema.validate(body, _schema())
    except jsonschema.ValidationError as e:
        raise ScheduleFormatError(f"{path}: schedule does not match the format: {e.message} at "
                                  f"{'/'.join(map(str, e.absolute_path))}") from None
    return body
