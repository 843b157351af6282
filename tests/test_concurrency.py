"""TaskRunner and fan_out: results, errors, per-task timeouts, the deadline, nested submits."""

from __future__ import annotations

import threading
import time

import pytest

from hpkv.concurrency import TaskRunner, fan_out


def test_results_errors_and_nested_submits() -> None:
    runner = TaskRunner(workers=4, task_timeout=5, deadline=10)

    def parent() -> str:
        runner.submit("child", lambda: "from child")
        return "parent"

    runner.submit("parent", parent)
    runner.submit("error", lambda: 1 / 0)
    assert runner.submit("parent", lambda: "again") is False  # keys are unique
    outcomes = runner.wait()
    assert outcomes["parent"].value == "parent" and outcomes["child"].value == "from child"
    assert isinstance(outcomes["error"].error, ZeroDivisionError)
    assert not outcomes["error"].ok
    assert runner.submit("late", lambda: None) is False  # after wait() nothing more runs


def test_a_stuck_task_times_out_and_a_fresh_worker_runs_the_rest() -> None:
    release = threading.Event()
    runner = TaskRunner(workers=1, task_timeout=0.3, deadline=10)
    runner.submit("stuck", release.wait)
    runner.submit("next", lambda: "ran")
    started = time.monotonic()
    outcomes = runner.wait()
    release.set()
    assert time.monotonic() - started < 2
    assert outcomes["stuck"].timed_out and not outcomes["stuck"].deadline_hit
    assert outcomes["next"].value == "ran"


def test_the_deadline_ends_everything() -> None:
    release = threading.Event()
    runner = TaskRunner(workers=1, task_timeout=10, deadline=0.3)
    runner.submit("long", release.wait)
    runner.submit("queued", lambda: "never")
    outcomes = runner.wait()
    release.set()
    assert outcomes["long"].deadline_hit and outcomes["queued"].deadline_hit


def test_fan_out_is_concurrent_keeps_order_and_raises_the_first_error() -> None:
    started = time.monotonic()
    assert fan_out([lambda i=i: (time.sleep(0.2), i)[1] for i in range(5)]) == [0, 1, 2, 3, 4]
    assert time.monotonic() - started < 0.6
    try:
        fan_out([lambda: 1, lambda: int("x"), lambda: 1 / 0])
    except ValueError:
        pass
    else:  # pragma: no cover
        raise AssertionError("expected ValueError")


def test_fan_out_inside_a_one_worker_runner_is_sequential() -> None:
    runner = TaskRunner(workers=1, task_timeout=5, deadline=10)
    runner.submit("t", lambda: fan_out([threading.get_ident, threading.get_ident]))
    idents = runner.wait()["t"].value
    assert idents[0] == idents[1]


def test_fewer_gc_pauses_freezes_older_objects_for_the_block_and_restores_the_collector() -> None:
    import gc

    from hpkv.concurrency import fewer_gc_pauses

    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with fewer_gc_pauses(young_threshold=12_345):
        assert gc.get_freeze_count() > 0  # what existed before is out of the collector's way
        assert gc.get_threshold() == (max(before[0], 12_345), *before[1:])
        assert gc.isenabled()  # new cyclic garbage is still collected
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    with pytest.raises(KeyError), fewer_gc_pauses():
        raise KeyError("boom")
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
