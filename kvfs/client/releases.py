"""Leases a client's reads are done with, ended without a message of their own.

A read (:meth:`kvfs.client.Client.get_into`) leases its blocks, copies them and is done
with the leases. Ending them at once costs a message that wakes the daemon for every
read; an engine reading batch after batch would send two messages per batch. Instead the
ids wait here and go with the client's next checkout (:class:`~kvfs.protocol.Checkout`'s
``release``), or as a :class:`~kvfs.protocol.Release` sent ahead of any other request, or,
when the client goes quiet, after ``delay`` seconds from a thread of this object. A lease
waiting here holds its DRAM extent a little longer (at most ``delay`` seconds, or its
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
    *delay* seconds. Thread-safe; the thread starts with the first ids."""

    def __init__(self, send: Callable[[list[int]], None], *, delay: float) -> None:
        self._send = send
        self.delay = delay
        self._ids: list[int] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, ids: list[int]) -> None:
        if not ids:
            return
        with self._cond:
            if self._closed:
                return  # the session is over: the daemon ended them with it
            self._ids += ids
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvfs-client-release", daemon=True)
                self._thread.start()
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

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._ids and not self._closed:
                    self._cond.wait()
                deadline = time.monotonic() + self.delay
                while self._ids and not self._closed and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                if self._closed:
                    return
                ids, self._ids = self._ids, []
            if ids:
                try:
                    self._send(ids)
                except KvfsError as exc:  # the daemon went away: the session's end ended them
                    log.debug("kvfs: releasing %d leases failed: %s", len(ids), exc)
