"""Kill a child process at a named event: the child prints each event to stderr and, at the one the test waits
for, blocks on a line from stdin, so the test sees the state at that event and then kills it there (SIGKILL,
as a power cut would)."""
from __future__ import annotations

import signal
import subprocess

import pytest


def kill_at(argv: list[str], reached, *, env: dict | None = None, cwd: str | None = None, then=None):
    """Run `argv`, read its stderr until a line makes `reached(line)` true, call `then()` while the child waits
    there, SIGKILL it and return what `then` returned. Fails the test if the child ends before the event."""
    p = subprocess.Popen(argv, env=env, cwd=cwd, text=True, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        said = []
        for line in p.stderr:
            said.append(line)
            if reached(line):
                break
        else:
            pytest.fail(f"the child ended before the event: {''.join(said)[-2000:]}")
        seen = then() if then else None
        p.send_signal(signal.SIGKILL)
        assert p.wait() == -signal.SIGKILL
        return seen
    finally:
        p.kill()
        p.wait()
        p.stdin.close()
        p.stderr.close()
