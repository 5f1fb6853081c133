"""One connection to the daemon's socket: who is at the other end, what it may do, what
it holds, and how frames go out (with descriptors) and come in.

- the peer: :class:`kvfs.access.Peer` (``Peer.of_socket``: pid, uid, gid and
  supplementary groups from the kernel, never from anything it sent).
- :class:`AccessPolicy`: **the one place a request is authorized**
  (:meth:`AccessPolicy.authorize`). The daemon's own user (and root) may do everything;
  a peer of another user (one that reached the group socket, ``[client] socket``) may
  read — look up, lease, stat, list, subscribe to events, prefetch — and put only with
  ``[client] group_writes``; pin and evict only inside namespaces whose rule lets it;
  never an operator command that changes or stops the mount. On top of that every name
  a request carries is checked against the rule that decides for it
  (``Store.check_access``: its namespace's, or outside every namespace with one the
  mount's default, the owner's ``0755``) — the same call the FUSE mount makes, so a put
  through the socket passes exactly the rules a write through the mount passes; a batch
  fails the refused names one by one.
- :class:`Session`: what a connection holds (leases, reservations); everything is given
  back when it ends, however it ends (a client killed with SIGKILL closes its socket).
- :class:`Connection`: the frames of one stream socket (:mod:`kvfs.protocol`).
"""

from __future__ import annotations

import array
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

import trio

