"""Human output: whole lines when piped (nothing wraps mid-phrase), one way to print a gap, values never read as
markup, and CLI choices read from the registries they name."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.codegen.backends import EMITS
from edgetrain.compiler.schedule_file.format import MODES
from edgetrain.compiler.scheduling.milp.registry import CHOICES
from edgetrain.compiler.scheduling.schedulers import SCHEDULERS
from edgetrain.compiler.workbench import cli
from edgetrain.compiler.workbench.report import console, losses, percent

ROOT = Path(__file__).resolve().parents[1]
GAP = re.compile(r"gap (-|\d+\.\d{3}%)")


def _edgetrain(*args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "edgetrain.compiler.workbench.cli", *args], cwd=ROOT, timeout=300,
                       capture_output=True, text=True)  # piped: not a terminal
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("out") / "small_cnn"
    text = _edgetrain("compile", "small_cnn", "--target", "rpi4", "--budget", "min", "--batch-size", "8", "--out",
                      str(out))
    return out, text


def test_compile_prints_whole_lines_and_the_chosen_budget(compiled):
    _, text = compiled
    lines = text.splitlines()
    assert len(lines) == 4, text  # one line per fact, none broken at 80 columns
    assert re.match(r"small_cnn on rpi4: \d+ stages", lines[0]) and GAP.search(lines[0]) and lines[0].endswith(" s)")
    assert re.match(r"budget min = \d+\.\d{3} MB \(smallest feasible \d+\.\d{3} MB\)", lines[1]), lines[1]
    smallest = re.search(r"smallest feasible (\S+) MB", lines[1]).group(1)
    assert lines[1].startswith(f"budget min = {smallest} MB")  # min is the smallest feasible budget
    assert max(len(line) for line in lines) > 80  # they would have wrapped at 80 columns


def test_inspect_prints_the_gap_as_compile_does(compiled):
    out, text = compiled
    shown = _edgetrain("inspect", str(out))
    compile_gap = GAP.search(text).group(1)
    assert f"gap {compile_gap}," in shown.splitlines()[-1]


@pytest.mark.parametrize("gap, text", [(None, "-"), (0.0, "0.000%"), (0.007345779367011404, "0.735%"), (1.0, "100.000%")])
def test_one_way_to_print_a_gap(gap, text):
    assert percent(gap) == text


def test_non_finite_losses_are_printed_not_eaten_as_markup(capsys):
    con = console()
    con.print(f"losses {losses([float('nan'), 1.25, float('inf')])}")
    assert capsys.readouterr().out.strip() == "losses [nan, 1.2500, inf]"


@pytest.mark.parametrize("device, cudnn, said", [("cpu", None, False), ("cuda:0", False, True), ("cuda:0", True, False)])
def test_a_checked_run_says_when_cudnn_was_off_for_it(capsys, device, cudnn, said):
    """On CUDA a checked run trains both sides without cuDNN (run.py: eager batch norm would take cuDNN's kernel);
    the line says so, so a user does not read the check as cuDNN's."""
    from edgetrain.compiler.workbench.report import print_human

    r = {"steps": 2, "device": device, "losses": [1.0, 0.5], "measured_peak_bytes": 10, "predicted_peak_bytes": 10,
         "budget_bytes": 12, "paged_bytes": 0, "checked": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "ok": True,
         "cudnn": cudnn}
    print_human("run", r)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("check against autograd"))
    assert ("(both sides with cuDNN off)" in line) is said and line.endswith("-> OK")


def _choices(parser, command: str, option: str) -> list[str]:
    sub = next(a for a in parser._actions if a.dest == "cmd").choices[command]
    action = next(a for a in sub._actions if option in a.option_strings)
    return list(action.choices)


def test_cli_choices_are_the_registries():
    from edgetrain.compiler.local.memory_lines import METHODS
    from edgetrain.compiler.workbench.data import DATASETS
    from edgetrain.compiler.workbench.run import DATA_SOURCES
    from edgetrain.compiler.workbench.sweep import EXECUTORS
    from edgetrain.runtime.python.activation_cache import CACHE_DTYPES
    from edgetrain.runtime.python.optim import OPTIMIZERS

    p = cli._parser()
    assert _choices(p, "compile", "--scheduler") == list(SCHEDULERS)
    assert _choices(p, "compile", "--solver") == list(CHOICES) == _choices(p, "sweep", "--solver")
    assert _choices(p, "compile", "--optimizer") == list(OPTIMIZERS)
    assert _choices(p, "compile", "--emit") == list(EMITS)
    assert _choices(p, "compile", "--mode") == list(MODES)
    assert _choices(p, "compile", "--profile") == list(METHODS)
    assert _choices(p, "compile", "--cache-dtype") == list(CACHE_DTYPES)
    run = next(a for a in p._actions if a.dest == "cmd").choices["run"]
    data_help = next(a for a in run._actions if "--data" in a.option_strings).help
    assert all(name in data_help for name in DATA_SOURCES)  # the rest: files and folders of the user's own
    train = next(a for a in p._actions if a.dest == "cmd").choices["train"]
    train = next(a for a in train._actions if "--data" in a.option_strings)
    assert all(name in train.help for name in DATASETS)  # and the user's own files and folders, as run takes
    assert _choices(p, "sweep", "--executor") == list(EXECUTORS)
