"""The package layout is a contract: what each stage may import.

- The four code folders import under one root: compiler/ is `edgetrain.compiler`, codegen/ `edgetrain.codegen`,
  runtime/ `edgetrain.runtime`, targets/ `edgetrain.targets`; every package folder is installed.
- runtime/ never imports compiler/, codegen/ or targets/ (a device installs the runtime alone, with torch,
  safetensors and xxhash), nor the compiler's own dependencies (a solver, jinja2, jsonschema).
- codegen/ never imports a scheduler, the POET/MILP passes or a solver: it renders a schedule, never solves one.
- targets/ imports nothing from compiler/, codegen/ or runtime/: it is the leaf every stage may use.
- No import runs back up the pipeline: frontend -> graph -> scheduling and local learning -> schedule file ->
  codegen -> the compile drivers -> the workbench. A stage imports its own and earlier stages, and the shared
  leaves (errors, targets, runtime), never a later one.

Each rule is checked twice: statically (an AST scan of every import, relative ones resolved) and dynamically
(a fresh interpreter with the forbidden modules blocked by a meta path hook does the stage's real work).
"""
from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgetrain.compiler.pipeline import CompileOptions, compile_model

ROOT = Path(__file__).resolve().parents[1]

FOLDERS = {"compiler": "edgetrain.compiler", "codegen": "edgetrain.codegen", "runtime": "edgetrain.runtime",
           "targets": "edgetrain.targets"}
RUNTIME_FORBIDDEN = ("edgetrain.compiler", "edgetrain.codegen", "edgetrain.targets", "highspy", "jinja2",
                     "jsonschema", "gurobipy", "pulp", "ortools")
CODEGEN_FORBIDDEN = ("edgetrain.compiler.scheduling", "edgetrain.compiler.pipeline", "edgetrain.compiler.workbench",
                     "highspy", "gurobipy", "pulp", "ortools", "scipy.optimize", "pyscipopt")
TARGETS_FORBIDDEN = ("edgetrain.compiler", "edgetrain.codegen", "edgetrain.runtime")
# The pipeline's stages in the order data flows through them; modules of one tuple share a rank.
STAGES = (
    ("edgetrain.compiler.frontend",),
    ("edgetrain.compiler.graph",),
    ("edgetrain.compiler.scheduling", "edgetrain.compiler.local"),
    ("edgetrain.compiler.schedule_file",),
    ("edgetrain.codegen",),
    ("edgetrain.compiler.pipeline", "edgetrain.compiler.pipeline_local", "edgetrain.compiler.output_dir",
     "edgetrain.compiler.passes", "edgetrain.compiler.stages", "edgetrain.compiler.model_graph"),
    ("edgetrain.compiler.workbench",),
)
# What every stage may use: the user's errors, the package's version, device profiles, the device runtime.
SHARED = ("edgetrain.compiler.errors", "edgetrain.targets", "edgetrain.runtime")


# -- the static scan ------------------------------------------------------------------------------------

def _package_of(path: Path) -> str:
    """A module's package under the edgetrain root; __init__.py's is its folder."""
    parts = path.relative_to(ROOT).parts[:-1]
    return ".".join((FOLDERS[parts[0]],) + parts[1:])


def _module_of(path: Path) -> str:
    return _package_of(path) if path.name == "__init__.py" else f"{_package_of(path)}.{path.stem}"


