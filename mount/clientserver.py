"""The daemon's side of the batch client (:mod:`kvfs.client`): sessions, lookups, leases
and two-phase puts over the mount's socket.

Only descriptors cross the socket: names, extents of the shared-memory arena, block file
paths and offsets, lease ids, checksums. The arena's file descriptor is handed over once,
with the :class:`~kvfs.protocol.Welcome` (SCM_RIGHTS): opened read-only unless the session
was granted writes, so a reader's mapping cannot be made writable.

- ``lookup``: presence, size, tiers and pin state of many names and the cached prefix
  length of a chain, under one acquisition of the store's lock, on the loop.
- ``lease``: a lease per name on its hottest local copy (DRAM extent, or block file with
  its 4 KiB-aligned payload offset), after promoting it per the request; ``release``,
  ``renew``; ``suspect``: a leased copy failed the client's checksum, the daemon re-checks
  it and drops it if bad.
- ``reserve`` / ``commit`` / ``abort``: puts whose bytes the client copies straight into
  reserved arena extents (:mod:`kvfs.ingest`); the daemon checks the checksum before it
  commits.

A session's leases and reservations are given back the moment its connection ends
(:meth:`Session.close`): a client killed with SIGKILL loses them at once.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import trio

from kvfs import __version__
from kvfs.blockfile import checksum as compute_checksum
from kvfs.client.buffers import copy_hashed
from kvfs.config import ClientConfig
from kvfs.errors import BlockCorrupt, KvfsError, NoSpace
from kvfs.events import Event
from kvfs.ingest import Reservation
from kvfs.leases import MAX_TTL
from kvfs.leases import Lease as StoreLease
from kvfs.protocol import (
    Abort,
    Aborted,
    ArenaInfo,
    CheckedOut,
    Checkout,
    Commit,
    Committed,
    Grant,
    Hello,
    Lease,
    Leased,
    LeaseEnded,
    Lookup,
    LookupResult,
    PermissionDenied,
    Promote,
    ProtocolError,
    Release,
    Released,
    Renew,
    Renewed,
    Reserve,
    Reserved,
    Slot,
    Suspect,
    SuspectResult,
    TierInfo,
    Welcome,
    WireError,
    error_type,
)
from kvfs.store import Store

from .copybuffer import CopyBuffer
from .session import AccessPolicy, Connection, Refused, Session
from .workers import Workers

__all__ = ["ClientOps"]

log = logging.getLogger("kvfs.mount.client")

T = TypeVar("T")

_RESERVE_TTL = 30.0  # seconds a reservation may wait for its commit
_COPY_BUFFER = 64 << 20  # a copy buffer's size where [client] sets none and the mount takes no puts
_ON_LOOP = 4096  # names or ids a request handles on the loop; more go to a worker thread


def _wire(exc: BaseException) -> WireError:
    return WireError(type=error_type(exc), message=str(exc))


def _allowed(names: list[str], refused: Refused) -> list[str]:
    """The names of a batch that were not refused, in order."""
    return [n for i, n in enumerate(names) if i not in refused] if refused else names


def _spread(refused: Refused, n: int, done: list[T], fill: Callable[[KvfsError], T]) -> list[T]:
    """Per position of a batch of *n*: the next of *done* (the allowed names' results),
    or *fill* of the refusal."""
    it = iter(done)
    return [fill(refused[i]) if i in refused else next(it) for i in range(n)]


class MountSide(Protocol):
    """What the FUSE mount of the same daemon must hear of the batch client's calls, so
    that a program on the mount and an engine on the client see one namespace."""

    async def settle_outside(self, names: list[str]) -> None:
        """Before names are read: wait for seals of files just closed on the mount (names as
        the request gave them; an invalid one is skipped)."""

    async def published_outside(self, names: list[str]) -> None:
        """After names were published: the kernel drops what it cached of them."""

    def names_changed(self, events: list[Event], dropped: int) -> None:
        """The store's events as drained, and its count of events lost so far: the kernel
        forgets the names they removed, replaced or renamed."""


class ClientOps:
    """The batch client's ops on *store* (methods ``op_<kind>``, see :class:`Server`);
    *workers* runs what leaves the loop (the daemon's one :class:`Workers`)."""

    def __init__(
        self,
        store: Store,
        mountpoint: str,
        config: ClientConfig,
        access: AccessPolicy,
        mount: MountSide | None = None,
        *,
        workers: Workers | None = None,
    ) -> None:
        self.store = store
        self.mount = mount
        self.workers = workers if workers is not None else Workers(store)
        self.mountpoint = mountpoint
        self.config = config
        self.access = access
        arena = store.slots[0].tier
        self.arena = arena if arena.reservable else None
        cap = arena.capacity or 0
        self.max_reserved = config.max_reserved or cap // 2
        self.max_put = min(self.max_reserved, cap) if self.arena is not None else 0
        self.copy_buffer = config.copy_buffer or self.max_reserved or _COPY_BUFFER
        self._arena_rw: memoryview | None = None  # the arena file, writable: puts of copy-buffer sessions
        self.lease_ttl = min(config.lease_ttl, MAX_TTL)

    # -- the session ---------------------------------------------------------------------

    async def op_hello(self, conn: Connection, req: Hello) -> None:
        """The session's terms, and the arena's descriptor (read-only unless *write*)."""
        s = conn.session
        if req.write and not self.access.may_write(conn.peer):
            raise PermissionDenied(f"uid {conn.peer.uid} may not put on this mount")
        if req.write and self.arena is None:
            raise KvfsError(
                f"{self.mountpoint} has no DRAM tier: client puts need the shared-memory arena; write through the mount"
            )
        if s.hello:
            raise ProtocolError("hello: this session is open already; connect again for another")
        s.hello, s.write, s.client = True, req.write, req.client
        info = None
        fds = []
        max_put, max_reserved = self.max_put, self.max_reserved
        if req.copy or not self.access.may_map_arena(conn.peer):  # a rule keeps it from reading every block
            s.copies = await self.workers.client(CopyBuffer, self.copy_buffer)
            fds.append(s.copies.share())
            max_put, max_reserved = min(max_put, s.copies.size), min(max_reserved, s.copies.size)
        elif self.arena is not None:
            fds.append(self.arena.share(writable=req.write))
            info = ArenaInfo(
                path=str(getattr(self.arena, "path", "")),
                size=os.fstat(fds[0]).st_size,
                capacity=self.arena.capacity or 0,
            )
        welcome = Welcome(
            pid=os.getpid(),
            mountpoint=self.mountpoint,
            owner=s.owner,
            write=req.write,
            tiers=[
                TierInfo(name=t.name, kind=t.kind.value, persistent=t.persistent, shared=t.shared, capacity=t.capacity)
                for t in self.store.tiers
            ],
            arena=info,
            max_put=max_put,
            max_reserved=max_reserved,
            lease_ttl=self.lease_ttl,
            max_ttl=MAX_TTL,
            copy_buffer=0 if s.copies is None else s.copies.size,
            version=__version__,
        )
        try:
            await conn.send(welcome, fds)
        finally:
            for fd in fds:
                os.close(fd)
        log.info(
            "client session %s (pid %s, uid %d, %s%s)",
            req.client or "-",
            conn.peer.pid,
            conn.peer.uid,
            "read-write" if req.write else "read-only",
            "" if s.copies is None else ", through a copy buffer",
        )

    # -- reads ---------------------------------------------------------------------------

    async def _batch(self, fn: Callable[..., T], names: list[str], **kwargs: Any) -> T:
        """*fn(names)* on the loop when the batch is small enough to hold the store's lock
        briefly, else in a worker thread (the FUSE loop never waits behind a big batch)."""
        if len(names) > _ON_LOOP:
            return await self._in_worker(functools.partial(fn, names, **kwargs))
        return await self.workers.loop_or(self.workers.client, fn, names, **kwargs)

    async def _sized(self, n: int, fn: Callable[[], T]) -> T:
        """*fn()*, the part of a request of *n* names or ids that runs at memory speed: on
        the loop for a small batch, in a worker thread for a big one."""
        return fn() if n <= _ON_LOOP else await self._in_worker(fn)

    async def _in_worker(self, fn: Callable[[], T]) -> T:
        """*fn()* in a worker thread of big batches (``Workers.cpu``): however many
        sessions send big batches, they share a few threads and wait their turn, while
        the loop (FUSE, every other client) goes on."""
        return await self.workers.cpu(fn)

    async def _settle(self, names: list[str]) -> None:
        if self.mount is not None:
            await self.mount.settle_outside(names)

    async def op_lookup(self, conn: Connection, req: Lookup) -> LookupResult:
        refused = conn.refused
        names = _allowed(req.names, refused)
        await self._settle(names)
        p = await self._batch(self.store.probe, names)
        if not refused:
            return LookupResult(sizes=p.sizes, tiers=p.tiers, pinned=p.pinned, prefix=p.prefix)
        n = len(req.names)
        sizes = _spread(refused, n, p.sizes, lambda e: -1)
        return LookupResult(
            sizes=sizes,
            tiers=_spread(refused, n, p.tiers, lambda e: 0),
            pinned=_spread(refused, n, p.pinned, lambda e: False),
            prefix=next((i for i, size in enumerate(sizes) if size < 0), n),
            errors=_spread(refused, n, [None] * len(names), _wire),
        )

    def _ttl(self, ttl: float) -> float:
        if ttl < 0:
            raise ProtocolError(f"a ttl cannot be negative (got {ttl})")
        return min(ttl or self.lease_ttl, MAX_TTL)

    async def op_lease(self, conn: Connection, req: Lease) -> Leased:
        if req.promote not in Promote.ALL:
            raise ProtocolError(f"lease.promote: {req.promote!r} is not one of {', '.join(Promote.ALL)}")
        promote = req.promote
        names = _allowed(req.names, conn.refused)
        await self._settle(names)
        if not conn.session.owner:
            promote = Promote.ALWAYS  # another user cannot open the tier's files: read them from DRAM
        leased = await self._batch(
            self.store.lease_many, names, ttl=self._ttl(req.ttl), promote=promote, count_hits=req.count_hits
        )
        refused, n = conn.refused, len(req.names)
        results = await self._sized(n, lambda: _spread(refused, n, leased, lambda e: e))
        if conn.session.copies is not None:
            results = await self.workers.client(self._copy_out, conn.session, results)
        return await self._sized(n, functools.partial(self._leased, conn.session, results))

    def _leased(self, s: Session, results: list[StoreLease | KvfsError]) -> Leased:
        """The reply to a lease: a grant per lease taken (now held by session *s*), an
        error per name that failed."""
        now = self.store.leases.clock()
        grants: list[Grant | None] = []
        errors: list[WireError | None] = []
        for r in results:
            if isinstance(r, KvfsError):
                grants.append(None)
                errors.append(_wire(r))
                continue
            loc = r.location
            assert loc is not None  # local copies (DRAM, disk) always have a place
            s.leases.add(r.id)
            slot = s.copy_slots.get(r.id)
            grants.append(
                Grant(
                    id=r.id,
                    tier=r.tier,
                    kind="copy" if slot is not None else "file" if r.ref is None else "arena",
                    path="" if slot is not None else loc.path,
                    offset=loc.offset if slot is None else slot,
                    length=loc.length,
                    checksum=r.checksum,
                    ttl=max(0.0, r.expires - now),
                )
            )
            errors.append(None)
        return Leased(grants=grants, errors=errors)

    async def op_checkout(self, conn: Connection, req: Checkout) -> CheckedOut:
        """The leases of :meth:`op_lease`, answered in columns (one round trip of a read,
        cheap to encode and check on both sides however many names)."""
        if req.promote not in Promote.ALL:
            raise ProtocolError(f"checkout.promote: {req.promote!r} is not one of {', '.join(Promote.ALL)}")
        if len(req.release) > _ON_LOOP:
            await self.op_release(conn, Release(ids=req.release))
        elif req.release:
            self._end_after_reply(conn.session, req.release)
        promote = req.promote
        names = _allowed(req.names, conn.refused)
        await self._settle(names)
        if not conn.session.owner:
            promote = Promote.ALWAYS  # another user cannot open the tier's files: read them from DRAM
        ttl = self._ttl(req.ttl)
        leased = await self._batch(self.store.lease_many, names, ttl=ttl, promote=promote, count_hits=req.count_hits)
        refused, n = conn.refused, len(req.names)
        results = await self._sized(n, lambda: _spread(refused, n, leased, lambda e: e)) if refused else leased
        s = conn.session
        if s.copies is not None:
            results = await self.workers.client(self._copy_out, s, results)
        return await self._sized(n, functools.partial(self._checked_out, s, results, ttl))

    def _end_after_reply(self, s: Session, ids: list[int]) -> None:
        """End the leases a checkout carries that session *s* holds: they leave the session
        now (their copy-buffer slots too, which this checkout may take), and the store ends
        them in a task of their own, which runs once this task sent the reply: the client
        was done with them, and its read does not wait for their end."""
        held = s.leases
        ids = [i for i in ids if i in held]
        if ids:
            held.difference_update(ids)
            s.free_slots(leases=ids)
            trio.lowlevel.spawn_system_task(self._end_leases, ids)

    async def _end_leases(self, ids: list[int]) -> None:
        try:
            await self.workers.loop_or(self.workers.client, self.store.leases.release_many, ids)
        except Exception:  # a system task must not raise (it would end the loop): say so, the deadline ends them
            log.exception("ending %d leases a checkout carried failed", len(ids))

    def _checked_out(self, s: Session, results: list[StoreLease | KvfsError], ttl: float) -> CheckedOut:
        """The reply to a checkout: its leases (now held by session *s*) in columns."""
        index = self._tier_index
        ids, tiers, kinds, paths, offsets, lengths, sums = [], [], [], [], [], [], []
        errors: list[WireError | None] = []
        failed = False
        for r in results:
            if isinstance(r, KvfsError):
                failed = True
                ids.append(0)
                tiers.append(-1)
                kinds.append("")
                paths.append("")
                offsets.append(0)
                lengths.append(0)
                sums.append(0)
                errors.append(_wire(r))
                continue
            loc = r.location
            assert loc is not None  # local copies (DRAM, disk) always have a place
            s.leases.add(r.id)
            slot = s.copy_slots.get(r.id) if s.copies is not None else None
            ids.append(r.id)
            tiers.append(index[r.tier])
            if slot is not None:
                kinds.append("copy")
                paths.append("")
                offsets.append(slot)
            else:
                kinds.append("file" if r.ref is None else "arena")
                paths.append(loc.path if r.ref is None else "")
                offsets.append(loc.offset)
            lengths.append(loc.length)
            sums.append(r.checksum)
            errors.append(None)
        return CheckedOut(
            ids=ids,
            tiers=tiers,
            kinds=kinds,
            paths=paths,
            offsets=offsets,
            lengths=lengths,
            checksums=sums,
            ttl=ttl,
            errors=errors if failed else [],
        )

    @functools.cached_property
    def _tier_index(self) -> dict[str, int]:
        """A tier's name -> its position in the Welcome's tier list."""
        return {t.name: i for i, t in enumerate(self.store.tiers)}

    def _copy_out(self, s: Session, results: list[StoreLease | KvfsError]) -> list[StoreLease | KvfsError]:
        """For a session with a copy buffer: copy each leased block into a slot of it
        and check the copy against the block's checksum (a copy that fails is re-checked
        where it lies, dropped if bad, and leased once more from wherever the block is
        now). In a worker thread."""
        assert s.copies is not None
        out: list[StoreLease | KvfsError] = []
        for r in results:
            for attempt in range(2):
                if isinstance(r, KvfsError):
                    break
                got = self._copy_one(s.copies, r)
                if isinstance(got, int):
                    s.copy_slots[r.id] = got
                    break
                self.store.release(r)
                if isinstance(got, NoSpace) or attempt == 1:
                    r = got
                    break
                log.warning("copy of %s in %s failed its check for a copy-buffer client", r.name, r.tier)
                self.store.check_copy(r.name, r.tier)
                ttl = max(1.0, r.expires - self.store.leases.clock())
                [r] = self.store.lease_many([r.name], ttl=ttl, promote=Promote.ALWAYS)
            out.append(r)
        return out

    def _copy_one(self, copies: CopyBuffer, r: StoreLease) -> int | KvfsError:
        """Copy leased block *r* into a new slot of *copies*: the slot's offset, or why not."""
        off = copies.take(r.size)
        if off is None:
            return NoSpace(
                f"{r.name!r} ({r.size} bytes) does not fit in this session's copy buffer ({copies.size} bytes, "
                f"{copies.used} held: [client] copy_buffer); release views or read fewer blocks at once"
            )
        dst = copies.view(off, r.size)
        if r.ref is not None:  # the source's pieces hashed right after each is copied, while in cache
            good = copy_hashed(dst, [r.ref.data]) == r.checksum
        else:
            assert r.location is not None
            fd = os.open(r.location.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                got = os.preadv(fd, [dst], r.location.offset)
            finally:
                os.close(fd)
            # the slot is the client's to write too: a client that does can only spoil its own copy
            good = got == r.size and compute_checksum(dst) == r.checksum
        if not good:
            copies.give_back(off)
            return BlockCorrupt(f"{r.name!r}: its copy in {r.tier} does not match the block's checksum")
        return off

    def _copy_in(self, copies: CopyBuffer, off: int, r: Reservation) -> None:
        """Copy a put from its slot of *copies* into its reserved arena extent (which the
        client cannot reach: the store then checks the bytes there)."""
        if self._arena_rw is None:
            assert self.arena is not None  # reservations exist only with an arena
            fd = self.arena.share(writable=True)
            try:
                self._arena_rw = memoryview(mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED))
            finally:
                os.close(fd)
        at = r.location.offset  # the arena file's offset
        self._arena_rw[at : at + r.size] = copies.view(off, r.size)

    def _own(self, conn: Connection, ids: list[int]) -> list[int]:
        held = conn.session.leases
        return [i for i in ids if i in held]

    async def op_release(self, conn: Connection, req: Release) -> Released:
        s = conn.session

        def release() -> int:
            ids = self._own(conn, req.ids)
            s.leases.difference_update(ids)
            s.free_slots(leases=ids)
            return self.store.leases.release_many(ids)

        if len(req.ids) > _ON_LOOP:
            return Released(count=await self._in_worker(release))
        ids = self._own(conn, req.ids)
        s.leases.difference_update(ids)
        s.free_slots(leases=ids)
        return Released(count=await self.workers.loop_or(self.workers.client, self.store.leases.release_many, ids))

    async def op_renew(self, conn: Connection, req: Renew) -> Renewed:
        ttl = self._ttl(req.ttl)
        s = conn.session

        def renew() -> Renewed:
            now = self.store.leases.clock()
            held = s.leases
            out: list[float | None] = []
            for i in req.ids:
                expires = self.store.leases.renew(i, ttl) if i in held else None
                if expires is None and i in held:  # it ended by its deadline: so does its slot
                    held.discard(i)
                    s.free_slots(leases=[i])
                out.append(None if expires is None else expires - now)
            return Renewed(ttls=out)

        return await self._sized(len(req.ids), renew)

    async def op_suspect(self, conn: Connection, req: Suspect) -> SuspectResult:
        if req.lease not in conn.session.leases:
            raise LeaseEnded(f"lease {req.lease} is not held by this session")
        lease = self.store.leases.get(req.lease)
        conn.session.leases.discard(req.lease)
        conn.session.free_slots(leases=[req.lease])
        if lease is None:
            raise LeaseEnded(f"lease {req.lease} ended (released or expired) before it was reported")
        log.warning(
            "client pid %d: copy of %s in %s failed its check: %s", conn.peer.pid, lease.name, lease.tier, req.why
        )
        await self.workers.client(self.store.release, lease)
        why = await self.workers.client(self.store.check_copy, lease.name, lease.tier)
        return SuspectResult(dropped=why is not None)

    # -- puts ----------------------------------------------------------------------------

    def _writer(self, conn: Connection) -> Session:
        s = conn.session
        if not s.write:
            raise PermissionDenied("this session may not put: connect with write=True (Hello.write)")
        return s

    async def op_reserve(self, conn: Connection, req: Reserve) -> Reserved:
        """Reserve an extent per name (all or none, but names a rule refused fail alone),
        in a worker thread: making room may evict, and a batch may be long."""
        s = self._writer(conn)
        n = len(req.names)
        if len(req.sizes) != n or (req.parents and len(req.parents) != n):
            raise ProtocolError("reserve: names, sizes and parents must be lists of the same length")
        refused = conn.refused
        copies = s.copies

        def check() -> list[tuple[str, int, str | None]]:
            for name, size in zip(req.names, req.sizes, strict=True):
                if size > self.max_put:
                    raise NoSpace(
                        f"a put of {name!r} ({size} bytes) is larger than this mount takes from a client "
                        f"({self.max_put} bytes: [client] max_reserved, at most the DRAM tier); "
                        "write it through the mount"
                    )
            parents = req.parents or [None] * n
            todo = [t for i, t in enumerate(zip(req.names, req.sizes, parents)) if i not in refused]
            total = sum(size for _, size, _ in todo)
            if s.reserved_bytes + total > self.max_reserved:
                raise NoSpace(
                    f"this session would hold {s.reserved_bytes + total} bytes reserved, more than the "
                    f"{self.max_reserved} bytes one session may ([client] max_reserved); commit or abort first, "
                    "or put fewer at once"
                )
            return todo

        def reserve_all() -> Reserved:
            made: list[tuple[Reservation, int]] = []
            try:
                for name, size, parent in check():
                    r = self.store.reserve(name, size, parent=parent, ttl=_RESERVE_TTL)
                    off = r.location.offset
                    if copies is not None:  # the client writes a slot of its copy buffer; commit copies it in
                        slot = copies.take(size)
                        if slot is None:
                            self.store.abort(r)
                            raise NoSpace(
                                f"this session's copy buffer ({copies.size} bytes, {copies.used} held: "
                                "[client] copy_buffer) has no room for a put of "
                                f"{name!r} ({size} bytes); commit, abort or release views first, or put fewer at once"
                            )
                        off = slot
                    made.append((r, off))
            except BaseException:
                for r, off in made:
                    self.store.abort(r)
                    if copies is not None:
                        copies.give_back(off)
                raise
            now = self.store.ingest.clock()
            for r, off in made:  # held by the session from here: given back when it ends
                s.reservations[r.id] = r
                if copies is not None:
                    s.put_slots[r.id] = off
            return Reserved(
                slots=[Slot(id=r.id, offset=off, length=r.size, ttl=r.expires - now) for r, off in made],
                errors=_spread(refused, n, [None] * len(made), _wire) if refused else [],
            )

        if n > _ON_LOOP:
            return await self._in_worker(reserve_all)
        return await self.workers.client(reserve_all)

    async def op_commit(self, conn: Connection, req: Commit) -> Committed:
        """Seal each reservation named, on its own: an id the session does not hold, or one
        named a second time, fails alone (the others are committed); a reservation whose
        commit fails is given back. Nothing leaves the session before it was handled, so
        whatever an error leaves behind is given back when the session ends."""
        if len(req.checksums) != len(req.ids):
            raise ProtocolError("commit: ids and checksums must be lists of the same length")
        s = self._writer(conn)
        errors: list[WireError | None] = [None] * len(req.ids)
        published: list[str] = []

        def commit_all() -> None:
            seen: set[int] = set()
            for i, (rid, csum) in enumerate(zip(req.ids, req.checksums, strict=True)):
                r = s.reservations.get(rid)
                if rid in seen:
                    errors[i] = _wire(
                        ProtocolError(f"commit: reservation {rid} is named twice; the first is committed")
                    )
                    continue
                seen.add(rid)
                if r is None:
                    errors[i] = _wire(
                        LeaseEnded(f"reservation {rid} is not held by this session (committed, aborted or never made)")
                    )
                    continue
                done = False
                try:
                    if s.copies is not None:  # into the arena extent only the daemon reaches; then verified there
                        self._copy_in(s.copies, s.put_slots[r.id], r)
                    self.store.commit(r, csum)
                    done = True
                    published.append(r.name)
                except KvfsError as exc:
                    errors[i] = _wire(exc)
                finally:
                    if not done:
                        self.store.abort(r)  # a commit refused before it claimed the extent leaves it reserved
                    s.reservations.pop(r.id, None)
                    s.free_slots(reservations=[r.id])

        if len(req.ids) > _ON_LOOP:
            await self._in_worker(commit_all)
        else:
            await self.workers.client(commit_all)
        if self.mount is not None and published:
            await self.mount.published_outside(published)
        return Committed(errors=errors)

    async def op_abort(self, conn: Connection, req: Abort) -> Aborted:
        """Give back each reservation named that the session holds (once, however often it
        is named); ids it does not hold are skipped, as a release skips leases. ``count``:
        how many were given back."""
        s = self._writer(conn)
        todo = [s.reservations.pop(i) for i in dict.fromkeys(req.ids) if i in s.reservations]
        s.free_slots(reservations=[r.id for r in todo])
        n = await self.workers.client(lambda: sum(self.store.abort(r) for r in todo))
        return Aborted(count=n)
