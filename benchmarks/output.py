"""What every benchmark does with its rows: the machine's load stamped on each, and the JSON written whole."""
from __future__ import annotations

import json
import os


def write_json(path: str, obj, load_before: float | None = None, load_after: float | None = None) -> None:
    """Write `obj` (rows, or any JSON value) to `path` through a temporary file and a rename, so a killed run
    leaves no half file; with the 1-minute load averages given, each row (a dict in a list) carries them."""
    if load_before is not None:
        for row in obj:
            row["loadavg_1min_before_after"] = [load_before, load_after]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
