"""Talking to a mount's daemon from the ``kvfs`` command: find it, ask it, stream from it.

A user path is resolved to ``(control socket, name inside the mount)``: normally through
``/proc/self/mountinfo`` (:func:`kvfs.mount.paths.find_mount`) and the socket path derived
from the mountpoint. ``--socket PATH`` (hidden) or ``$KVFS_CONTROL_SOCKET`` names the
socket directly; paths are then names relative to the mount root (a leading ``/`` and
``.`` components are dropped). That is how the tests drive a store behind a control
server without a FUSE mount, and how an operator can reach a daemon whose mount is gone.

The wire protocol is in :mod:`kvfs.mount.control`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from kvfs.errors import KvfsError
from kvfs.mount.paths import control_socket_path, find_mount
from kvfs.names import normalize

__all__ = [
    "ENV_SOCKET",
    "ControlClient",
    "DaemonError",
    "DaemonNotAnswering",
    "NotInMount",
    "Stream",
    "Target",
    "about",
    "add_socket_option",
    "clients_for",
    "resolve",
]

ENV_SOCKET = "KVFS_CONTROL_SOCKET"
_TIMEOUT = 60.0  # seconds a non-streaming request may take


class NotInMount(KvfsError):
    """Raised when a path given to a ``kvfs`` subcommand is in no kvfs mount."""


class DaemonNotAnswering(KvfsError):
    """Raised when the mount's control socket is missing, refuses, hangs up or times out."""


class DaemonError(KvfsError):
    """The daemon refused a request; ``type`` is its error class (``BlockNotFound``, …)."""

    def __init__(self, message: str, type: str = "") -> None:
        super().__init__(message)
        self.type = type


@dataclass(frozen=True, slots=True)
class Target:
    """Where a user path leads: the daemon's socket, the mountpoint (None with an
    explicit socket) and the block or directory name inside the mount."""

    path: str
    socket: Path
    mountpoint: str | None
    name: str

    def display(self, name: str | None = None) -> str:
        """A path to show the user for *name* (default: this target's name)."""
        name = self.name if name is None else name
        if self.mountpoint is None:
            return "/" + name
        return os.path.join(self.mountpoint, name) if name else self.mountpoint


def add_socket_option(parser: argparse.ArgumentParser) -> None:
    """The hidden ``--socket PATH`` every daemon-talking subcommand takes."""
    parser.add_argument("--socket", default=None, help=argparse.SUPPRESS)


def resolve(path: str, sock: str | None = None) -> Target:
    """The :class:`Target` for a user *path*; :class:`NotInMount` if it is in no kvfs mount
    and no socket was given (argument or ``$KVFS_CONTROL_SOCKET``)."""
    sock = sock or os.environ.get(ENV_SOCKET)
    if sock:
        parts = [p for p in path.split("/") if p not in ("", ".")]
        return Target(path, Path(sock), None, normalize("/".join(parts)))
    found = find_mount(path)
    if found is None:
        raise NotInMount(f"{path} is not inside a kvfs mount")
    mountpoint, name = found
    return Target(path, control_socket_path(mountpoint), mountpoint, normalize(name))


class Stream:
    """The items of a streaming reply (iterate), then :attr:`result` (the final reply's
    result). Raises :class:`DaemonError` at the end if the op failed."""

    def __init__(self, lines: Iterator[dict]) -> None:
        self._lines = lines
        self.result = None
        self.done = False

    def __iter__(self) -> Iterator[dict]:
        for msg in self._lines:
            if "ok" in msg:
                self.done = True
                if not msg["ok"]:
                    raise DaemonError(msg.get("error", "the daemon refused the request"), msg.get("type", ""))
                self.result = msg.get("result")
                return
            yield msg
        raise DaemonNotAnswering("the daemon closed the connection in the middle of a reply")


