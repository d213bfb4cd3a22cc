"""The page store's background jobs: run once, by the worker or by whoever needs them first; errors reach the
caller; no reference to a job's arguments is kept after it ran; a worker's thread ends with the worker."""
from __future__ import annotations

import gc
import threading
import weakref

import pytest

from edgetrain.runtime.python.page_jobs import Job, Worker, finished


class Box:
    pass


def test_a_job_runs_once_on_whichever_thread_gets_it_first():
    gate, ran = threading.Event(), []
    worker = Worker("test-jobs")
    blocker = worker.submit(gate.wait, 5)  # holds the worker's thread
    queued = worker.submit(lambda: ran.append(threading.current_thread().name) or 7)
    assert queued.result() == 7 and ran == [threading.current_thread().name]  # not started: run here
    gate.set()
    assert blocker.result() is True
    queued.run()  # a second run does nothing
    assert ran == [threading.current_thread().name]


def test_errors_reach_the_caller_and_arguments_are_let_go():
    box = Box()
    alive = weakref.ref(box)

    def fail(b):
        raise OSError(28, "No space left on device")

    job = Worker("test-jobs").submit(fail, box)
    del box
    with pytest.raises(OSError, match="No space left"):
        job.result()
    gc.collect()
    assert alive() is None  # the job, still held here, keeps nothing of what it ran on
    assert finished(lambda x: x + 1, 1).result() == 2


def test_the_thread_ends_with_its_worker():
    worker = Worker("test-jobs-ending")
    assert worker.submit(lambda: 1).result() == 1
    thread = worker._thread
    assert thread.is_alive()
    del worker
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()
