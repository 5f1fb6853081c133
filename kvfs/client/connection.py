"""One connection to a mount's daemon, from any process: typed requests out, typed
replies (and descriptors) in. Used by the batch client and by the ``kvfs`` tools.

Blocking, one request at a time, not thread-safe (a client serializes its calls). Every
failure to reach the daemon is :class:`~kvfs.protocol.DaemonNotAnswering` saying why; an
error the daemon answered is raised again as its own class (the protocol's error table).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

from kvfs.errors import KvfsError
from kvfs.protocol import DaemonNotAnswering, Error, LineBuffer, Message, ProtocolError, Request, decode, encode

__all__ = ["Connection", "Stream"]

log = logging.getLogger("kvfs.client")

R = TypeVar("R", bound=Message)

_RECV = 64 << 10  # per recv: a bigger buffer costs ~15 us a call to allocate; frames span recvs
_MAX_FDS = 16


class Connection:
    """A connection to the socket at *path*; *where* names the mount in messages;
    *timeout* bounds each wait for a reply (streams wait as long as the daemon keeps
    the connection). *reconnect*: a request after the connection was lost connects
    again; without it (a session whose state died with the connection, such as a
    client's leases) every request after the loss fails at once."""

    def __init__(
        self, path: str | os.PathLike[str], *, where: str | None = None, timeout: float = 60.0, reconnect: bool = True
    ) -> None:
        self.path = Path(path)
        self.where = where or str(path)
        self.timeout = timeout
        self.reconnect = reconnect
        self._was_connected = False
        self._sock: socket.socket | None = None
        self._frames = LineBuffer()
        self._lines: list[bytes] = []
        self._fds: list[int] = []
        self._pending: list[Request] = []

    def not_answering(self, why: str) -> DaemonNotAnswering:
        return DaemonNotAnswering(
            f"the kvfs daemon of {self.where} is not answering ({why}; socket {self.path}); "
            "is it mounted with `kvfs mount`?",
            why,
        )

    def connect(self) -> None:
        if self._sock is not None:
            return
        if self._was_connected and not self.reconnect:
            raise self.not_answering("the connection was lost earlier; open a new session")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(str(self.path))
        except FileNotFoundError:
            s.close()
            raise self.not_answering("no control socket") from None
        except ConnectionRefusedError:
            s.close()
            raise self.not_answering("connection refused") from None
        except PermissionError:
            s.close()
            raise self.not_answering("permission denied: the socket belongs to another user") from None
        except TimeoutError:
            s.close()
            raise self.not_answering("connect timed out") from None
        except OSError as exc:
            s.close()
            raise self.not_answering(exc.strerror or str(exc)) from None
        self._sock = s
        self._was_connected = True

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        self._pending = []
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames --------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        self.connect()
        assert self._sock is not None
        try:
            self._sock.sendall(encode(msg))
        except OSError as exc:
            self.close()
            raise self.not_answering(f"send failed: {exc.strerror or exc}") from None

    def receive(self) -> Message:
        """The next frame (descriptors that came with it are kept for :meth:`take_fds`)."""
        sock = self._sock
        if sock is None:
            raise self.not_answering("not connected")
        while not self._lines:
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, _RECV, _MAX_FDS)
            except TimeoutError:
                self.close()
                raise self.not_answering(f"no reply within {self.timeout:g} s") from None
            except OSError as exc:
                self.close()
                raise self.not_answering(f"receive failed: {exc.strerror or exc}") from None
            self._fds += fds
            if not data:
                self.close()
                raise self.not_answering("it closed the connection")
            self._lines = self._frames.feed(data)
        return decode(self._lines.pop(0))

    def take_fds(self) -> list[int]:
        """The descriptors received so far (the caller owns them now)."""
        fds, self._fds = self._fds, []
        return fds

    # -- requests ------------------------------------------------------------------------

    def request(self, req: Request, reply: type[R] | None = None) -> R:
        """Send *req* and return its reply (of class *reply*, by default ``req.reply``);
        the daemon's error is raised as its own class. Items of a streaming reply are
        skipped.

        Requests sent with :meth:`submit` whose replies are still owed are not waited
        for before *req* goes out: the daemon answers in order, so it finds both in one
        wake-up and this is one round trip, not two. Their replies are read first; an
        error one of them met is logged (nobody waits on it), not raised here."""
        self.send(req)
        while self._pending:
            owed = self._pending[0]
            try:
                self.result()
            except DaemonNotAnswering:
                raise
            except KvfsError as exc:
                log.warning("kvfs: a %s request sent without waiting failed: %s", owed.kind, exc)
        answer: R = self._reply(req, reply)
        return answer

    def submit(self, req: Request) -> None:
        """Send *req* without waiting: its reply is read by :meth:`result` (or, checked
        and dropped, before the next :meth:`request`). The daemon answers in order."""
        self.send(req)
        self._pending.append(req)

    def settle(self) -> None:
        """Read (and check) every reply still owed to :meth:`submit`, so that the next
        :meth:`result` is the reply to the next request submitted."""
        while self._pending:
            self.result()

    def result(self) -> Any:
        """The reply to the oldest request sent with :meth:`submit` (its error raised)."""
        return self._reply(self._pending.pop(0), None)

    def _reply(self, req: Request, reply: type[R] | None) -> Any:
        expected: Any = reply or req.reply
        while True:
            msg = self.receive()
            if isinstance(msg, Error):
                raise msg.exception()
            if isinstance(msg, expected):
                return msg
            if not req.streaming:
                raise ProtocolError(f"the daemon answered {req.kind!r} with {msg.kind!r}")

    def stream(self, req: Request) -> Stream:
        """Send a streaming request; iterate the returned :class:`Stream` for its items.
        Waits as long as the daemon keeps the connection (no reply timeout)."""
        self.send(req)
        assert self._sock is not None
        self._sock.settimeout(None)
        return Stream(self, req)


class Stream:
    """The items of a streaming reply (iterate), then :attr:`result` (the final reply).
    The daemon's error is raised at the end."""

    def __init__(self, conn: Connection, req: Request) -> None:
        self._conn = conn
        self._req = req
        self.result: Message | None = None
        self.done = False

    def __iter__(self) -> Iterator[Message]:
        reply = self._req.reply
        while True:
            msg = self._conn.receive()
            if isinstance(msg, Error):
                self.done = True
                raise msg.exception()
            if isinstance(msg, reply):
                self.done = True
                self.result = msg
                return
            yield msg
