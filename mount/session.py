"""One connection to the daemon's socket: who is at the other end, what it may do, what
it holds, and how frames go out (with descriptors) and come in.

- :class:`Peer`: the connecting process's pid, uid and gid, from the kernel
  (``SO_PEERCRED``), never from anything it sent.
- :class:`AccessPolicy`: **the one place a request is authorized**
  (:meth:`AccessPolicy.authorize`). The daemon's own user (and root) may do everything;
  a peer of another user (one that reached the group socket, ``[client] socket``) may
  read — look up, lease, stat, list, subscribe to events, prefetch — and put only with
  ``[client] group_writes``; never an operator command that changes or stops the mount.
  Namespaces and quotas (issue 15) plug in here.
- :class:`Session`: what a connection holds (leases, reservations); everything is given
  back when it ends, however it ends (a client killed with SIGKILL closes its socket).
- :class:`Connection`: the frames of one stream socket (:mod:`kvfs.protocol`).
"""

from __future__ import annotations

import array
import functools
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio

from kvfs.errors import StoreBusy
from kvfs.ingest import Reservation
from kvfs.protocol import (
    Abort,
    Advise,
    Commit,
    Df,
    Du,
    Error,
    Events,
    Hello,
    Lease,
    LineBuffer,
    Lookup,
    Ls,
    Message,
    PermissionDenied,
    Ping,
    Prefetch,
    ProtocolError,
    Release,
    Renew,
    Request,
    Reserve,
    Stat,
    Statistics,
    Suspect,
    Top,
    encode,
)
from kvfs.store import Store

__all__ = ["AccessPolicy", "Connection", "Peer", "Session", "call_store", "is_request"]

T = TypeVar("T")

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True, slots=True)
class Peer:
    """The process at the other end of a Unix socket, as the kernel says."""

    pid: int
    uid: int
    gid: int

    @classmethod
    def of(cls, sock: Any) -> Peer:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        pid, uid, gid = _PEERCRED.unpack(raw)
        return cls(pid=pid, uid=uid, gid=gid)


# Requests a peer of another user may make. Writes (reserve, commit, abort, hint) only with
# group_writes; anything else (shutdown, pin, evict, fsck, ...) only the owner.
_READS: frozenset[type[Request]] = frozenset(
    {Ping, Hello, Lookup, Lease, Release, Renew, Suspect, Stat, Statistics, Ls, Du, Df, Top, Events, Prefetch}
)
_WRITES: frozenset[type[Request]] = frozenset({Reserve, Commit, Abort, Advise})


class AccessPolicy:
    """Who may do what on this daemon's sockets (see the module doc). *owner_uid*: the
    daemon's user; *group_writes*: peers of other users may put."""

    def __init__(self, *, owner_uid: int | None = None, group_writes: bool = False) -> None:
        self.owner_uid = os.getuid() if owner_uid is None else owner_uid
        self.group_writes = group_writes

    def is_owner(self, peer: Peer) -> bool:
        """The peer runs as the daemon's user or as root: it could open the arena and the
        tier directories itself, so nothing is withheld from it."""
        return peer.uid in (self.owner_uid, 0)

    def may_write(self, peer: Peer) -> bool:
        return self.is_owner(peer) or self.group_writes

    def authorize(self, peer: Peer, request: Request) -> None:
        """Raise :class:`PermissionDenied` unless *peer* may make *request*."""
        if self.is_owner(peer):
            return
        kind = type(request)
        if kind in _READS and not (isinstance(request, Hello) and request.write and not self.group_writes):
            return
        if kind in _WRITES and self.group_writes:
            return
        writes = kind in _WRITES or isinstance(request, Hello)
        what = ("hints" if kind is Advise else "puts") if writes else f"the {request.kind} command"
        hint = (
            f"set [client] group_writes = true in the mount's config to let its group make {what}"
            if writes
            else "run it as the mount's owner"
        )
        raise PermissionDenied(
            f"uid {peer.uid} may not use {what} on this mount (it belongs to uid {self.owner_uid}); {hint}"
        )


@dataclass(eq=False)
class Session:
    """What one connection holds. ``write``: it was granted a read-write arena (puts)."""

    peer: Peer
    owner: bool
    hello: bool = False
    write: bool = False
    client: str = ""
    leases: set[int] = field(default_factory=set)
    reservations: dict[int, Reservation] = field(default_factory=dict)

    @property
    def reserved_bytes(self) -> int:
        return sum(r.size for r in self.reservations.values())

    def close(self, store: Store) -> None:
        """Give back everything it holds (in a worker thread: a released lease may let a
        waiting file delete run)."""
        leases, self.leases = list(self.leases), set()
        reservations, self.reservations = list(self.reservations.values()), {}
        store.leases.release_many(leases)
        for res in reservations:
            store.abort(res)


async def call_store(store: Store, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` (a store method) on the loop if it runs at memory speed now
    (``Store.nowait``), else in a worker thread."""
    try:
        return store.nowait(fn, *args, **kwargs)
    except StoreBusy:
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


class Connection:
    """The frames of one accepted stream: :meth:`receive` the next request, :meth:`send`
    a message (with descriptors passed alongside, SCM_RIGHTS). Holds the :class:`Session`."""

    def __init__(self, stream: trio.SocketStream, session: Session) -> None:
        self.stream = stream
        self.session = session
        self._frames = LineBuffer()
        self._lines: list[bytes] = []

    @property
    def peer(self) -> Peer:
        return self.session.peer

    async def receive(self) -> bytes | None:
        """The next frame, or None when the peer hung up (a partial frame is dropped).
        :class:`ProtocolError` for a frame over the limit (close the connection then)."""
        while not self._lines:
            try:
                chunk = await self.stream.receive_some(1 << 20)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not chunk:
                return None
            self._lines = self._frames.feed(chunk)
        return self._lines.pop(0)

    async def send(self, msg: Message, fds: list[int] | None = None) -> None:
        data = encode(msg)
        if fds:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            sent = await self.stream.socket.sendmsg([data], ancillary)
            data = data[sent:]
        if data:
            await self.stream.send_all(data)

    async def send_error(self, exc: BaseException) -> None:
        await self.send(Error.of(exc))


def is_request(msg: Message) -> Request:
    """*msg* if it is a request; :class:`ProtocolError` otherwise (a client sent a reply)."""
    if not isinstance(msg, Request):
        raise ProtocolError(f"{msg.kind!r} is not a request")
    return msg
