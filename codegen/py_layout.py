"""Python source laid out in short lines: a call or a literal that does not fit is broken at its commas.

An expression is a `str` (never broken) or a `Group` (an opening text, items, a closing text: a call, a list,
a dict, a keyword whose value is a list). `statement` writes one as lines of at most `width` characters where
its atoms allow, continuation lines aligned with the opening bracket; `comment` wraps a comment.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

WIDTH = 120
ALIGN_LIMIT = 56  # a continuation aligned with an opening further right than this hangs instead


@dataclass(frozen=True)
class Group:
    open: str
    items: tuple
    close: str


@dataclass(frozen=True)
class Chain:
    """`lead` + `base` + links (`.view(...)` calls): broken, it is parenthesized with one link a line."""
    lead: str
    base: str
    links: tuple[str, ...]


def flat(e) -> str:
    if isinstance(e, str):
        return e
    if isinstance(e, Chain):
        return e.lead + e.base + "".join(e.links)
    return e.open + ", ".join(flat(i) for i in e.items) + e.close


def _chain(start: str, c: Chain, tail: str, width: int) -> list[str]:
    """The links one a line, aligned under the first one's dot, or four in from the parenthesis where that is
    too far right for them."""
    first, links = f"{start}{c.lead}({c.base}{c.links[0]}", c.links[1:]
    col = len(start) + len(c.lead) + 1
    pad = " " * (col + len(c.base))
    if len(first) > width:  # the base alone on the first line
        first, links = f"{start}{c.lead}({c.base}", c.links
    if len(first) > width or len(pad) + max(len(link) for link in links) + 1 + len(tail) > width:
        pad = " " * (col + 4)
    return [first] + [pad + link for link in links[:-1]] + [pad + links[-1] + ")" + tail]


def _fill(start: str, g: Group, tail: str, width: int) -> list[str]:
    """g, then `tail`, written after `start` (the line so far): on that line if it fits, else its items packed
    on lines aligned with its opening (or, where that is far right, four in from the line's indentation)."""
    one = start + flat(g) + tail
    if len(one) <= width or not g.items:
        return [one]
    col = len(start) + len(g.open)
    lines: list[str] = []
    if col <= ALIGN_LIMIT:
        cont, cur, fresh = " " * col, start + g.open, True
    else:
        lines.append(start + g.open)
        cont, cur, fresh = " " * (len(start) - len(start.lstrip()) + 4), None, False
    for k, item in enumerate(g.items):
        end = "," if k < len(g.items) - 1 else g.close + tail
        text = flat(item) + end
        if cur is not None and len(cur) + (0 if fresh else 1) + len(text) <= width:
            cur += text if fresh else " " + text
            fresh = False
            continue
        if cur is not None and not (fresh and not isinstance(item, str)):
            lines.append(cur)
            cur = None
        if cur is None and (len(cont) + len(text) <= width or isinstance(item, str)):
            cur, fresh = cont + text, False
            continue
        at = cur if cur is not None else cont  # too long for any line: broken in turn
        sub = _chain(at, item, end, width) if isinstance(item, Chain) else _fill(at, item, end, width)
        lines += sub[:-1]
        cur, fresh = sub[-1], False
    lines.append(cur)
    return lines


def statement(head: str, e, indent: int = 4, note: str = "", width: int = WIDTH) -> list[str]:
    """`head` + e as lines; the comment `note` beside it where the line has room, else on the lines above."""
    lines = _fill(" " * indent + head, e, "", width) if isinstance(e, Group) else [" " * indent + head + e]
    if not note:
        return lines
    if len(lines) == 1 and len(lines[0]) + 4 + len(note) <= width:  # "  # " before it
        return [f"{lines[0]}  # {note}"]
    return comment(note, indent, width) + lines


def comment(text: str, indent: int = 4, width: int = WIDTH) -> list[str]:
    pad = " " * indent + "# "
    return textwrap.wrap(text, width=width, initial_indent=pad, subsequent_indent=pad + "  ",
                         break_long_words=False, break_on_hyphens=False) or [pad.rstrip()]
