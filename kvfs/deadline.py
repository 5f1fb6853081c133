"""Calls that give up: blocking work run in a bounded pool of worker threads, with a deadline.

A stalled NFS or Lustre call, or an S3 request to an endpoint that stopped answering,
cannot be interrupted from Python, so a tier that must not hang runs each blocking call in
a worker thread and waits at most ``timeout`` seconds for it. The call itself keeps running
until the backend answers; the caller gets :class:`~kvfs.errors.TierUnavailable` and moves
on (the call is *abandoned*). The pool is bounded twice: at most ``workers`` calls run at
once, and at most ``2 * workers`` are admitted (running or queued), so a hung backend ties
up a fixed number of threads instead of piling up work without end; a caller that finds no
free slot within the timeout gets the same error, so no call waits longer than twice the
timeout.

The workers are daemon threads that nothing ever joins: a thread stuck in a hung
filesystem never keeps the process from exiting (``concurrent.futures`` joins its workers
at interpreter exit, which is why it is not used here). :meth:`DeadlineExecutor.submit`
runs a call in the background without waiting at all, for work whose answer is applied
when it arrives (revalidation of shared copies).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .errors import TierUnavailable

__all__ = ["DeadlineExecutor", "Job"]

log = logging.getLogger("kvfs.deadline")

T = TypeVar("T")

_QUEUED, _RUNNING, _DONE, _CANCELLED = range(4)


class Job(Generic[T]):
    """One call in a :class:`DeadlineExecutor`: its outcome once :attr:`finished` is set."""

    __slots__ = ("_on_abandon", "_on_done", "_state_lock", "args", "error", "finished", "fn", "result", "state")

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args
        self.result: T | None = None
        self.error: BaseException | None = None
        self.finished = threading.Event()
        self.state = _QUEUED
        self._state_lock = threading.Lock()
        self._on_done: Callable[[Job[T]], None] | None = None
        self._on_abandon: Callable[[T], None] | None = None

    def _cancel(self) -> bool:
        """Cancel the job if it has not started; True if it will never run."""
        with self._state_lock:
            if self.state == _QUEUED:
                self.state = _CANCELLED
                return True
            return False

    def _abandon(self, on_abandon: Callable[[T], None] | None) -> bool:
        """The caller gives up on a running job: *on_abandon* gets its result when it
        ends. False if it has just finished (the caller takes the result after all)."""
        with self._state_lock:
            if self.state == _DONE:
                return False
            self._on_abandon = on_abandon
            return True

    def _run(self) -> None:
        with self._state_lock:
            if self.state == _CANCELLED:
                return
            self.state = _RUNNING
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits for the job, re-raised there
            self.error = exc
        with self._state_lock:
            self.state = _DONE
            on_abandon = self._on_abandon
        self.finished.set()
        if on_abandon is not None and self.error is None:
            try:
                on_abandon(self.result)  # type: ignore[arg-type]
            except Exception:
                log.exception("releasing the result of an abandoned call failed")
        if self._on_done is not None:
            try:
                self._on_done(self)
            except Exception:
                log.exception("a background call's completion handler failed")


class DeadlineExecutor:
    """Run blocking calls with a deadline. *what* names the backend in error messages."""

    def __init__(self, what: str, *, timeout: float, workers: int) -> None:
        self.what = what
        self.timeout = timeout
        self.workers = max(1, workers)
        self._queue: queue.SimpleQueue[Job[Any] | None] = queue.SimpleQueue()
        self._admitted = threading.BoundedSemaphore(2 * self.workers)
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._running = 0
        self._closed = False

    @property
    def running(self) -> int:
        """Calls running in a worker now (stuck ones included)."""
        return self._running

    def _start(self, job: Job[Any]) -> None:
        with self._lock:
            if self._closed:
                raise TierUnavailable(f"{self.what}: closed")
            if self._idle == 0 and self._threads < self.workers:
                self._threads += 1
                threading.Thread(target=self._work, name=f"kvfs-{self.what}", daemon=True).start()
            else:
                self._idle = max(0, self._idle - 1)
        self._queue.put(job)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self._running += 1
            try:
                job._run()
            finally:
                with self._lock:
                    self._running -= 1
                    self._idle += 1
                self._admitted.release()

    def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        op: str = "operation",
        on_abandon: Callable[[T], None] | None = None,
    ) -> T:
        """``fn(*args)`` in a worker; its exception propagates unchanged.

        Raises :class:`TierUnavailable` when it does not finish within the timeout (or
        the pool is full of stuck calls). *on_abandon* receives the result of a call
        that finished after its caller gave up (to release what it holds).
        """
        if not self._admitted.acquire(timeout=self.timeout):
            raise TierUnavailable(
                f"{self.what}: {op} not started within {self.timeout:g}s; earlier calls are still stuck"
            )
        job: Job[T] = Job(fn, args)
        try:
            self._start(job)
        except BaseException:
            self._admitted.release()
            raise
        # a job that never started is skipped by the worker that finds it (which releases
        # its admission); a running one is abandoned to finish on its own
        if not job.finished.wait(self.timeout) and (job._cancel() or job._abandon(on_abandon)):
            raise TierUnavailable(f"{self.what}: {op} timed out after {self.timeout:g}s")
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def submit(self, fn: Callable[..., T], *args: Any, on_done: Callable[[Job[T]], None]) -> Job[T] | None:
        """Run ``fn(*args)`` in the background, never waiting: *on_done* gets the finished
        :class:`Job` in the worker thread. None (and nothing runs) when the pool has no
        free slot right now, e.g. because earlier calls are stuck in a hung backend."""
        if not self._admitted.acquire(blocking=False):
            return None
        job: Job[T] = Job(fn, args)
        job._on_done = on_done
        try:
            self._start(job)
        except BaseException:
            self._admitted.release()
            raise
        return job

    def close(self) -> None:
        """Stop accepting calls; threads stuck in the backend are left to finish on their
        own (they are daemon threads: they never delay the process's exit)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            n = self._threads
        for _ in range(n):
            self._queue.put(None)
