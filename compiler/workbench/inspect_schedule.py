"""`edgetrain inspect`: what a schedule does, stage by stage, and how it compares with store-all."""
from __future__ import annotations

from collections import Counter

from edgetrain.compiler.graph.ir import TrainingGraph
from edgetrain.compiler.graph.liveness import analyze
from edgetrain.compiler.schedule_file import format as schedule_format
from edgetrain.compiler.graph.tiling import tiled_prefixes
from edgetrain.compiler.scheduling.bound import remedies, smallest_budget_bound


def summarize(out_dir: str) -> dict:
    body = schedule_format.load(out_dir)
    nodes = body["graph"]["nodes"]
    per_stage: dict[int, Counter] = {}
    for s in body["steps"]:
        per_stage.setdefault(s["stage"], Counter())[s["action"]] += 1
    stages = []
    for t, c in sorted(per_stage.items()):
        if c["recompute"] or c["page_in"] or c["page_out"]:
            recs = [s["tensor"] for s in body["steps"] if s["stage"] == t and s["action"] == "recompute"]
            ins = [s["tensor"] for s in body["steps"] if s["stage"] == t and s["action"] == "page_in"]
            outs = [s["tensor"] for s in body["steps"] if s["stage"] == t and s["action"] == "page_out"]
            stages.append({"stage": t, "node": nodes[t]["name"], "kind": nodes[t]["kind"], "recompute": recs,
                           "page_in": ins, "page_out": outs})
    p, sa = body["predicted"], body["store_all"]
    graph = TrainingGraph.from_json(body["graph"])
    bound = smallest_budget_bound(graph, analyze(graph))
    return {
        "model": body["model"]["spec"], "target": body["target"]["name"], "scheduler": body["scheduler"],
        "schedule": body.get("schedule_kind"), "stages": len(nodes), "active_stages": stages,
        "budget_bytes": body["budget"]["bytes"], "min_feasible_bytes": body["budget"]["min_feasible_bytes"],
        "peak_bytes": p["peak_bytes"], "store_all_peak_bytes": sa["peak_bytes"],
        "energy_j": p["energy_j"], "store_all_energy_j": sa["energy_j"],
        "time_s": p["time_s"], "store_all_time_s": sa["time_s"],
        "recomputes": p["recomputes"], "page_ins": p["page_ins"], "page_outs": p["page_outs"],
        "paged_bytes": p["paged_bytes"], "solver": body["solver"],
        "smallest_budget_bound": {**bound.to_json(), "text": bound.text(), "remedies": remedies(bound)},
        "tiled": tiled_prefixes(graph),
    }
