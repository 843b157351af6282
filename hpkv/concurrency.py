"""Run independent reads concurrently, each with a timeout, all within an overall deadline.

Threads rather than asyncio: boto3 and the kubernetes client block. Worker threads are daemons, so
a call that never returns cannot keep hpkv from exiting: its task is reported as timed out, and a
fresh worker takes the stuck one's place so the remaining tasks still run.

:class:`TaskRunner` runs the tasks of a health run (``hpkv status``, ``hpkv diagnose``); a task
may submit more tasks (a stage's checks after its installation probe). :func:`fan_out` runs a few
reads side by side inside one task; it follows the runner's worker count, so a runner with one
worker performs every read one after another (the benchmark's sequential baseline).
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_WORKERS = 32  # most tasks wait on the network; threads are cheap
_fan_out_width: contextvars.ContextVar[int] = contextvars.ContextVar(
    "hpkv_fan_out_width", default=8
)


@dataclass
class Outcome:
    """How one task ended: a value, an error, or no answer in time."""

    key: str
    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    deadline_hit: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


@dataclass
class _Task:
    key: str
    fn: Callable[[], Any]
    timeout: float
    started: float | None = None


class TaskRunner:
    def __init__(
        self,
        *,
        workers: int = DEFAULT_WORKERS,
        task_timeout: float = 10.0,
        deadline: float = 30.0,
    ) -> None:
        self.workers = max(1, workers)
        self.task_timeout = task_timeout
        self._deadline_at = time.monotonic() + deadline
        self.deadline = deadline
        self._cond = threading.Condition()
        self._queue: deque[_Task] = deque()
        self._running: dict[str, _Task] = {}
        self._outcomes: dict[str, Outcome] = {}
        self._threads = 0  # live workers, not counting ones stuck in an abandoned task
        self._idle = 0
        self._closed = False

    # --- submitting ------------------------------------------------------------------------------
    def submit(self, key: str, fn: Callable[[], Any], *, timeout: float | None = None) -> bool:
        """Queue ``fn``; False (and not run) once :meth:`wait` has returned or the key is taken."""
        with self._cond:
            if self._closed or key in self._outcomes or key in self._running:
                return False
            if any(task.key == key for task in self._queue):
                return False
            self._queue.append(_Task(key, fn, self.task_timeout if timeout is None else timeout))
            self._maybe_spawn()
            self._cond.notify_all()
            return True

    def _maybe_spawn(self) -> None:
        while self._threads < self.workers and len(self._queue) > self._idle:
            self._threads += 1
            self._idle += 1  # a new worker starts idle
            threading.Thread(target=self._work, daemon=True, name="hpkv-check").start()

    # --- workers ---------------------------------------------------------------------------------
    def _work(self) -> None:
        _fan_out_width.set(self.workers)
        first = True
        while True:
            with self._cond:
                if not first:
                    self._idle += 1
                first = False
                while not self._queue and not self._closed:
                    self._cond.wait()
                self._idle -= 1
                if self._closed and not self._queue:
                    self._threads -= 1
                    return
                task = self._queue.popleft()
                task.started = time.monotonic()
                self._running[task.key] = task
                self._cond.notify_all()  # wait() now has a timeout to watch
            outcome = Outcome(task.key)
            try:
                outcome.value = task.fn()
            except BaseException as exc:
                outcome.error = exc
            outcome.seconds = time.monotonic() - task.started
            with self._cond:
                if self._running.get(task.key) is not task:
                    return  # abandoned after its timeout; a replacement worker took over
                del self._running[task.key]
                self._outcomes[task.key] = outcome
                self._cond.notify_all()

    # --- waiting ---------------------------------------------------------------------------------
    def wait(self) -> dict[str, Outcome]:
        """Block until every task ended, timed out, or the deadline passed; return all outcomes."""
        with self._cond:
            while True:
                now = time.monotonic()
                self._expire(now)
                if now >= self._deadline_at:
                    self._expire_all(now)
                    break
                if not self._queue and not self._running:
                    break
                wake = self._deadline_at
                for task in self._running.values():
                    assert task.started is not None
                    wake = min(wake, task.started + task.timeout)
                self._cond.wait(max(0.001, wake - now))
            self._closed = True
            self._cond.notify_all()
            return dict(self._outcomes)

    def _expire(self, now: float) -> None:
        for key, task in list(self._running.items()):
            assert task.started is not None
            if now >= task.started + task.timeout:
                del self._running[key]
                self._outcomes[key] = Outcome(key, timed_out=True, seconds=now - task.started)
                self._threads -= 1  # that worker is stuck; let another one start
                self._maybe_spawn()

    def _expire_all(self, now: float) -> None:
        for key, task in list(self._running.items()):
            assert task.started is not None
            self._outcomes[key] = Outcome(
                key, timed_out=True, deadline_hit=True, seconds=now - task.started
            )
        self._running.clear()
        while self._queue:
            task = self._queue.popleft()
            self._outcomes[task.key] = Outcome(task.key, timed_out=True, deadline_hit=True)


def fan_out(functions: Sequence[Callable[[], Any]]) -> list[Any]:
    """Call the functions side by side and return their results in order.

    The first exception (in order) is raised after all have finished. Inside a :class:`TaskRunner`
    with one worker they run one after another.
    """
    width = _fan_out_width.get()
    if width <= 1 or len(functions) <= 1:
        return [fn() for fn in functions]
    results: list[Any] = [None] * len(functions)
    errors: list[BaseException | None] = [None] * len(functions)
    context = contextvars.copy_context()

    def call(index: int) -> None:
        try:
            results[index] = context.copy().run(functions[index])
        except BaseException as exc:
            errors[index] = exc

    threads = [
        threading.Thread(target=call, args=(i,), daemon=True, name="hpkv-fan-out")
        for i in range(1, len(functions))
    ]
    for thread in threads:
        thread.start()
    call(0)
    for thread in threads:
        thread.join()
    for error in errors:
        if error is not None:
            raise error
    return results


@contextlib.contextmanager
def fewer_gc_pauses(young_threshold: int = 20_000) -> Iterator[None]:
    """Keep the cyclic garbage collector off the objects that existed before the block.

    A health run builds boto3 clients (large service models) and decodes Kubernetes lists on many
    threads at once. The collections this triggers walk the older objects too (imported modules,
    service models) while holding the interpreter lock, which stalled every concurrent read
    (``benchmarks/status_latency.py --timeline``: the first boto3 client took 270 ms instead of
    90). Objects alive at the start are frozen for the block and young collections run less often;
    both are restored afterwards.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], young_threshold), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