def imports_of(source: str, package: str, filename: str = "<src>") -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, a module of `package`.

    `from a import b` yields both `a` and `a.b` (b may be a submodule). Dynamic imports through
    importlib.import_module / __import__ with a literal name count too.
    """
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    raise AssertionError(f"{filename}:{node.lineno}: relative import beyond the top-level package")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call):
            fn = ast.unparse(node.func)
            if fn in ("importlib.import_module", "import_module", "__import__") and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    return out


def _matches(module: str, forbidden: tuple[str, ...]) -> str | None:
    return next((f for f in forbidden if module == f or module.startswith(f + ".")), None)


def violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, folder
    found = []
    for f in files:
        for line, mod in imports_of(f.read_text(), _package_of(f), str(f)):
            if _matches(mod, forbidden):
                found.append(f"{f.relative_to(ROOT)}:{line}: imports {mod}")
    return found


@pytest.mark.parametrize("source, package, bad", [
    ("from edgetrain.compiler.graph.ir import Node", "edgetrain.runtime.python", "edgetrain.compiler.graph.ir"),
    ("import edgetrain.compiler", "edgetrain.runtime.python", "edgetrain.compiler"),
    ("import edgetrain.codegen.python_plan as p", "edgetrain.runtime", "edgetrain.codegen.python_plan"),
    ("def f():\n    from edgetrain.compiler import pipeline", "edgetrain.runtime.python", "edgetrain.compiler.pipeline"),
    ("import importlib\nimportlib.import_module('edgetrain.compiler.workbench.run')", "edgetrain.runtime.python",
     "edgetrain.compiler.workbench.run"),
    ("from .. import compiler", "edgetrain.codegen.sub", "edgetrain.codegen.compiler"),  # stays inside the package
    ("from ..scheduling import schedulers", "edgetrain.compiler.graph", "edgetrain.compiler.scheduling.schedulers"),
    ("from .milp.highs import solve", "edgetrain.compiler.scheduling", "edgetrain.compiler.scheduling.milp.highs"),
])
def test_the_scan_resolves_imports(source, package, bad):
    assert bad in [m for _, m in imports_of(source, package)]


def test_the_scan_flags_a_forbidden_import(tmp_path):
    assert _matches("edgetrain.compiler.graph.ir", RUNTIME_FORBIDDEN) == "edgetrain.compiler"
    assert _matches("edgetrain.compilers", RUNTIME_FORBIDDEN) is None
    assert _matches("edgetrain.compiler.scheduling.milp.highs", CODEGEN_FORBIDDEN) == "edgetrain.compiler.scheduling"
    assert _matches("edgetrain.compiler.schedule_file.format", CODEGEN_FORBIDDEN) is None  # codegen reads the format
    assert _package_of(ROOT / "runtime" / "python" / "executor.py") == "edgetrain.runtime.python"
    assert _package_of(ROOT / "runtime" / "python" / "__init__.py") == "edgetrain.runtime.python"
    with pytest.raises(AssertionError, match="beyond the top-level package"):
        imports_of("from ....compiler import ir", "edgetrain.runtime.python")


def test_runtime_never_imports_compiler_codegen_or_targets():
    assert not violations("runtime", RUNTIME_FORBIDDEN)


def test_codegen_never_imports_a_solver():
    assert not violations("codegen", CODEGEN_FORBIDDEN)


def test_only_the_solver_registry_reaches_a_solver():
    """Every solve goes through compiler/scheduling/milp/registry.py: outside milp/, nothing imports a solver
    package or a backend's adapter (so `--solver` holds for every solve, the sub-solves included)."""
    from edgetrain.compiler.scheduling.milp.registry import SOLVERS

    adapters = tuple(sorted({b.solve.__module__ for b in SOLVERS.values()}))
    assert "edgetrain.compiler.scheduling.milp.highs" in adapters
    forbidden = ("highspy", "gurobipy", "ortools", "scipy.optimize", "pyscipopt", "pulp") + adapters
    found = [v for v in violations("compiler", forbidden) if not v.startswith("compiler/scheduling/milp/")]
    assert not found
    assert _matches("edgetrain.compiler.scheduling.milp.highs", forbidden)  # `from .milp import highs` is caught


def test_targets_import_nothing_from_the_other_stages():
    assert not violations("targets", TARGETS_FORBIDDEN)


def _rank(module: str) -> int | None:
    for k, stage in enumerate(STAGES):
        if _matches(module, stage):
            return k
    return None


def backward_imports(sources: dict[Path, str]) -> list[str]:
    """Imports from a stage to a later one, and modules that belong to no stage and are not shared."""
    found = []
    for f, text in sources.items():
        me = _module_of(f)
        mine = _rank(me)
        if mine is None:
            if me not in ("edgetrain.compiler", "edgetrain.codegen") and not _matches(me, SHARED):
                found.append(f"{f.relative_to(ROOT)}: belongs to no stage (add it to STAGES or SHARED)")
            continue
        for line, mod in imports_of(text, _package_of(f), str(f)):
            theirs = _rank(mod)
            if theirs is not None and theirs > mine:
                found.append(f"{f.relative_to(ROOT)}:{line}: {me} (stage {mine}) imports {mod} (stage {theirs})")
    return found