from kvfs.access import Operation, Peer, check, decide
from kvfs.errors import AccessDenied, InvalidName, KvfsError
from kvfs.ingest import Reservation
from kvfs.names import normalize
from kvfs.protocol import (
    Abort,
    Advise,
    Checkout,
    Commit,
    Df,
    Du,
    Error,
    Events,
    Evict,
    Hello,
    Lease,
    LineBuffer,
    Lookup,
    Ls,
    Message,
    PermissionDenied,
    Pin,
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

from .copybuffer import CopyBuffer
from .limits import PeerLimits
from .workers import Offload

__all__ = ["AccessPolicy", "Connection", "Peer", "Refused", "Session", "batch_size", "is_request"]


# Requests a peer of another user may make. Writes (reserve, commit, abort, hint) only
# with group_writes; pin and evict only inside a namespace whose rule lets it; anything else
# (shutdown, fsck, quota, ...) only the owner.
_READS: frozenset[type[Request]] = frozenset(
    {Ping, Hello, Lookup, Lease, Release, Renew, Suspect, Stat, Statistics, Ls, Du, Df, Top, Events, Prefetch}
    | {Checkout}
)
_WRITES: frozenset[type[Request]] = frozenset({Reserve, Commit, Abort, Advise})
_IN_NAMESPACES: frozenset[type[Request]] = frozenset({Pin, Evict})

# Requests that carry block names: the field and the operation each name needs
# (docs/client.md, "Security", has the table).
_NAMES: dict[type[Request], tuple[str, Operation]] = {
    Lookup: ("names", Operation.READ),
    Lease: ("names", Operation.READ),
    Checkout: ("names", Operation.READ),
    Reserve: ("names", Operation.WRITE),
    Stat: ("name", Operation.READ),
    Ls: ("name", Operation.LIST),
    Du: ("name", Operation.LIST),
    Prefetch: ("paths", Operation.READ),
    Evict: ("paths", Operation.EVICT),
    Pin: ("paths", Operation.PIN),
    Advise: ("names", Operation.EVICT),  # advice steers eviction; its count would say which names exist
}
# Requests whose reply has no place for a name's refusal: refused whole.
_WHOLE: frozenset[type[Request]] = frozenset({Advise})
# Requests whose paths may be directories, expanded to every block under them.
_EXPANDED: frozenset[type[Request]] = frozenset({Prefetch, Evict, Pin})

Refused = dict[int, KvfsError]
"""The positions of a request's names that were refused, with why (empty: none)."""


class AccessPolicy:
    """Who may do what on this daemon's sockets (see the module doc). *owner_uid*: the
    daemon's user; *group_writes*: peers of other users may put; *store*: whose
    namespaces' access rules decide, name by name, for peers of other users."""

    def __init__(self, *, owner_uid: int | None = None, group_writes: bool = False, store: Store | None = None) -> None:
        self.owner_uid = os.getuid() if owner_uid is None else owner_uid
        self.group_writes = group_writes
        self.store = store

    def is_owner(self, peer: Peer) -> bool:
        """The peer runs as the daemon's user or as root: it could open the arena and the
        tier directories itself, so nothing is withheld from it."""
        return peer.uid in (self.owner_uid, 0)

    def may_write(self, peer: Peer) -> bool:
        return self.is_owner(peer) or self.group_writes

    def may_map_arena(self, peer: Peer) -> bool:
        """Whether *peer* gets the arena's descriptor: the owner, or a peer that may read
        every namespace with a rule (``Store.may_map_arena``); others read through copies."""
        return self.is_owner(peer) or self.store is None or self.store.may_map_arena(peer)

    def may_read(self, peer: Peer, name: str) -> bool:
        """Whether *peer* may read block *name* (an event about it, say)."""
        if self.is_owner(peer) or self.store is None:
            return True
        try:
            self.store.check_access(peer, name, Operation.READ)
        except (AccessDenied, InvalidName):
            return False
        return True

    def authorize(self, peer: Peer, request: Request) -> Refused:
        """Raise :class:`PermissionDenied` (or :class:`~kvfs.errors.AccessDenied`)
        unless *peer* may make *request*; return the names of it refused one by one.

        A request of one name (stat, ls, du) is refused whole. A batch (lookup, lease,
        reserve, prefetch, evict, pin) has each name checked against its namespace's rule
        and the refused ones returned by position: the op fails those names and does the
        rest. A prefetch, evict or pin all of whose names are refused is refused whole, and
        so is a hint with any (its reply counts the names held: it has no place to say)."""
        if self.is_owner(peer):
            return {}
        kind = type(request)
        gate = (
            (kind in _READS and not (isinstance(request, Hello) and request.write and not self.group_writes))
            or (kind in _WRITES and self.group_writes)
            or (kind in _IN_NAMESPACES and self.store is not None and bool(self.store.namespaces))  # per name below
        )
        if not gate:
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
        spec = _NAMES.get(kind)
        if spec is None or self.store is None:
            return {}
        attr, op = spec
        if not self.store.namespaces and decide(peer, self.store.namespaces.default, op):
            return {}  # one rule for every name, and it allows: nothing to check name by name
        value = getattr(request, attr)
        if isinstance(value, str):
            self._check(peer, value, op, request)
            return {}
        refused: Refused = {}
        for i, name in enumerate(value):
            try:
                self._check(peer, name, op, request)
            except (AccessDenied, PermissionDenied) as exc:
                refused[i] = exc
        if refused and (kind in _WHOLE or (kind in _EXPANDED and len(refused) == len(value))):
            raise next(iter(refused.values()))
        return refused

    def _check(self, peer: Peer, name: str, op: Operation, request: Request) -> None:
        """Raise unless *peer* may do *op* to *name* (for a directory that *request*
        expands: to every namespace under it)."""
        assert self.store is not None
        try:
            path = normalize(name)
        except InvalidName:
            return  # the op answers the name with its error
        kind = type(request)
        ns = self.store.namespaces.of(path)
        if kind in _IN_NAMESPACES and (ns is None or ns.access is None):
            raise PermissionDenied(
                f"uid {peer.uid} may not use the {request.kind} command on {path or '/'!r}: it is in no namespace "
                f"with an access rule (the mount belongs to uid {self.owner_uid}); run it as the mount's owner"
            )
        self.store.check_access(peer, path, op)  # the one decision, the mount's too (outside namespaces: its default)
        if kind not in _EXPANDED:
            return
        if ns is None:  # a directory above namespaces: each one under it must allow it too
            for inner in self.store.namespaces:
                if inner.access is not None and (not path or inner.path.startswith(path + "/")):
                    check(peer, inner.access, op, namespace=inner.path)


@dataclass(eq=False)
class Session:
    """What one connection holds. ``write``: it was granted puts (a read-write arena, or
    its copy buffer). ``copies``: the session's copy buffer when it may not map the arena
    (:mod:`kvfs.mount.copybuffer`); then ``copy_slots`` and ``put_slots`` say which slot
    of it each lease and each reservation holds (by id)."""

    peer: Peer
    owner: bool
    hello: bool = False
    write: bool = False
    client: str = ""
    leases: set[int] = field(default_factory=set)
    reservations: dict[int, Reservation] = field(default_factory=dict)
    copies: CopyBuffer | None = None
    copy_slots: dict[int, int] = field(default_factory=dict)
    put_slots: dict[int, int] = field(default_factory=dict)

    @property
    def reserved_bytes(self) -> int:
        return sum(r.size for r in self.reservations.values())

    @property
    def holds_anything(self) -> bool:
        return bool(self.leases or self.reservations or self.copies is not None)

    def free_slots(self, leases: Iterable[int] = (), reservations: Iterable[int] = ()) -> None:
        """Give back the copy-buffer slots of these leases and reservations."""
        if self.copies is None:
            return
        for i in leases:
            off = self.copy_slots.pop(i, None)
            if off is not None:
                self.copies.give_back(off)
        for i in reservations:
            off = self.put_slots.pop(i, None)
            if off is not None:
                self.copies.give_back(off)

    def close(self, store: Store) -> None:
        """Give back everything it holds (in a worker thread: a released lease may let a
        waiting file delete run), its copy buffer too."""
        leases, self.leases = list(self.leases), set()
        reservations, self.reservations = list(self.reservations.values()), {}
        copies, self.copies = self.copies, None
        self.copy_slots.clear()
        self.put_slots.clear()
        store.leases.release_many(leases)
        for res in reservations:
            store.abort(res)
        if copies is not None:
            copies.close()


class Connection:
    """The frames of one accepted stream: :meth:`receive` the next request, :meth:`send`
    a message (with descriptors passed alongside, SCM_RIGHTS). Holds the :class:`Session`.
    *cpu* encodes big replies off the loop (``Workers.cpu``)."""

    def __init__(
        self, stream: trio.SocketStream, session: Session, limits: PeerLimits | None = None, *, cpu: Offload
    ) -> None:
        self.stream = stream
        self._cpu = cpu
        self.session = session
        self.limits = limits
        self._frames = LineBuffer()
        self._lines: list[bytes] = []
        self._held = 0  # bytes of frames received and not answered yet, charged to the peer's uid
        self.refused: Refused = {}
        """The names of the request being answered that were refused (by position)."""

    @property
    def peer(self) -> Peer:
        return self.session.peer

    async def receive(self) -> bytes | None:
        """The next frame, or None when the peer hung up (a partial frame is dropped).
        :class:`ProtocolError` for a frame over the limit, :class:`LimitReached` for bytes
        in flight past the peer's or the daemon's limit (close the connection then)."""
        self._charge(sum(map(len, self._lines)) + self._frames.pending)  # the frame answered is given back
        while not self._lines:
            try:
                chunk = await self.stream.receive_some(1 << 20)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not chunk:
                return None
            self._lines = self._frames.feed(chunk)
            self._charge(sum(map(len, self._lines)) + self._frames.pending)
        return self._lines.pop(0)

    def _charge(self, held: int) -> None:
        """Charge the bytes this connection holds now (*held*, with the frame being
        answered) to its peer's uid; :class:`LimitReached` past a limit."""
        if self.limits is not None and held != self._held:
            self.limits.charge(self.peer.uid, held - self._held, refuse=True)
        self._held = held

    def close(self) -> None:
        """Give back what this connection held against its peer's limits."""
        if self.limits is not None and self._held:
            self.limits.charge(self.peer.uid, -self._held, refuse=False)
        self._held = 0
        self._lines = []

    async def send(self, msg: Message, fds: list[int] | None = None, *, big: bool = False) -> None:
        """Send *msg*; *big*: it answers a big batch, and is encoded in a worker thread
        (a reply of 65,536 grants takes a quarter of a second to encode). The reply counts
        in the peer's bytes in flight until it is sent."""
        data = await self._cpu(encode, msg) if big else encode(msg)
        n = len(data)
        if self.limits is not None:
            self.limits.charge(self.peer.uid, n, refuse=False)
        try:
            if fds:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                sent = await self.stream.socket.sendmsg([data], ancillary)
                data = data[sent:]
            if data:
                await self.stream.send_all(data)
        finally:
            if self.limits is not None:
                self.limits.charge(self.peer.uid, -n, refuse=False)

    async def send_error(self, exc: BaseException) -> None:
        await self.send(Error.of(exc))


def batch_size(request: Request) -> int:
    """How many names, ids or paths *request* carries (its longest list of them)."""
    n = 0
    for attr in ("names", "ids", "paths"):
        v = getattr(request, attr, None)
        if isinstance(v, list):
            n = max(n, len(v))
    return n


def is_request(msg: Message) -> Request:
    """*msg* if it is a request; :class:`ProtocolError` otherwise (a client sent a reply)."""
    if not isinstance(msg, Request):
        raise ProtocolError(f"{msg.kind!r} is not a request")
    return msg
