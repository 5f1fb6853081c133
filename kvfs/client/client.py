"""The batch client: many blocks per round trip, bytes through shared memory.

:class:`Client` talks to a mount's daemon over its Unix socket (found from the
mountpoint, or given) with the typed protocol (:mod:`kvfs.protocol`). Only descriptors
cross the socket; the bytes move through the DRAM tier's shared-memory arena, which the
client maps (read-only unless it opened a write session), or straight from a disk tier's
block file, which the client reads itself and verifies against the block's checksum.

- :meth:`Client.lookup`: presence, size, tiers and pin state of many names, and how many
  leading names of a chain are all cached, in one round trip.
- :meth:`Client.get_into`: the blocks' bytes into the caller's buffers (bytes-likes,
  numpy arrays, CPU torch tensors; a list of buffers per block scatters it), under
  leases released at the end. :meth:`Client.get`: zero-copy read-only :class:`View` s of
  the arena, leased until released (or the client closes).
- :meth:`Client.put`: the bytes copied straight into reserved arena extents, then
  committed (the daemon verifies the checksum first); :meth:`Client.reserve` and
  :meth:`Client.commit` let a producer write a block in place.
- :meth:`Client.prefetch`, :meth:`Client.pin`, :meth:`Client.unpin`, :meth:`Client.evict`,
  :meth:`Client.stat`, :meth:`Client.events`.

Never wrong bytes: a block read from a file is checked against its checksum before it is
reported read; a copy that fails is reported to the daemon (which re-checks it and drops
it if bad) and read once more from wherever the block is now, else the name fails. A
batch in which some names failed raises :class:`BatchError` after doing the rest; its
``results`` say, per name, what happened. Thread-safe: calls from several threads share
the connection one round trip at a time; copies run outside that.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any, NamedTuple, Self, TypeVar

from kvfs.catalog import BlockStat
from kvfs.errors import BlockCorrupt, KvfsError
from kvfs.protocol import (
    MAX_ITEMS,
    Abort,
    Advise,
    Advised,
    CheckedOut,
    Checkout,
    Commit,
    Evict,
    EvictResult,
    Grant,
    Hello,
    LeaseEnded,
    Lookup,
    Message,
    Pin,
    PinResult,
    Prefetch,
    PrefetchResult,
    Promote,
    ProtocolError,
    Release,
    Renew,
    Request,
    Reserve,
    Stat,
    Suspect,
    Welcome,
    WireError,
    rebuild,
)
from kvfs.runtime import control_socket_path, find_mount

from . import buffers
from .connection import Connection
from .releases import DeferredReleases
from .results import BatchError, BufferTooSmall, EventStream, Hold, LookupResult, PutBuffer, Read, View

__all__ = ["Client"]

R = TypeVar("R", bound=Message)

_FILE_GRANT = "file"
_ARENA_GRANT = "arena"
_COMMIT_GROUP = 8 << 20  # bytes committed per request while a put's next blocks are copied
_RELEASE_DELAY = 0.02  # seconds a read's finished leases wait for the next request to carry them


class _Leased(NamedTuple):
    """A read's lease: :class:`~kvfs.protocol.Grant`'s fields in a tuple (a batch of 35
    costs a quarter of what 35 frozen dataclasses do, which is 10% of the read)."""

    id: int
    tier: str
    kind: str
    path: str
    offset: int
    length: int
    checksum: int
    ttl: float


def _socket_for(where: str | os.PathLike[str]) -> tuple[Path, str]:
    """The daemon's socket for *where* (a socket, a mountpoint or a path inside a mount)
    and the mountpoint to name in messages."""
    p = Path(where)
    try:
        if stat.S_ISSOCK(os.stat(p).st_mode):
            return p, str(p)
    except PermissionError:
        return p, str(p)  # behind a directory closed to us: connecting says so
    except OSError:
        pass
    found = find_mount(p)
    if found is None:
        raise KvfsError(f"{where} is neither a kvfs mount (nor inside one) nor a kvfs socket")
    return control_socket_path(found[0]), found[0]


class Client:
    """A session with the daemon of the mount at (or containing) *where*, or with the
    socket *where*. *write* asks for a read-write arena (puts); *name* labels the session
    in the daemon's log. *lease_ttl* (seconds): leases' lifetime (default: the daemon's);
    *promote*: how reads treat blocks whose hottest copy is on disk
    (:class:`~kvfs.protocol.Promote`: ``"policy"``, ``"always"``, ``"never"``).
    *populate*: map the arena's memory into this process now (one pass of page-table setup
    at connect, instead of a fault on every page of every block's first copy; only the
    part the daemon has reserved so far, never its holes).
    *io_threads*: blocks copied at once by one call. *copy*: read and put through a
    private copy buffer instead of mapping the arena (what a peer that a namespace's
    access rule keeps off the arena always gets; docs/client.md, "Security")."""

    def __init__(
        self,
        where: str | os.PathLike[str],
        *,
        write: bool = False,
        name: str = "",
        timeout: float = 60.0,
        lease_ttl: float | None = None,
        promote: str = Promote.POLICY,
        populate: bool = True,
        io_threads: int = 4,
        copy: bool = False,
    ) -> None:
        if promote not in Promote.ALL:
            raise ValueError(f"promote must be one of {', '.join(Promote.ALL)} (got {promote!r})")
        sock, mountpoint = _socket_for(where)
        self.socket = sock
        self.promote = promote
        self._lock = threading.Lock()
        self._conn = Connection(sock, where=mountpoint, timeout=timeout, reconnect=False)
        self._held: dict[int, Hold] = {}
        self._done = DeferredReleases(self._send_release, delay=_RELEASE_DELAY)
        if io_threads < 1:
            raise ValueError("io_threads must be at least 1")
        self.io_threads = io_threads
        self._io: ThreadPoolExecutor | None = None
        self._map: mmap.mmap | None = None
        self._arena: memoryview | None = None
        self._arena_at = 0  # the arena's address here (copies pick their loop by it)
        try:
            welcome = self._request(Hello(client=name or f"pid {os.getpid()}", write=write, copy=copy))
            fds = self._conn.take_fds()
            try:
                if welcome.copy_buffer or welcome.arena is not None:
                    if not fds:
                        raise KvfsError("the daemon did not pass the arena's (or copy buffer's) descriptor")
                    if welcome.copy_buffer:  # a namespace's rule keeps us off the arena: our own buffer instead
                        size, writable = welcome.copy_buffer, True
                    else:
                        assert welcome.arena is not None
                        size, writable = welcome.arena.size, write
                    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
                    self._map = mmap.mmap(fds[0], size, mmap.MAP_SHARED, prot)
                    self._arena = memoryview(self._map)
                    self._arena_at = buffers.address(self._arena)
                    if populate:
                        _populate(self._map, writable, _reserved(fds[0], size))
            finally:
                for fd in fds:
                    os.close(fd)
        except BaseException:
            self._conn.close()
            raise
        self.welcome: Welcome = welcome
        self.mountpoint = welcome.mountpoint
        self.tiers = [t.name for t in welcome.tiers]
        self.lease_ttl = lease_ttl or welcome.lease_ttl
        self.writable = write
        self.copying = welcome.copy_buffer > 0
        """Reads and puts go through this session's copy buffer (see :attr:`arena`)."""

    # -- plumbing ------------------------------------------------------------------------

    def _request(self, req: Request, reply: type[R] | None = None) -> Any:
        with self._lock:
            done = self._done.take()
            if done and self._conn.connected:  # the reads' leases end first, in the same wake-up
                self._conn.submit(Release(ids=done))
            return self._conn.request(req, reply)

    def _send_release(self, ids: list[int]) -> None:
        with self._lock:
            if self._conn.connected:
                self._conn.submit(Release(ids=ids))

    def close(self) -> None:
        """End the session: every lease and reservation is given back by the daemon, and
        every view ends. Idempotent."""
        for h in list(self._held.values()):
            h._end()
        self._held.clear()
        self._done.close()
        with self._lock:
            self._conn.close()
            io, self._io = self._io, None
        if io is not None:
            io.shutdown(wait=True)
        if self._arena is not None:
            self._arena.release()
            self._arena = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a caller still holds a slice: unmapped when it goes
                pass
            self._map = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def name_of(self, path: str | os.PathLike[str]) -> str:
        """The block name of *path*, a path inside this client's mount."""
        rel = os.path.relpath(os.path.realpath(path), self.mountpoint)
        if rel.startswith(".."):
            raise KvfsError(f"{path} is not inside {self.mountpoint}")
        return "" if rel == "." else rel

    @property
    def arena(self) -> memoryview | None:
        """This process's mapping of the whole arena file (read-only unless the session
        writes), e.g. to register it with CUDA once (``cudaHostRegister``) so that copies
        from leased extents are DMA; offsets in holds and views index it. None without a
        DRAM tier. When :attr:`copying` (a namespace's access rule keeps this peer from
        mapping the arena), the session's own copy buffer instead, which holds the
        verified copies the daemon made for its holds and views, and its puts."""
        return self._arena

    def _arena_view(self) -> memoryview:
        if self._arena is None:
            raise KvfsError(f"{self.mountpoint} has no DRAM arena (no dram tier) to read or write")
        return self._arena

    # -- lookups -------------------------------------------------------------------------

    def lookup(self, names: Sequence[str]) -> LookupResult:
        """Presence of every name and the cached prefix length, in one round trip (one per
        :data:`~kvfs.protocol.MAX_ITEMS` names: a request carries at most that many)."""
        names = list(names)
        sizes: list[int] = []
        masks: list[int] = []
        pinned: list[bool] = []
        errors: list[WireError | None] = []
        prefix = None
        for at in range(0, max(len(names), 1), MAX_ITEMS):
            r = self._request(Lookup(names=names[at : at + MAX_ITEMS]))
            if prefix is None and r.prefix < len(r.sizes):
                prefix = at + r.prefix
            sizes += r.sizes
            masks += r.tiers
            pinned += r.pinned
            errors += r.errors or [None] * len(r.sizes)
        found = LookupResult(names, sizes, masks, pinned, self.tiers, len(names) if prefix is None else prefix)
        if any(e is not None for e in errors):  # refused names (another namespace's rule)
            raise BatchError("lookup", [found[i] if e is None else _from_wire(e) for i, e in enumerate(errors)])
        return found

    def stat(self, name: str) -> BlockStat:
        """One block's record (size, checksum, tiers, pin, hits, times)."""
        res: BlockStat = self._request(Stat(name=name)).block
        return res

    # -- reads ---------------------------------------------------------------------------

    def _checkout(
        self, names: list[str], promote: str, ttl: float | None = None
    ) -> list[tuple[_Leased | None, KvfsError | None, float]]:
        """One round trip (a :class:`Checkout`, answered in columns): per name its grant or
        error, and the lease's deadline (``time.monotonic()``, counted from the send)."""
        sent = time.monotonic()
        with self._lock:  # the previous reads' leases end in the same request
            req = Checkout(names=names, ttl=ttl or self.lease_ttl, promote=promote, release=self._done.take())
            r: CheckedOut = self._conn.request(req)
        expires = sent + r.ttl
        columns = (r.ids, r.tiers, r.kinds, r.paths, r.offsets, r.lengths, r.checksums, r.errors or names)
        if any(len(c) != len(names) for c in columns):
            raise ProtocolError(f"the daemon answered a checkout of {len(names)} names with columns of other lengths")
        tiers = map(self.tiers.__getitem__, r.tiers)
        cols = zip(r.ids, tiers, r.kinds, r.paths, r.offsets, r.lengths, r.checksums, repeat(r.ttl))
        if not r.errors:
            return [(g, None, expires) for g in map(_Leased._make, cols)]
        out: list[tuple[_Leased | None, KvfsError | None, float]] = []
        for g, e in zip(map(_Leased._make, cols), r.errors, strict=True):
            out.append((None, rebuild(e.type, e.message), sent) if e is not None else (g, None, expires))
        return out

    def _lease(
        self, names: list[str], promote: str, ttl: float | None = None
    ) -> list[tuple[Grant | None, KvfsError | None, float]]:
        """:meth:`_checkout` with :class:`~kvfs.protocol.Grant` s (for holds and views)."""
        return [
            (None if g is None else Grant(**g._asdict()), e, expires)
            for g, e, expires in self._checkout(names, promote, ttl)
        ]

    def _release_ids(self, ids: list[int]) -> None:
        """End leases without waiting for the answer (it is read before the next one)."""
        if ids and self._conn.connected:
            with self._lock:
                for at in range(0, len(ids), MAX_ITEMS):
                    self._conn.submit(Release(ids=ids[at : at + MAX_ITEMS]))

    def get_into(
        self, names: Sequence[str], buffers_: Sequence[Any], *, verify: bool = False, promote: str | None = None
    ) -> list[int]:
        """Copy each block into its buffer (or list of buffers, filled in order); returns
        each block's size. Copies from a disk tier are always verified against the
        block's checksum; *verify* checks DRAM copies too. Raises :class:`BatchError` when
        some names failed (their buffers hold nothing to use)."""
        try:
            return [r.size for r in self.read_into(names, buffers_, verify=verify, promote=promote)]
        except BatchError as exc:
            raise BatchError("get_into", [r.size if isinstance(r, Read) else r for r in exc.results]) from None

    def read_into(
        self,
        names: Sequence[str],
        buffers_: Sequence[Any],
        *,
        verify: bool = False,
        promote: str | None = None,
        then: Callable[[int, Read], object] | None = None,
    ) -> list[Read]:
        """:meth:`get_into`, saying per block where its bytes came from and whether they
        were checked against its checksum (:class:`Read`). *then(position, read)* is
        called for each block as soon as it is in its buffer, in the thread that copied
        it (to check or use it while the next blocks are copied)."""
        names = list(names)
        if len(buffers_) != len(names):
            raise ValueError(f"{len(names)} names but {len(buffers_)} buffers")
        dests = [buffers.segments(b, writable=True) for b in buffers_]
        results: list[Any] = self._read(names, dests, verify, promote or self.promote, then)
        retry = [i for i, r in enumerate(results) if isinstance(r, _Retry)]
        if retry:  # a bad copy was reported and dropped: read the block from where it is now
            again = self._read(
                [names[i] for i in retry], [dests[i] for i in retry], verify, promote or self.promote, then, retry
            )
            for i, r in zip(retry, again, strict=True):
                results[i] = r.error if isinstance(r, _Retry) else r
        if any(isinstance(r, KvfsError) for r in results):
            raise BatchError("read_into", results)
        return results

    def _read(
        self,
        names: list[str],
        dests: list[buffers.Segments],
        verify: bool,
        promote: str,
        then: Callable[[int, Read], object] | None = None,
        positions: Sequence[int] | None = None,
    ) -> list[Any]:
        """Lease, copy and release one batch; per name a :class:`Read`, an error, or a
        :class:`_Retry` (the copy failed its check and was reported). Through a copy
        buffer, in as many batches as it holds (by the buffers' room)."""
        cap = self.welcome.copy_buffer
        where = list(positions) if positions is not None else list(range(len(names)))
        if cap and len(names) > 1 and sum(buffers.total(d) for d in dests) > cap:
            out: list[Any] = []
            i = 0
            while i < len(names):
                j, room = i, 0
                while j < len(names) and (j == i or room + buffers.total(dests[j]) <= cap):
                    room += buffers.total(dests[j])
                    j += 1
                out += self._read_batch(names[i:j], dests[i:j], verify, promote, then, where[i:j])
                i = j
            return out
        return self._read_batch(names, dests, verify, promote, then, where)

    def _read_batch(
        self,
        names: list[str],
        dests: list[buffers.Segments],
        verify: bool,
        promote: str,
        then: Callable[[int, Read], object] | None,
        where: Sequence[int],
    ) -> list[Any]:
        leased = self._checkout(names, promote)
        out: list[Any] = [err for _, err, _ in leased]
        todo = [i for i, (g, _, _) in enumerate(leased) if g is not None]
        reported: set[int] = set()  # leases a Suspect ended

        def copy(i: int, nowait: bool = False) -> Any:
            grant, _, expires = leased[i]
            assert grant is not None
            res = self._copy(names[i], grant, dests[i], verify, expires, nowait=nowait)
            if then is not None and isinstance(res, Read):
                then(where[i], res)
            return res

        try:
            # Arena copies and block files in the page cache are made here, at memory
            # speed; files that would wait for the device go to io_threads threads, which
            # a device serves better than one reader (and *then* runs beside them).
            later = []
            arena, base = self._arena, self._arena_at
            for i in todo:
                grant, _, expires = leased[i]
                assert grant is not None
                segs = dests[i]
                n = grant.length
                if (  # the common case inline: one buffer for a DRAM block, unchecked
                    grant.kind == _ARENA_GRANT
                    and arena is not None
                    and not verify
                    and len(segs) == 1
                    and len(segs[0]) >= n
                    and time.monotonic() < expires
                ):
                    dst, off = segs[0], grant.offset
                    buffers.copy(dst if len(dst) == n else dst[:n], arena[off : off + n], base + off)
                    out[i] = res = Read(n, grant.tier, _ARENA_GRANT, False)
                    if then is not None:
                        then(where[i], res)
                    continue
                out[i] = copy(i, nowait=True)
                if out[i] is _LATER:
                    later.append(i)
            pool = self._pool() if len(later) > 1 and self.io_threads > 1 else None
            for i, res in zip(later, pool.map(copy, later) if pool is not None else map(copy, later), strict=True):
                out[i] = res
            for i, (g, _, _) in enumerate(leased):
                if g is not None and isinstance(out[i], _Retry):
                    self._suspect(g, out[i].error)
                    reported.add(g.id)
        finally:
            self._done.add([g.id for g, _, _ in leased if g is not None and g.id not in reported])
        return out

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._io is None:
                self._io = ThreadPoolExecutor(self.io_threads, thread_name_prefix="kvfs-client-read")
            return self._io

    def _copy(
        self,
        name: str,
        grant: Grant | _Leased,
        segs: buffers.Segments,
        verify: bool,
        expires: float,
        *,
        nowait: bool = False,
    ) -> Any:
        """Copy one leased block into *segs*: a :class:`Read`, an error, a :class:`_Retry`
        (it failed its check), or, with *nowait*, ``_LATER`` for a block file that is not
        in the page cache."""
        n = grant.length
        room = buffers.total(segs)
        if room < n:
            return BufferTooSmall(f"the buffer of {room} bytes is too small for {name!r} ({n} bytes)")
        if grant.kind == _FILE_GRANT:
            try:
                got = buffers.read_file(grant.path, grant.offset, n, segs, nowait=nowait)
            except BlockingIOError:
                return _LATER
            except PermissionError:
                return _Retry(KvfsError(f"{name!r}: cannot read its block file {grant.path} (permission denied)"))
            except OSError as exc:
                return _Retry(BlockCorrupt(f"{name!r}: reading its block file failed: {exc}"))
            if got != n:
                return _Retry(BlockCorrupt(f"{name!r}: short read of its block file ({got} of {n} bytes)"))
            if buffers.checksum(segs, n) != grant.checksum:
                return _Retry(BlockCorrupt(f"{name!r}: its block file does not match the block's checksum"))
            return Read(n, grant.tier, grant.kind, True)
        arena = self._arena_view()
        if time.monotonic() >= expires:
            return LeaseEnded(f"the lease on {name!r} ended before it was read")
        src = arena[grant.offset : grant.offset + n]
        buffers.scatter(src, segs, self._arena_at + grant.offset)
        if verify and buffers.checksum(segs, n) != grant.checksum:
            return _Retry(BlockCorrupt(f"{name!r}: its DRAM copy does not match the block's checksum"))
        return Read(n, grant.tier, grant.kind, verify)

    def _suspect(self, grant: Grant | _Leased, error: KvfsError) -> None:
        """Tell the daemon a leased copy failed its check; the lease ends, and the daemon
        re-checks the copy and drops it if bad."""
        try:
            self._request(Suspect(lease=grant.id, why=str(error)))
        except KvfsError:
            pass  # the lease ended meanwhile: the retry takes whatever copy is there now

    def get(self, names: Sequence[str], *, ttl: float | None = None) -> list[View]:
        """Zero-copy read-only views of the blocks in the arena, each leased until
        released. Blocks on disk are copied into DRAM first; on a mount without a DRAM
        tier the view holds a verified private copy. Raises :class:`BatchError` when some
        names failed (the views made are in its ``results``: release them)."""
        names = list(names)
        leased = self._lease(names, Promote.ALWAYS, ttl)
        out: list[Any] = []
        files: list[int] = []
        for name, (grant, err, expires) in zip(names, leased, strict=True):
            if grant is None:
                out.append(err)
                continue
            if grant.kind == _FILE_GRANT:  # no DRAM tier: a private, verified copy
                buf = bytearray(grant.length)
                res = self._copy(name, grant, [memoryview(buf)], True, expires)
                if isinstance(res, _Retry):
                    self._suspect(grant, res.error)
                    out.append(res.error)
                    continue
                files.append(grant.id)
                out.append(
                    View(None, name, memoryview(buf).toreadonly(), None, float("inf")) if isinstance(res, Read) else res
                )
                continue
            data = self._arena_view()[grant.offset : grant.offset + grant.length].toreadonly()
            v = View(self, name, data, grant, expires)
            self._held[grant.id] = v
            out.append(v)
        self._release_ids(files)
        if any(isinstance(r, KvfsError) for r in out):
            raise BatchError("get", out)
        return out

    def lease(self, names: Sequence[str], *, promote: str | None = None, ttl: float | None = None) -> list[Hold]:
        """Hold one local copy of each block for a reader of your own (a GPU agent's
        DMA, GDS reads of the file): see :class:`Hold`. *promote* as for the client.
        Raises :class:`BatchError` when some names failed (release the holds in its
        ``results``)."""
        out: list[Any] = []
        for name, (grant, err, expires) in zip(
            names, self._lease(list(names), promote or self.promote, ttl), strict=True
        ):
            if grant is None:
                out.append(err)
                continue
            h = Hold(self, name, grant, expires)
            self._held[grant.id] = h
            out.append(h)
        if any(isinstance(r, KvfsError) for r in out):
            raise BatchError("lease", out)
        return out

    def release(self, holds: Sequence[Hold]) -> None:
        """End the leases of *holds* (views, holds) in one round trip."""
        ids = []
        for h in holds:
            h._end()
            if h.lease is not None and self._held.pop(h.lease, None) is not None:
                ids.append(h.lease)
        self._release_ids(ids)

    def suspect(self, hold: Hold, why: str) -> None:
        """Report that the copy *hold* leases failed the caller's own check (a GPU agent
        verifying what it read into device memory): the lease ends, and the daemon
        re-checks that copy and drops it if bad; a new :meth:`lease` then holds whatever
        copy is there now, or fails with ``BlockNotFound``."""
        lease = hold.lease
        hold._end()
        if lease is None or self._held.pop(lease, None) is None:
            return
        try:
            self._request(Suspect(lease=lease, why=why))
        except KvfsError:
            pass  # the lease ended meanwhile: the next lease takes whatever copy is there now

    def renew(self, holds: Sequence[Hold], ttl: float | None = None) -> None:
        """Extend the leases of *holds* to *ttl* seconds from now (default: the client's);
        one that had already ended is ended here too."""
        live = [h for h in holds if h.lease is not None and not h.released]
        if not live:
            return
        sent = time.monotonic()
        ids = [h.lease for h in live if h.lease is not None]
        ttls: list[float | None] = []
        for at in range(0, len(ids), MAX_ITEMS):
            ttls += self._request(Renew(ids=ids[at : at + MAX_ITEMS], ttl=ttl or self.lease_ttl)).ttls
        for h, left in zip(live, ttls, strict=True):
            if left is None:
                h._end()
                self._held.pop(h.lease, None)  # type: ignore[arg-type]
            else:
                h.expires = sent + left

    # -- puts ----------------------------------------------------------------------------

    def reserve(
        self, names: Sequence[str], sizes: Sequence[int], parents: Sequence[str | None] | None = None
    ) -> list[PutBuffer]:
        """Reserve an arena extent per block (all or none) to write in place; fill each
        :attr:`PutBuffer.data`, then :meth:`commit` (or :meth:`abort`) them. Names a
        namespace's rule refuses raise :class:`BatchError` (abort the buffers in its
        ``results``)."""
        out = self._reserve(names, sizes, parents)
        if any(isinstance(p, KvfsError) for p in out):
            raise BatchError("reserve", out)
        return out  # type: ignore[return-value]

    def _reserve(
        self, names: Sequence[str], sizes: Sequence[int], parents: Sequence[str | None] | None = None
    ) -> list[PutBuffer | KvfsError]:
        if not self.writable:
            raise KvfsError("this client is read-only: open it with Client(..., write=True) to put")
        arena = self._arena_view()
        sent = time.monotonic()
        r = self._request(Reserve(names=list(names), sizes=list(sizes), parents=list(parents or [])))
        slots = iter(r.slots)
        out: list[PutBuffer | KvfsError] = []
        for i, n in enumerate(names):
            e = r.errors[i] if r.errors else None
            if e is not None:
                out.append(_from_wire(e))
                continue
            s = next(slots)
            out.append(PutBuffer(n, s, arena[s.offset : s.offset + s.length], sent + s.ttl))
        return out

    def commit(self, puts: Sequence[PutBuffer]) -> list[KvfsError | None]:
        """Seal the reserved blocks (the daemon checks each checksum first); per block None
        or why it was not sealed (a mismatch aborts it). The buffers end here."""
        sums = [buffers.checksum([p.data]) for p in puts]
        r = self._request(Commit(ids=[p.slot.id for p in puts], checksums=sums))
        for p in puts:
            p.data = memoryview(b"")
        return [None if e is None else _from_wire(e) for e in r.errors]

    def abort(self, puts: Sequence[PutBuffer]) -> None:
        """Give reserved extents back unpublished."""
        for p in puts:
            p.data = memoryview(b"")
        self._request(Abort(ids=[p.slot.id for p in puts]))

    def put(
        self, names: Sequence[str], buffers_: Sequence[Any], *, parents: Sequence[str | None] | None = None
    ) -> None:
        """Seal each buffer (or list of buffers, concatenated) as block *name*, replacing
        an existing one; *parents*: each block's parent in its prefix chain (prefix-aware
        eviction). Bytes go straight into reserved arena extents, in as many round trips
        as the daemon's reservation cap needs. Raises :class:`BatchError` when some failed."""
        names = list(names)
        if len(buffers_) != len(names):
            raise ValueError(f"{len(names)} names but {len(buffers_)} buffers")
        srcs = [buffers.segments(b, writable=False) for b in buffers_]
        sizes = [buffers.total(s) for s in srcs]
        par = list(parents) if parents is not None else [None] * len(names)
        cap = max(self.welcome.max_reserved, 1)
        results: list[KvfsError | None] = []
        i = 0
        while i < len(names):
            j, room = i, 0
            while j < len(names) and (j == i or room + sizes[j] <= cap):
                room += sizes[j]
                j += 1
            made = self._reserve(names[i:j], sizes[i:j], par[i:j])
            ok = [k for k, p in enumerate(made) if isinstance(p, PutBuffer)]
            done = iter(self._fill_and_commit([made[k] for k in ok], [srcs[i + k] for k in ok]))  # type: ignore[misc]
            results += [next(done) if isinstance(p, PutBuffer) else p for p in made]
            i = j
        if any(r is not None for r in results):
            raise BatchError("put", list(results))

    def _fill_and_commit(self, puts: list[PutBuffer], srcs: list[buffers.Segments]) -> list[KvfsError | None]:
        """Copy each block into its extent, hashing as it goes, and commit them in groups
        of about :data:`_COMMIT_GROUP` bytes sent without waiting, so the daemon checks
        one group while the next is copied."""
        out: list[KvfsError | None] = []
        with self._lock:
            # another thread's release may have been submitted since our reserve: read its
            # reply first, or this put would take it for the reply to its first commit
            self._conn.settle()
            sent = done = 0
            group: list[PutBuffer] = []
            sums: list[int] = []
            try:
                for k, (p, segs) in enumerate(zip(puts, srcs, strict=True)):
                    sums.append(buffers.copy_hashed(p.data, segs))
                    group.append(p)
                    if sum(len(g.data) for g in group) >= _COMMIT_GROUP or k == len(puts) - 1:
                        self._conn.submit(Commit(ids=[g.slot.id for g in group], checksums=sums))
                        sent += len(group)
                        for g in group:
                            g.data = memoryview(b"")
                        group, sums = [], []
            except BaseException:
                if self._conn.connected:
                    self._conn.submit(Abort(ids=[p.slot.id for p in puts[sent:]]))
                raise
            while done < sent:
                r = self._conn.result()
                out += [None if e is None else _from_wire(e) for e in r.errors]
                done = len(out)
        return out

    # -- operator commands the client shares ---------------------------------------------

    def prefetch(self, names: Sequence[str], tier: str | None = None) -> PrefetchResult:
        """Copy blocks into *tier* (the hottest by default) now."""
        res: PrefetchResult = self._request(Prefetch(paths=list(names), tier=tier))
        return res

    def hint(self, names: Sequence[str], when: str) -> int:
        """Advise the eviction policies about a chain (*names*, root first): ``"soon"``,
        queued requests will read it (it is kept ahead of other blocks for the policy's
        ``hint_ttl``); ``"ended"``, its session is over (its own blocks go first, blocks it
        shares with live sessions stay). Never moves or removes a block by itself.
        Returns how many of the names the mount holds. Needs a write session's rights
        (the owner, or ``[client] group_writes``)."""
        res: Advised = self._request(Advise(names=list(names), when=when))
        return res.known

    def pin(self, names: Sequence[str]) -> PinResult:
        """Keep blocks where they are: never evicted (by policy, or by :meth:`evict`
        without ``force``) until unpinned."""
        res: PinResult = self._request(Pin(paths=list(names), pinned=True))
        return res

    def unpin(self, names: Sequence[str]) -> PinResult:
        res: PinResult = self._request(Pin(paths=list(names), pinned=False))
        return res

    def evict(self, names: Sequence[str], tier: str | None = None, *, force: bool = False) -> EvictResult:
        """Drop local copies. A pinned block is refused (a ``failed`` entry of type
        ``"Pinned"``) and a last copy is written down first, or kept (``"LastCopy"``),
        unless *force*."""
        res: EvictResult = self._request(Evict(paths=list(names), tier=tier, force=force))
        return res

    def events(self) -> EventStream:
        """Every block event from the moment this returns (stored, promoted, demoted,
        evicted, removed, corrupt, renamed), on a connection of its own: iterate it; close
        it (or use ``with``) to stop. The subscription is made before it returns, so no
        event of a call made after it is missed."""
        return EventStream(Connection(self.socket, where=self.mountpoint))


