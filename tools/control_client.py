"""Talking to a mount's daemon from the ``kvfs`` command: find it, ask it, stream from it.

A user path is resolved to ``(control socket, name inside the mount)``: normally through
``/proc/self/mountinfo`` (:func:`kvfs.runtime.find_mount`) and the socket path derived
from the mountpoint. ``--socket PATH`` (hidden) or ``$KVFS_CONTROL_SOCKET`` names the
socket directly; paths are then names relative to the mount root (a leading ``/`` and
``.`` components are dropped). That is how the tests drive a store behind a control
server without a FUSE mount, and how an operator can reach a daemon whose mount is gone.

Requests and replies are the typed messages of :mod:`kvfs.protocol`, over a
:class:`kvfs.client.connection.Connection`; an error the daemon answered is raised as its
own class (``BlockNotFound``, ...), worded with the user's path by :func:`about`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvfs.client.connection import Connection, Stream
from kvfs.errors import BlockNotFound, IsADirectory, KvfsError, NotADirectory
from kvfs.names import normalize
from kvfs.protocol import DaemonNotAnswering, Message, Progress, Request
from kvfs.runtime import control_socket_path, find_mount

__all__ = [
    "ENV_SOCKET",
    "ControlClient",
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


class ControlClient(Connection):
    """One connection to a daemon's control socket (a :class:`Connection` with the
    tools' reply timeout). *where* names the mount in messages."""

    def __init__(
        self, socket_path: str | os.PathLike[str], *, where: str | None = None, timeout: float = _TIMEOUT
    ) -> None:
        super().__init__(socket_path, where=where, timeout=timeout)


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
    except BlockNotFound:
        raise BlockNotFound(f"{target.display()}: no such block or directory") from None
    except (IsADirectory, NotADirectory) as exc:
        what = "a directory" if isinstance(exc, IsADirectory) else "not a directory"
        raise type(exc)(f"{target.display()}: is {what}") from None


def replies_for(
    paths: list[str], sock: str | None, request: Callable[[Target], Request], reply: type[Message]
) -> list[dict[str, Any]]:
    """Each path's reply to ``request(target)``, as JSON with the path shown to the user
    under ``"path"`` (errors worded with that path: :func:`about`)."""
    results = []
    for target, client in clients_for(paths, sock):
        with about(target):
            res = client.request(request(target), reply).to_json()
        res["path"] = target.display()
        results.append(res)
    return results


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """``--progress``, for a subcommand that runs with :func:`run_with_progress`."""
    parser.add_argument(
        "--progress", action="store_true", help="draw the progress bar on stderr even when it is not a terminal"
    )


def run_with_progress(client: ControlClient, target: Target, request: Request, label: str, progress: bool) -> Any:
    """Run the streaming *request* with a progress bar on stderr (``--progress``, or a
    terminal and many blocks); returns its final reply, errors worded with *target*'s path."""
    from .render import Progress as Bar

    bar = Bar(label, force=progress)
    stream = client.stream(request)
    try:
        with about(target):
            for item in stream:
                if isinstance(item, Progress):
                    bar.update(item.done, item.total)
    finally:
        bar.close()
    return stream.result
