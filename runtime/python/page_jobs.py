"""The page store's background jobs, with as little Python on their threads as there can be.

A store thread shares the GIL with the thread that computes, which takes it back each time a kernel returns
and stands still while a store thread holds it. `concurrent.futures` runs a job through Python-level
conditions and a work-item wrapper; here a job is two C-level locks and its result slots, handed over by a
C-level queue (`queue.SimpleQueue`), so a store thread holds the GIL only to start and end a job.
"""
from __future__ import annotations

import _thread
import queue
import threading
import traceback
import weakref


class Job:
    """`fn(*args)`, run once: by a worker thread, or by whoever needs its result before a thread starts it."""
    __slots__ = ("_fn", "_args", "_claim", "_done", "_value", "_error")

    def __init__(self, fn, args: tuple) -> None:
        self._fn, self._args = fn, args
        self._claim = _thread.allocate_lock()  # taken by the one thread that runs the job
        self._done = _thread.allocate_lock()  # held until the job has run
        self._done.acquire()
        self._value = self._error = None

    def run(self) -> None:
        if not self._claim.acquire(False):
            return
        try:
            self._value = self._fn(*self._args)
        except BaseException as e:  # noqa: BLE001 - handed to whoever asks for the result
            traceback.clear_frames(e.__traceback__)  # its lines stay; the frames' tensors go
            self._error = e
        finally:
            self._fn = self._args = None  # no reference to the job's tensors is left once it has run
            self._done.release()

    def result(self):
        """The job's value (or its exception, raised): run here if no thread has started it (the caller would
        otherwise stand still while the jobs queued before it run), else waited for."""
        self.run()
        self._done.acquire()
        self._done.release()
        if self._error is not None:
            raise self._error
        return self._value


def finished(fn, *args) -> Job:
    """A job run on the calling thread: the same interface where a store has no threads."""
    job = Job(fn, args)
    job.run()
    return job


class Worker:
    """One thread running submitted jobs in order; it ends when the worker is garbage-collected."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._name = name
        self._thread: threading.Thread | None = None

    def submit(self, fn, *args) -> Job:
        job = Job(fn, args)
        if self._thread is None:  # started on first use, like a thread pool's
            self._thread = threading.Thread(target=_serve, args=(self._queue,), name=self._name, daemon=True)
            self._thread.start()
            weakref.finalize(self, self._queue.put, None)
        self._queue.put(job)
        return job


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        job.run()
        del job  # the thread keeps no job (nor its result) while it waits for the next
