"""Every code block of README.md runs as written, and prints what the README shows.

The blocks are read as `tests/readme_blocks.py` says: shell transcripts (`$ ` lines and the output shown after
them, compared with every number masked: figures move with the solver's speed, words and layout may not),
commands shown without output (run, must exit 0), Python scripts (run), model files (written), excerpts of a
generated file (each line must be in it) and blocks marked `not run` with a reason. Each section runs in a
folder of its own, in the README's order; `make` runs at the repository's root; `make test` (this suite) is
not run.

To refresh the README after a change of the CLI's output: `python tests/test_readme.py [SECTION]` prints every
transcript's commands with their real output, run exactly as this test runs them.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from readme_blocks import Block, blocks, differences, excerpt_problems

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
# The README's output is captured in this environment too: a fixed terminal width, and no GPU, so that the
# run says "on cpu" and autograd's reference is the CPU one.
ENV = {"COLUMNS": "100", "CUDA_VISIBLE_DEVICES": "", "NO_COLOR": "1", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
TIMEOUT_S = 900
SELF = "make test"  # the one command not run: it is this suite


def sections() -> dict[str, list[Block]]:
    out: dict[str, list[Block]] = {}
    for b in blocks(README.read_text()):
        out.setdefault(b.section, []).append(b)
    return {s: bs for s, bs in out.items() if any(b.kind in ("shell", "script") for b in bs)}


def run_shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    first = shlex.split(command)[0]
    where = ROOT if first == "make" else cwd  # the Makefile's targets act on the checkout
    return subprocess.run(["bash", "-c", command], cwd=where, env={**os.environ, **ENV}, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def expects_error(shown: list[str] | None) -> bool:
    return bool(shown) and shown[0].startswith("edgetrain ") and ": error:" in shown[0]


def error_lines(stderr: str) -> list[str]:
    """A failed command's stderr from its error on: the progress lines before it are not shown."""
    lines = stderr.rstrip("\n").splitlines()
    first = next((k for k, x in enumerate(lines) if x.startswith("edgetrain ") and ": error:" in x), 0)
    return lines[first:]


def run_section(name: str, where: Path, report=None) -> list[str]:
    """Run one section's blocks in `where`; the problems found (empty: it ran as written)."""
    problems: list[str] = []
    for b in sections()[name]:
        at = f"README.md:{b.line}"
        if b.kind == "file":
            (where / b.mark[1]).write_text(b.text)
        elif b.kind == "script":
            r = subprocess.run([sys.executable, "-c", b.text], cwd=where, env={**os.environ, **ENV},
                               capture_output=True, text=True, timeout=TIMEOUT_S)
            if r.returncode:
                problems.append(f"{at}: the Python block exits {r.returncode}\n{r.stdout}{r.stderr}")
        elif b.kind == "excerpt":
            path = where / b.mark[1]
            missing = excerpt_problems(b.text, path.read_text()) if path.exists() else [f"{path} is missing"]
            problems += [f"{at}: excerpt line not in {b.mark[1]}: {x!r}" for x in missing]
        elif b.kind == "shell":
            for c in b.commands:
                if c.line == SELF:
                    continue  # the suite cannot run itself
                r = run_shell(c.line, where)
                out = (error_lines(r.stderr) if expects_error(c.shown) else r.stdout.rstrip("\n").splitlines())
                if report:
                    report(c.line, out, r)
                want_rc = 2 if expects_error(c.shown) else 0
                if r.returncode != want_rc:
                    problems.append(f"{at}: `{c.line}` exits {r.returncode} (README: {want_rc})\n"
                                    f"{r.stdout[-3000:]}{r.stderr[-3000:]}")
                    break
                if c.shown is not None:
                    problems += [f"{at}: `{c.line}`: {d}" for d in differences(c.shown, out)]
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("name", list(sections()))
def test_the_readme_section_runs_as_written(name, tmp_path):
    problems = run_section(name, tmp_path)
    assert not problems, f"README section {name!r} does not run as written:\n" + "\n".join(problems)


def test_every_block_is_something_the_test_knows():
    for b in blocks(README.read_text()):
        assert b.kind != "unknown", f"README.md:{b.line}: a ```{b.lang} block: mark it or give it a known language"
        if b.kind == "not run":
            assert len(b.mark[1]) > 10, f"README.md:{b.line}: say why the block is not run"


def test_the_readme_opens_with_the_two_commands():
    first = blocks(README.read_text())[0]
    assert first.kind == "not run" or first.kind == "shell"
    assert [c.line.split()[:2] for c in first.commands][:2] == [["make", "demo"], ["make", "test"]] or \
        first.text.splitlines()[0].startswith("make demo")


if __name__ == "__main__":
    # Print each transcript with its real output (run from a scratch folder), to paste into the README.
    import tempfile

    chosen = sys.argv[1:] or list(sections())
    for name in chosen:
        print(f"## {name}")
        with tempfile.TemporaryDirectory() as tmp:
            def show(line, out, r):
                print(f"$ {line}")
                print("\n".join(out))
                if r.returncode not in (0, 2):
                    print(f"(exit {r.returncode}) {r.stderr[-2000:]}", file=sys.stderr)
            for p in run_section(name, Path(tmp), show):
                print("PROBLEM:", p, file=sys.stderr)
