"""Leases a client's reads are done with, ended without a message of their own.

A read (:meth:`kvfs.client.Client.get_into`) leases its blocks, copies them and is done
with the leases. Ending them at once costs a message that wakes the daemon for every
read; an engine reading batch after batch would send two messages per batch. Instead the
ids wait here and go with the client's next checkout (:class:`~kvfs.protocol.Checkout`'s
``release``), or as a :class:`~kvfs.protocol.Release` sent ahead of any other request, or,
when the client goes quiet, after ``delay`` seconds (at most twice that) from a thread of
this object. A lease waiting here holds its DRAM extent a little longer (at most
2 x ``delay`` seconds, or its
deadline if the daemon stopped answering); nothing reads it any more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvfs.errors import KvfsError

__all__ = ["DeferredReleases"]

log = logging.getLogger("kvfs.client")


class DeferredReleases:
    """Lease ids waiting to be ended; *send(ids)* ends them (the client's own
    :class:`~kvfs.protocol.Release`, sent without waiting) when nothing took them within
    about *delay* seconds (at most twice that). Thread-safe; the thread starts with the
    first ids.

    The thread is not woken by every :meth:`add`: a client reading batch after batch adds
    ids after each read and its next checkout takes them, and a wake-up of another thread
    per read costs more than the read's copy on a busy machine (the GIL changes hands
    twice). While ids keep coming the thread looks every *delay* seconds; only after
    *linger* seconds without any does it sleep until the next :meth:`add` wakes it."""

    def __init__(self, send: Callable[[list[int]], None], *, delay: float, linger: float = 1.0) -> None:
        self._send = send
        self.delay = delay
        self.linger = linger
        self._ids: list[int] = []
        self._since = 0.0  # when the oldest id waiting was added
        self._active = 0.0  # when ids were last added
        self._sleeping = False  # the thread waits for a notify (not on a clock)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, ids: list[int]) -> None:
        if not ids:
            return
        with self._cond:
            if self._closed:
                return  # the session is over: the daemon ended them with it
            now = time.monotonic()
            if not self._ids:
                self._since = now
            self._active = now
            self._ids += ids
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvfs-client-release", daemon=True)
                self._thread.start()
            elif self._sleeping:
                self._cond.notify()

    def take(self) -> list[int]:
        """Every id waiting (to send now, with a request); none wait after this."""
        with self._cond:
            ids, self._ids = self._ids, []
            return ids

    def close(self) -> None:
        """Stop the thread; the ids still waiting are dropped (the session's end ends them)."""
        with self._cond:
            self._closed = True
            self._ids = []
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _due(self) -> list[int] | None:
        """Under the lock: wait until ids are due (returned, taken) or the end (None)."""
        while not self._closed:
            now = time.monotonic()
            if self._ids:
                left = self._since + self.delay - now
                if left <= 0:
                    ids, self._ids = self._ids, []
                    return ids
                self._cond.wait(left)
            elif now - self._active < self.linger:
                self._cond.wait(self.delay)  # reads keep coming: look again soon, unwoken
            else:
                self._sleeping = True
                try:
                    self._cond.wait()
                finally:
                    self._sleeping = False
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                ids = self._due()
            if ids is None:
                return
            try:
                self._send(ids)
            except KvfsError as exc:  # the daemon went away: the session's end ended them
                log.debug("kvfs: releasing %d leases failed: %s", len(ids), exc)
