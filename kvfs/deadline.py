"""Calls that give up: blocking work run in a bounded pool of worker threads, with a deadline.

A stalled NFS or Lustre call cannot be interrupted from Python, so a tier that must not
hang runs each blocking call in a worker thread and waits at most ``timeout`` seconds for
it. The call itself keeps running until the filesystem answers; the caller gets
:class:`~kvfs.errors.TierUnavailable` and moves on. The pool is bounded twice: at most
``workers`` calls run at once, and at most ``2 * workers`` are admitted (running or
queued), so a hung backend ties up a fixed number of threads instead of piling up work
without end; a caller that finds no free slot within the timeout gets the same error, so
no call waits longer than twice the timeout.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

from .errors import TierUnavailable

__all__ = ["DeadlineExecutor"]

T = TypeVar("T")


class DeadlineExecutor:
    """Run blocking calls with a deadline. *what* names the backend in error messages."""

    def __init__(self, what: str, *, timeout: float, workers: int) -> None:
        self.what = what
        self.timeout = timeout
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"kvfs-{what}")
        self._admitted = threading.BoundedSemaphore(2 * workers)

    def call(
        self,
        fn: Callable[..., T],
        *args,
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
        try:
            fut = self._pool.submit(fn, *args)
        except BaseException:
            self._admitted.release()
            raise
        fut.add_done_callback(lambda _f: self._admitted.release())
        try:
            return fut.result(timeout=self.timeout)
        except TimeoutError as exc:
            if fut.done():
                raise  # fn itself raised TimeoutError (e.g. ETIMEDOUT from NFS): not our deadline
            if not fut.cancel() and on_abandon is not None:
                fut.add_done_callback(lambda f: f.exception() is None and on_abandon(f.result()))
            raise TierUnavailable(f"{self.what}: {op} timed out after {self.timeout:g}s") from exc

    def close(self) -> None:
        """Stop accepting calls; threads stuck in the backend are left to finish on their own."""
        self._pool.shutdown(wait=False, cancel_futures=True)