def test_no_import_runs_back_up_the_pipeline():
    files = [f for folder in ("compiler", "codegen") for f in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 40
    assert not backward_imports({f: f.read_text() for f in files})


def test_the_stage_rule_flags_an_import_of_a_later_stage_and_a_module_of_no_stage():
    assert _rank("edgetrain.compiler.graph.ir") < _rank("edgetrain.compiler.scheduling.poet")
    assert _rank("edgetrain.codegen.c.firmware") < _rank("edgetrain.compiler.pipeline")
    probe = ROOT / "compiler" / "graph" / "probe.py"
    assert backward_imports({probe: "from ..scheduling.poet import build\nfrom .ir import Node\n"}) == [
        "compiler/graph/probe.py:1: edgetrain.compiler.graph.probe (stage 1) imports "
        "edgetrain.compiler.scheduling.poet (stage 2)",
        "compiler/graph/probe.py:1: edgetrain.compiler.graph.probe (stage 1) imports "
        "edgetrain.compiler.scheduling.poet.build (stage 2)"]
    assert backward_imports({ROOT / "compiler" / "helpers.py": ""}) == [
        "compiler/helpers.py: belongs to no stage (add it to STAGES or SHARED)"]


# -- one room per backend ----------------------------------------------------------------------------------

BACKEND_BRANCH = re.compile(r"""\b(emit|backend(\.name)?)\s*[!=]=\s*["'](c|python)["']""")


def backend_branches(sources: dict[Path, str]) -> list[str]:
    """Lines that ask which backend they hold (`emit == "c"`, `backend.name != "python"`, ...)."""
    return [f"{f.relative_to(ROOT)}:{k}: {line.strip()}" for f, text in sources.items()
            for k, line in enumerate(text.splitlines(), 1) if BACKEND_BRANCH.search(line)]


def test_the_compiler_never_branches_on_the_backend():
    """The pipeline asks the backend it holds (codegen/backend.py); no module of compiler/ asks which it is."""
    files = sorted((ROOT / "compiler").rglob("*.py"))
    assert not backend_branches({f: f.read_text() for f in files})
    probe = ROOT / "compiler" / "probe.py"
    assert backend_branches({probe: 'if opts.emit == "c":\n    pass\nx = opts.emit != \'c\'\n'}) == [
        'compiler/probe.py:1: if opts.emit == "c":', "compiler/probe.py:3: x = opts.emit != 'c'"]


def test_no_backend_lives_under_the_compiler():
    """The C backend's op table, lowering and device fit are codegen/c's: no C module under compiler/graph, and
    compiler/ reaches codegen/c only from the workbench's CLI glue (`edgetrain run` of firmware)."""
    assert not sorted(p.name for p in (ROOT / "compiler" / "graph").glob("c_*.py"))
    assert (ROOT / "codegen" / "c" / "ops.py").exists() and (ROOT / "codegen" / "c" / "lower.py").exists()
    outside = [f for f in sorted((ROOT / "compiler").rglob("*.py")) if "workbench" not in f.parts]
    reach = [f"{f.relative_to(ROOT)}:{line}: {mod}" for f in outside
             for line, mod in imports_of(f.read_text(), _package_of(f), str(f))
             if _matches(mod, ("edgetrain.codegen.c",))]
    assert not reach, reach


def test_every_package_folder_is_installed():
    """pyproject.toml lists the packages by hand (the folders map under the edgetrain root): none forgotten."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {_package_of(init) for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")}
    assert found == listed


# -- the dynamic checks -----------------------------------------------------------------------------------

BLOCKER = """\
import importlib.abc, sys
BLOCKED = {blocked!r}

class Blocker(importlib.abc.MetaPathFinder):
    attempts = []

    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            Blocker.attempts.append(name)
            raise ModuleNotFoundError(f"blocked by test_layout: {{name}}")
        return None

sys.meta_path.insert(0, Blocker())
"""


def _run_blocked(blocked: tuple[str, ...], body: str) -> dict:
    code = BLOCKER.format(blocked=blocked) + textwrap.dedent(body) + textwrap.dedent("""
        leaked = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))
        print(json.dumps(dict(result, leaked=leaked, attempts=Blocker.attempts)))
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["leaked"] == [] and out["attempts"] == [], out
    return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("layout") / "small_cnn"
    compile_model(CompileOptions(model="small_cnn", target="rpi4", budget="85%", out=str(out), batch_size=2))
    return out