def _reserved(fd: int, size: int) -> int:
    """Bytes at the start of the arena file that hold memory: the daemon reserves its arena
    as it uses it (tiers/dram.py, "Reservation"), so the rest is a hole. Populating a hole
    would allocate it; this process never reads there before the daemon reserves it."""
    try:
        return min(size, os.lseek(fd, 0, os.SEEK_HOLE))
    except OSError:  # a filesystem without SEEK_HOLE: all of it is data
        return size


def _populate(mm: mmap.mmap, write: bool, length: int) -> None:
    """Fill the page tables of the first *length* bytes of the arena mapping (Linux 5.14+;
    elsewhere, and past *length*, pages fault in as they are first touched)."""
    advice = getattr(mmap, "MADV_POPULATE_WRITE" if write else "MADV_POPULATE_READ", 23 if write else 22)
    length -= length % mmap.PAGESIZE
    if length <= 0:
        return
    try:
        mm.madvise(advice, 0, length)
    except OSError:
        pass


_LATER = object()  # a block file to read where waiting for the device is cheap


class _Retry:
    """A copy that failed its check: reported to the daemon, then read once more."""

    __slots__ = ("error",)

    def __init__(self, error: KvfsError) -> None:
        self.error = error


def _from_wire(e: WireError) -> KvfsError:
    return rebuild(e.type, e.message)
