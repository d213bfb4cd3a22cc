"""The README's quick start runs as written, and prints what the README shows.

Every `$ edgetrain ...` line in the code blocks of README.md's "Quick start" section runs with this
environment's `edgetrain` in a temporary folder (the `--out` folder of the first command is moved there), must
exit 0, and must print the lines the README shows after it, compared with every number masked: the figures
may move with the solver's speed, the words and the layout may not.

To refresh the README after a change of the CLI's output: `python tests/test_readme.py` prints the quick
start's commands with their real output, in the same environment as this test.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTION = "## Quick start"
PROMPT = "$ "
# The README's output is captured in this environment too: a fixed terminal width, and no GPU, so that the
# run says "on cpu" and autograd's reference is the CPU one.
ENV = {"COLUMNS": "100", "CUDA_VISIBLE_DEVICES": "", "NO_COLOR": "1"}
NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d+)*|\.\d+)(?:[eE][-+]?\d+)?")
BOX_RUN = re.compile(r"([─━═])\1+")  # a table's rules are as wide as its columns' numbers


def quick_start(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown after it) for each `$ ` line of the quick-start section's plain code
    blocks (a block with a language, such as ```python, is an excerpt, not a transcript)."""
    if SECTION not in text:
        raise AssertionError(f"README.md has no {SECTION!r} section")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    runs: list[tuple[str, list[str]]] = []
    fenced, transcript, current = False, False, None
    for line in section.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            transcript, current = fenced and line.strip() == "```", None
            continue
        if not transcript:
            continue
        if line.startswith(PROMPT):
            current = (line[len(PROMPT):], [])
            runs.append(current)
        elif current is not None:
            current[1].append(line)
    for _, lines in runs:
        while lines and not lines[-1].strip():
            lines.pop()
    return runs


def normalize(line: str) -> str:
    """A line with every number masked, table rules shortened and runs of blanks made one."""
    line = BOX_RUN.sub(r"\1", NUMBER.sub("#", line))
    return " ".join(line.split())


def differences(expected: list[str], actual: list[str]) -> list[str]:
    """Where the real output departs from the README's, numbers masked; empty when they agree."""
    want = [normalize(x) for x in expected]
    got = [normalize(x) for x in actual]
    out = [f"line {k + 1}: README {expected[k]!r}\n        real   {actual[k]!r}"
           for k, (w, g) in enumerate(zip(want, got)) if w != g]
    if len(want) != len(got):
        out.append(f"README shows {len(want)} lines, the command printed {len(got)}")
    return out


def out_dir(runs: list[tuple[str, list[str]]]) -> str:
    """The folder the quick start compiles into (the first command's --out)."""
    args = shlex.split(runs[0][0])
    return args[args.index("--out") + 1]


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    args = shlex.split(command)
    assert args[0] == "edgetrain", f"the quick start runs edgetrain only: {command!r}"
    exe = Path(sys.executable).with_name("edgetrain")
    return subprocess.run([str(exe), *args[1:]], cwd=cwd, env={**os.environ, **ENV}, capture_output=True,
                          text=True, timeout=120)


def rewritten(runs: list[tuple[str, list[str]]], where: Path) -> list[tuple[str, list[str]]]:
    """The runs with their output folder inside `where`. A relative folder already is (the commands run in
    `where`, and the output keeps its line lengths); an absolute one is replaced, in commands and output."""
    old = out_dir(runs)
    if not os.path.isabs(old):
        return runs
    new = str(where / "example")
    return [(cmd.replace(old, new), [x.replace(old, new) for x in lines]) for cmd, lines in runs]


def test_the_quick_start_runs_and_prints_what_the_readme_shows(tmp_path):
    runs = quick_start(README.read_text())
    assert len(runs) >= 3 and [shlex.split(c)[1] for c, _ in runs][:3] == ["compile", "run", "inspect"]
    for command, expected in rewritten(runs, tmp_path):
        r = run(command, tmp_path)
        assert r.returncode == 0, f"{command}\nexit {r.returncode}\n{r.stdout}{r.stderr}"
        actual = r.stdout.rstrip("\n").splitlines()
        problems = differences(expected, actual)
        assert not problems, f"{command}: the README no longer shows what it prints\n" + "\n".join(problems)


def test_the_comparison_masks_numbers_only():
    shown = ["budget 0.718 MB (smallest feasible 0.640 MB), peak 0.713 MB vs store-all 1.616 MB",
             "┃ stage ┃ node             ┃",
             "│ 29    │ bwd.bn_8         │"]
    assert differences(shown, ["budget 12.5 MB (smallest feasible 3 MB), peak 1e-3 MB vs store-all 7 MB",
                               "┃ stage ┃ node              ┃",
                               "│ 131   │ bwd.bn_80         │"]) == []
    changed = [shown[0].replace("smallest feasible", "least feasible"), *shown[1:]]
    assert len(differences(shown, changed)) == 1
    assert differences(shown, shown[:2]) == ["README shows 3 lines, the command printed 2"]
    assert differences(shown, [*shown, "one more line"]) == ["README shows 3 lines, the command printed 4"]


def test_the_quick_start_section_is_parsed_as_written():
    text = "\n".join([
        "# x", "## Quick start", "Compile:", "```", "$ edgetrain compile m --out build/q", "a 1", "", "```",
        "```", "$ edgetrain run build/q", "b 2", "c", "$ edgetrain inspect build/q", "```",
        "```python", "x = 1", "```", "```", "not after a command", "```",
        "## Next", "```", "$ edgetrain sweep m", "```"])
    runs = quick_start(text)
    assert runs == [("edgetrain compile m --out build/q", ["a 1"]), ("edgetrain run build/q", ["b 2", "c"]),
                    ("edgetrain inspect build/q", [])]
    assert out_dir(runs) == "build/q"
    assert rewritten(runs, Path("/t")) == runs  # relative: it lands in the folder the commands run in
    absolute = [(c.replace("build/q", "/x/q"), lines) for c, lines in runs]
    assert rewritten(absolute, Path("/t"))[1] == ("edgetrain run /t/example", ["b 2", "c"])


if __name__ == "__main__":
    # Print the quick start with its real output (run from a scratch folder), to paste into the README.
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        runs = quick_start(README.read_text())
        for command, _ in runs:
            r = run(command, Path(tmp))
            print(PROMPT + command)
            print(r.stdout.rstrip("\n"))
            if r.returncode:
                print(f"(exit {r.returncode}) {r.stderr}", file=sys.stderr)
    sys.exit(0)