class ControlClient:
    """One connection to a daemon's control socket. *where* names the mount in messages."""

    def __init__(self, socket_path: str | os.PathLike, *, where: str | None = None, timeout: float = _TIMEOUT) -> None:
        self.socket_path = Path(socket_path)
        self.where = where or str(socket_path)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._file = None

    def _not_answering(self, why: str) -> DaemonNotAnswering:
        return DaemonNotAnswering(
            f"the kvfs daemon of {self.where} is not answering ({why}; socket {self.socket_path}); "
            "is it mounted with `kvfs mount`?"
        )

    def connect(self) -> None:
        if self._sock is not None:
            return
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(str(self.socket_path))
        except FileNotFoundError:
            s.close()
            raise self._not_answering("no control socket") from None
        except ConnectionRefusedError:
            s.close()
            raise self._not_answering("connection refused") from None
        except PermissionError:
            s.close()
            raise self._not_answering("permission denied: the socket belongs to another user") from None
        except TimeoutError:
            s.close()
            raise self._not_answering("connect timed out") from None
        self._sock = s
        self._file = s.makefile("rb")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, op: str, args: dict) -> None:
        self.connect()
        try:
            self._sock.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
        except OSError as exc:
            raise self._not_answering(f"send failed: {exc.strerror or exc}") from None

    def _lines(self) -> Iterator[dict]:
        while True:
            try:
                line = self._file.readline()
            except TimeoutError:
                raise self._not_answering(f"no reply within {self.timeout:g} s") from None
            except OSError as exc:
                raise self._not_answering(f"receive failed: {exc.strerror or exc}") from None
            if not line:
                raise self._not_answering("it closed the connection")
            try:
                yield json.loads(line)
            except ValueError:
                raise DaemonError(f"the daemon sent a line that is not JSON: {line[:80]!r}") from None

    def request(self, op: str, **args) -> object:
        """Send one request and return its result; :class:`DaemonError` if refused."""
        self._send(op, args)
        for msg in self._lines():
            if "ok" not in msg:
                continue  # an item line from an op that streams: not expected here
            if not msg["ok"]:
                raise DaemonError(msg.get("error", "the daemon refused the request"), msg.get("type", ""))
            return msg.get("result")
        raise AssertionError("unreachable")  # pragma: no cover

    def stream(self, op: str, **args) -> Stream:
        """Send a streaming request; iterate the returned :class:`Stream` for its items.
        Waits as long as the daemon keeps the connection (no reply timeout)."""
        self._send(op, args)
        self._sock.settimeout(None)
        return Stream(self._lines())


def clients_for(paths: list[str], sock: str | None) -> list[tuple[Target, ControlClient]]:
    """Resolve every path (all before talking to any daemon, so a bad path fails first)
    and pair it with a client, one client per daemon."""
    targets = [resolve(p, sock) for p in paths]
    clients: dict[Path, ControlClient] = {}
    out = []
    for t in targets:
        c = clients.get(t.socket)
        if c is None:
            c = clients[t.socket] = ControlClient(t.socket, where=t.mountpoint or str(t.socket))
        out.append((t, c))
    return out


@contextmanager
def about(target: Target) -> Iterator[None]:
    """Word the daemon's "no such block" errors with the path the user gave."""
    try:
        yield
    except DaemonError as exc:
        if exc.type == "BlockNotFound":
            raise DaemonError(f"{target.display()}: no such block or directory", exc.type) from None
        if exc.type in ("IsADirectory", "NotADirectory"):
            what = "a directory" if exc.type == "IsADirectory" else "not a directory"
            raise DaemonError(f"{target.display()}: is {what}", exc.type) from None
        raise


def run_with_progress(client: ControlClient, target: Target, op: str, label: str, progress: bool, **args) -> dict:
    """Run streaming *op* with a progress bar on stderr (``--progress``, or a terminal and
    many blocks); returns the op's final result, errors worded with *target*'s path."""
    from .render import Progress

    bar = Progress(label, force=progress)
    stream = client.stream(op, **args)
    try:
        with about(target):
            for item in stream:
                if "progress" in item:
                    bar.update(item["progress"]["done"], item["progress"]["total"])
    finally:
        bar.close()
    return stream.result
