"""A client session that an engine plug-in keeps across the daemon going away.

An engine's offload tier or storage backend must never stall the engine on kvfs: a daemon
that is down, restarting or stopped is a miss (the engine recomputes), answered within a
bounded time. :class:`Link` holds one :class:`~kvfs.client.Client` and:

- hands it out while it works (:meth:`Link.call`);
- drops it on the first sign that the daemon is gone or out of step
  (:class:`~kvfs.protocol.DaemonNotAnswering`, which a stopped daemon gives after the
  client's ``timeout``), so that every later call, in any thread, fails at once instead of
  waiting out its own timeout (the client's connection does not reconnect by itself);
- connects again at most every ``reconnect_s`` seconds, from whichever call comes first,
  through the daemon's socket found at the first connect -- never through the mountpoint,
  whose ``stat`` a stopped FUSE daemon would leave hanging.

Errors of single blocks (a miss, a bad copy) are the caller's business; they do not drop
the session.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from kvfs.errors import KvfsError
from kvfs.protocol import DaemonNotAnswering

from .client import Client

__all__ = ["Link"]

log = logging.getLogger("kvfs.client")

T = TypeVar("T")


class Link:
    """A session made by *connect(where)* (a :class:`Client` of the mount or socket
    *where*), kept for calls and remade at most every *reconnect_s* seconds after it was
    lost; *what* names its user in log lines. Thread-safe."""

    def __init__(
        self, connect: Callable[[str | os.PathLike[str]], Client], where: str, *, reconnect_s: float, what: str
    ) -> None:
        self._connect_to = connect
        self.where: str | os.PathLike[str] = where
        self.reconnect_s = reconnect_s
        self.what = what
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._retry_at = 0.0
        self.lost = 0
        """Times the session was dropped (the daemon stopped answering)."""

    def _connect(self) -> Client:
        c = self._connect_to(self.where)
        self.where = c.socket  # from now on, the socket itself: no path lookup on the mount
        return c

    def open(self) -> Client:
        """Connect now (at the plug-in's start); the error says why not."""
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    @property
    def down(self) -> bool:
        """No session, and not yet time to try again: calls would miss at once."""
        return self._client is None and time.monotonic() < self._retry_at

    def client(self) -> Client | None:
        """The session, made now if it was lost and the wait is over; None while down."""
        c = self._client
        if c is not None:
            return c
        with self._lock:
            if self._client is None and time.monotonic() >= self._retry_at:
                try:
                    self._client = self._connect()
                    log.warning("%s: connected to the kvfs daemon again", self.what)
                except KvfsError as exc:
                    self._retry_at = time.monotonic() + self.reconnect_s
                    log.warning("%s: the kvfs daemon cannot be reached: %s", self.what, exc)
            return self._client

    def call(self, fn: Callable[[Client], T]) -> T:
        """``fn(client)``. Raises :class:`DaemonNotAnswering` at once while down; when
        *fn* finds the daemon gone, the session is dropped (and the error raised)."""
        c = self.client()
        if c is None:
            raise DaemonNotAnswering(
                f"{self.what}: the kvfs daemon is not answering (retrying every {self.reconnect_s:g} s)"
            )
        try:
            return fn(c)
        except (DaemonNotAnswering, OSError) as exc:  # the connection is gone or out of step
            self.drop(c, exc)
            raise

    def drop(self, c: Client, why: BaseException) -> None:
        """Forget session *c* (if it is still the current one) after *why*."""
        with self._lock:
            if self._client is c:
                self._client = None
                self._retry_at = time.monotonic() + self.reconnect_s
                self.lost += 1
                log.warning("%s: lost the kvfs daemon (%s); calls miss until it answers again", self.what, why)
        c.close()

    def close(self) -> None:
        with self._lock:
            c, self._client = self._client, None
            self._retry_at = float("inf")
        if c is not None:
            c.close()