def test_the_blocker_blocks():
    code = BLOCKER.format(blocked=("edgetrain.compiler",)) + "import edgetrain.compiler.graph.ir\n"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "blocked by test_layout: edgetrain.compiler" in p.stderr


def test_runtime_runs_a_generated_plan_without_compiler_or_codegen(compiled, tmp_path):
    body = json.loads((compiled / "schedule.json").read_text())
    out = _run_blocked(RUNTIME_FORBIDDEN, f"""
        import json, math, warnings
        import torch
        from edgetrain.runtime.python import load_plan, runtime_for

        warnings.simplefilter("error")  # a plan that leaves tensors resident fails here
        plan = load_plan({str(compiled)!r})
        rt = runtime_for(plan, storage_dir={str(tmp_path / "pages")!r}, device="cpu")
        g = torch.Generator().manual_seed(0)
        x = torch.randn(*plan.PLAN["input_shape"], generator=g)
        y = torch.randint(0, {body["model"]["num_classes"]}, (x.shape[0],), generator=g)
        before = {{k: v.clone() for k, v in rt.params.items()}}
        rt.begin_step(x, y)
        loss = plan.train_step(rt)
        changed = sum(not torch.equal(before[k], v) for k, v in rt.params.items())
        result = dict(loss=loss, peak=rt.ledger.peak_bytes, changed=changed, n_params=len(before),
                      predicted=plan.PLAN["predicted_peak_bytes"], paged=rt.paged_bytes)
    """)
    assert isinstance(out["loss"], float) and math.isfinite(out["loss"]) and out["loss"] > 0
    assert out["changed"] == out["n_params"] > 0  # every parameter was updated by the step
    assert out["peak"] == out["predicted"] == body["predicted"]["peak_bytes"]
    assert (out["paged"] > 0) == (body["predicted"]["page_ins"] > 0)  # the page store needs no compiler either


def test_codegen_renders_a_plan_without_any_solver(compiled, tmp_path):
    out = _run_blocked(CODEGEN_FORBIDDEN, f"""
        import json
        from edgetrain.codegen import render_python_plan

        body = json.loads(open({str(compiled / "schedule.json")!r}).read())
        path = render_python_plan(body, {str(tmp_path)!r})
        result = dict(path=path)
    """)
    assert Path(out["path"]).read_text() == (compiled / "plan.py").read_text()


def test_targets_load_without_the_other_stages_or_torch():
    out = _run_blocked(TARGETS_FORBIDDEN + ("torch", "numpy"), """
        import json
        from edgetrain.targets import list_targets, load_target

        names = [n for n in list_targets() if n != "host"]  # measuring the host needs torch, by design
        costs = {n: load_target(n).page_in_time_s(1_000_000) for n in names}
        result = dict(names=names, costs=costs)
    """)
    assert "rpi4" in out["names"] and len(out["names"]) >= 5
    assert all(c > 0 for c in out["costs"].values())


def test_no_import_circles():
    """Modules import each other one way: the import graph of the four folders (every import, also inside a
    function) has no cycle."""
    import networkx as nx

    g = nx.DiGraph()
    files = [f for folder in FOLDERS for f in sorted((ROOT / folder).rglob("*.py"))]
    known = {_module_of(f) for f in files}
    for f in files:
        me = _module_of(f)
        g.add_node(me)
        for _, mod in imports_of(f.read_text(), _package_of(f), str(f)):
            if mod in known and mod != me and not me.startswith(mod + "."):  # a package's face is not a circle
                g.add_edge(me, mod)
    cycles = list(nx.simple_cycles(g))
    assert not cycles, cycles[:3]


def test_every_backend_answers_the_interface():
    """Each backend of the table has every member the pipeline asks for (codegen/backend.py's Backend)."""
    from edgetrain.codegen.backend import Backend
    from edgetrain.codegen.backends import BACKENDS, EMITS

    members = {m for m in vars(Backend) if not m.startswith("_")} | set(Backend.__annotations__)
    assert {"name", "lower", "render", "device_room", "weight_room"} <= members
    for name, b in BACKENDS.items():
        assert b.name == name and all(hasattr(b, m) for m in members), name
    assert EMITS == ("python", "c")
