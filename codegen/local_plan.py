"""Render a local-learning schedule (``mode: local``) as the Jetson Python plan the runtime's Controller runs."""
from __future__ import annotations

import os

from edgetrain.compiler.schedule_file.format import content_hash  # the schedule format, not a solver

from .python_plan import _py
from .templating import environment

_ENV = environment("templates")
_ENV.filters.update(py=_py)


def render_local_plan(schedule: dict, out_dir: str, schedule_file: str = "schedule.json") -> str:
    if schedule.get("mode") != "local":
        raise ValueError("render_local_plan: the schedule is not a local-learning schedule")
    local = schedule["local"]
    blocks = [{"index": b["index"], "batch": b["batch"], "layers": [lb["index"] for lb in b["layers"]],
               "peak_bytes": b["peak_bytes"]} for b in local["partition"]["blocks"]]
    text = _ENV.get_template("local_plan.py.j2").render(
        s=schedule, local=local, blocks=blocks, schedule_file=schedule_file, content=content_hash(schedule))
    path = os.path.join(out_dir, "plan.py")
    with open(path, "w") as f:
        f.write(text)
    return path
