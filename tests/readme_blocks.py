"""The README's code blocks as a test runs them: which are commands, which are files, which are excerpts.

A block is read by its fence's language and by an HTML comment on the line right before it:

- a plain fence (or `console`, `sh`): shell. Lines starting `$ ` are commands, each followed by the output it
  shows (a line `...` stands for any lines); a block without `$ ` lines is commands alone, one a line (a
  trailing `# comment` is prose);
- `python`: a script run after the blocks before it, in the same folder; `<!-- file: NAME -->` before it
  makes it the file NAME instead (a model file a command then compiles);
- `<!-- excerpt: PATH -->` before a block: every line of it (but `...`) is a line of PATH as the commands before
  it wrote it (numbers masked), so a shown excerpt cannot drift;
- `<!-- not run: REASON -->` before a block: shown, not run; the reason says why (the suite itself, an
  install into the reader's own environment);
- `text`: a picture (the pipeline's diagram), never run.

Each `##`/`###` section runs in a folder of its own, its blocks in order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d+)*|\.\d+)(?:[eE][-+]?\d+)?")
BOX_RUN = re.compile(r"([─━═])\1+")  # a table's rules are as wide as its columns' numbers
MARK = re.compile(r"^<!--\s*(file|excerpt|not run)\s*:\s*(.*?)\s*-->\s*$")
SHELL = ("", "console", "sh", "shell", "bash")
PROMPT = "$ "
ANY = "..."


@dataclass
class Command:
    line: str
    shown: list[str] | None  # the output the README shows after it; None: a command shown without output


@dataclass
class Block:
    section: str
    lang: str
    text: str
    line: int  # 1-based line of the opening fence
    mark: tuple[str, str] | None = None  # ("file" | "excerpt" | "not run", argument)
    commands: list[Command] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.mark:
            return self.mark[0]
        if self.lang == "text":
            return "picture"
        if self.lang == "python":
            return "script"
        if self.lang in SHELL:
            return "shell"
        return "unknown"


def _commands(text: str) -> list[Command]:
    lines = text.splitlines()
    if not any(x.startswith(PROMPT) for x in lines):
        out = []
        for x in lines:
            x = re.sub(r"\s+#\s.*$", "", x).strip()
            if x and not x.startswith("#"):
                out.append(Command(x, None))
        return out
    out: list[Command] = []
    for x in lines:
        if x.startswith(PROMPT):
            out.append(Command(x[len(PROMPT):], []))
        elif out:
            out[-1].shown.append(x)
    for c in out:
        while c.shown and not c.shown[-1].strip():
            c.shown.pop()
    return out


def blocks(readme: str) -> list[Block]:
    """Every fenced block of the README with its section and its mark."""
    out: list[Block] = []
    section, fence, body, start, mark, prev = "(top)", None, [], 0, None, ""
    for k, line in enumerate(readme.splitlines(), 1):
        if fence is None:
            if line.startswith("#"):
                section = line.lstrip("#").strip()
            if line.startswith("```"):
                fence, body, start = line[3:].strip(), [], k
                m = MARK.match(prev)
                mark = (m.group(1), m.group(2)) if m else None
            prev = line
            continue
        if line.startswith("```"):
            b = Block(section, fence, "\n".join(body) + "\n", start, mark)
            if b.kind == "shell":
                b.commands = _commands(b.text)
            out.append(b)
            fence, prev = None, line
            continue
        body.append(line)
    if fence is not None:
        raise AssertionError(f"README.md: the block opened at line {start} is never closed")
    return out


def normalize(line: str) -> str:
    """A line with every number masked, table rules shortened and runs of blanks made one."""
    return " ".join(BOX_RUN.sub(r"\1", NUMBER.sub("#", line)).split())


def matches(shown: list[str], actual: list[str]) -> bool:
    """Whether `actual` is what `shown` shows, numbers masked, a `...` line standing for any lines."""
    want = [normalize(x) for x in shown]
    got = [normalize(x) for x in actual]

    def at(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i] == ANY:
            return any(at(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and want[i] == got[j] and at(i + 1, j + 1)

    return at(0, 0)


def differences(shown: list[str], actual: list[str]) -> list[str]:
    """Where the real output departs from the README's; empty when they agree."""
    if matches(shown, actual):
        return []
    out = []
    for k, (w, g) in enumerate(zip(shown, actual)):
        if w.strip() == ANY:
            out.append("(a `...` line: compared as a whole)")
            break
        if normalize(w) != normalize(g):
            out.append(f"line {k + 1}: README {w!r}\n        real   {g!r}")
    if len(shown) != len(actual) and ANY not in [x.strip() for x in shown]:
        out.append(f"README shows {len(shown)} lines, the command printed {len(actual)}")
    return out or ["the output differs"]


def excerpt_problems(excerpt: str, actual: str) -> list[str]:
    """The lines of an excerpt that the file does not hold (numbers masked; `...` lines skipped)."""
    have = {normalize(x) for x in actual.splitlines()}
    return [x for x in excerpt.splitlines() if x.strip() and x.strip() != ANY and normalize(x) not in have]
