"""The tier interface: the one small contract every storage tier implements.

A tier stores whole blocks by name. It knows nothing of policies, other tiers or the
catalog; the store decides what goes where. Each tier is one module in ``kvfs.tiers``
and passes the shared conformance suite (``tests/tiers/test_tier_conformance.py``).

Required: :meth:`put`, :meth:`open`, :meth:`delete`, :meth:`stat`, :meth:`scan`,
:meth:`footprint`. :meth:`read_into` and :meth:`rename` have defaults built on them.
Vendor errors are translated here: a missing copy is :class:`BlockNotFound`, a bad copy
:class:`BlockCorrupt`, a failed or hung backend :class:`TierUnavailable`, no room right
now :class:`TierFull`.

Deadlines: a shared tier (``shared = True``) bounds every call by its config's
``timeout``: a call returns or raises :class:`TierUnavailable` within it however the
backend behaves (a stalled NFS server, an endpoint that accepts and never answers), and a
call that outlives its caller never touches the caller's buffers afterwards. The store
relies on this: it never waits on a shared tier for local work, and when a local miss
must ask one, the wait is this deadline.
"""

from __future__ import annotations

import abc
import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from .config import TierConfig, TierKind
from .errors import DescriptorsExhausted, TierUnavailable
from .names import TierName

__all__ = ["BackingFile", "BlockInfo", "BlockRef", "HeldChange", "Location", "StoredObject", "Tier", "os_error"]

_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def os_error(what: str, exc: OSError) -> TierUnavailable:
    """The error a tier raises for *exc* from its backend (*what*: the tier and the call):
    :class:`~kvfs.errors.DescriptorsExhausted` when the process is out of descriptors
    (the daemon's limit, never the tier's fault), else :class:`TierUnavailable`."""
    if exc.errno in _NO_DESCRIPTORS:
        return DescriptorsExhausted(
            f"{what} failed: the daemon is out of file descriptors ({exc.strerror}); its connections are capped "
            "to keep a reserve for the tiers: raise the daemon's RLIMIT_NOFILE (ulimit -n) or close clients"
        )
    return TierUnavailable(f"{what} failed: {exc}")


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """What a tier knows of one stored block. ``problem`` is set (and the other fields
    are what could be read) for a file :meth:`Tier.scan` found corrupt."""

    name: str
    size: int
    checksum: int
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One thing a shared tier holds, as ``kvfs gc`` and the retention sweep see it.

    A block (``name`` its block name) or, with ``leftover``, what a write that never
    finished left behind (a temporary file, an unfinished multipart upload; ``name`` says
    where, relative to the tier). ``mtime``: when it was written (seconds since the
    epoch, the storage's clock); ``size``: bytes stored; ``token``: what removing a
    leftover needs besides its name (an S3 upload id)."""

    name: str
    mtime: float
    size: int
    leftover: bool = False
    token: str = ""


@dataclass(frozen=True, slots=True)
class HeldChange:
    """A change in the room a tier keeps for readers of copies it no longer holds under a
    name (a replaced, renamed-over, deleted or evicted copy whose memory a
    :class:`BlockRef` still holds): *size* > 0 (its footprint) when such a copy is dropped
    while held, under *name*, the name it had; the same *token* with *size* < 0 when its
    last reader lets go and the room is free again."""

    token: int
    name: str
    size: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Location:
    """Where a copy's payload lies for a reader outside the daemon: *length* bytes at
    *offset* in the file *path* (the DRAM arena, a disk block file)."""

    path: str
    offset: int
    length: int


class BlockRef:
    """A readable view of one block's bytes, valid until :meth:`release`.

    ``data`` is a read-only memoryview of exactly the payload. For the DRAM tier it points
    into the shared arena and holding the ref keeps that memory from being reused, so a
    reader keeps its bytes even if the block is replaced or evicted meanwhile. Use as a
    context manager or call :meth:`release` exactly once.
    """

    __slots__ = ("_release", "checksum", "data")

    def __init__(self, data: memoryview, checksum: int, release: Callable[[], None] | None = None) -> None:
        self.data = data
        self.checksum = checksum
        self._release = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __len__(self) -> int:
        return len(self.data)


class BackingFile:
    """An open file whose bytes from offset 0 are exactly one block's payload (*size*
    bytes, *checksum*), checked against it: what a reader outside the daemon reads by
    itself (the kernel, through FUSE passthrough). The descriptor is the caller's to
    :meth:`close` (it is closed on exec)."""

    __slots__ = ("checksum", "fd", "identity", "size")

    def __init__(self, fd: int, size: int, checksum: int, identity: tuple[int, ...] = ()) -> None:
        self.fd = fd
        self.size = size
        self.checksum = checksum
        self.identity = identity
        """What the file was when it was checked (size, mtime_ns, ctime_ns: its ``fstat``);
        a holder that finds it changed must check it again before trusting it."""

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    release = close

    def __len__(self) -> int:
        return self.size

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Tier(abc.ABC):
    """One storage tier. Methods may be called from several threads at once."""

    kind: ClassVar[TierKind]
    persistent: ClassVar[bool] = True
    """Survives a restart; copies are checksum-verified when read."""
    shared: ClassVar[bool] = False
    """Other nodes see the same blocks (posix, s3)."""

    def __init__(self, config: TierConfig) -> None:
        self.config = config
        self.name: TierName = config.name
        self.capacity: int | None = config.capacity

    @abc.abstractmethod
    def footprint(self, name: str, size: int) -> int:
        """Bytes a block of *size* payload bytes takes in this tier (counted against capacity)."""

    @abc.abstractmethod
    def put(self, name: str, data: Any, checksum: int) -> None:
        """Store *data* under *name*, atomically replacing an existing copy.

        *data* is any buffer or a block's :class:`~kvfs.pieces.Pieces` (a seal's chunks,
        not joined): a tier reads it as ``Pieces.of(data)`` and copies it before returning.

        No reader ever sees a partial block under *name*: persistent tiers write a
        temporary name and rename it into place. Raises :class:`TierFull` when there is no
        room right now, :class:`TierUnavailable` when the backend fails.
        """

    @abc.abstractmethod
    def open(self, name: str) -> BlockRef:
        """A verified view of the block's payload. Raises :class:`BlockNotFound`,
        :class:`BlockCorrupt` (header or checksum wrong) or :class:`TierUnavailable`."""

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Remove the copy; a missing copy is not an error (another node may have won)."""

    @abc.abstractmethod
    def stat(self, name: str) -> BlockInfo | None:
        """The stored block's size and checksum from its header, or ``None`` if absent."""

    @abc.abstractmethod
    def scan(self, prefix: str = "") -> Iterator[BlockInfo]:
        """Every block stored under the directory *prefix* (``""``: all), for rebuilding the
        catalog. An unreadable or corrupt file (a bad header, a name that is not a valid
        kvfs name or not the file's own path) is yielded with ``problem`` saying why, never
        as a block, and never moved outside the tier."""

    def listdir(self, directory: str = "") -> dict[str, bool]:
        """``{basename: is_dir}`` of what this tier holds directly in *directory* (``""``:
        the top). Used to list shared tiers, so only names, not sizes.

        The default walks :meth:`scan`; shared tiers override it with one cheap listing
        (a ``scandir``, a delimited S3 listing). Raises :class:`TierUnavailable`.
        """
        base = f"{directory}/" if directory else ""
        out: dict[str, bool] = {}
        for info in self.scan(directory):
            if info.problem is not None:
                continue
            rest = info.name[len(base) :]
            head, sep, _ = rest.partition("/")
            out[head] = out.get(head, False) or bool(sep)
        return out

    def read_into(self, name: str, out: Any) -> tuple[int, int]:
        """Copy the verified payload into the writable buffer *out*; returns ``(length,
        checksum)``. Raises ``ValueError`` when *out* is too small, and the errors of
        :meth:`open`. File-backed tiers override it to read straight into *out*.
        """
        with self.open(name) as ref:
            n = len(ref.data)
            if len(out) < n:
                raise ValueError(f"buffer of {len(out)} bytes is too small for a block of {n}")
            memoryview(out).cast("B")[:n] = ref.data
            return n, ref.checksum

    def reserve_ahead(self, window: int) -> int:
        """Prepare the memory of the next puts, up to *window* bytes past what the tier
        holds, so they do not pay for it on their callers' path; returns the bytes newly
        prepared. Called from a background thread. The default does nothing (0); the DRAM
        tier reserves and faults in its arena ahead (:meth:`DramTier.reserve_ahead`)."""
        return 0

    def unreserved_ahead(self, window: int) -> int:
        """The bytes :meth:`reserve_ahead` of *window* would prepare now (memory only)."""
        return 0

    def rename(self, old: str, new: str) -> None:
        """Move the copy at *old* to *new*, replacing *new* atomically.

        The default copies and deletes; tiers with a cheaper way override it.
        """
        with self.open(old) as ref:
            self.put(new, ref.data, ref.checksum)
        self.delete(old)

    # -- lifetimes on shared tiers (kvfs gc, the retention sweep) ---------------------
    # Shared tiers implement these; the others hold only this node's copies, which the
    # store removes through delete().

    def inventory(self, prefix: str = "") -> Iterator[StoredObject]:
        """Everything stored under the directory *prefix* (``""``: all): blocks and
        leftovers of unfinished writes, with when each was written; produced as the
        listing goes (one deadline per directory or page). Raises :class:`TierUnavailable`."""
        raise NotImplementedError(f"{self.kind.value} tier {self.name!r} keeps no inventory (shared tiers do)")

    def expire(self, name: str, cutoff: float) -> bool:
        """Remove block *name* only if its stored copy was written before *cutoff*
        (seconds since the epoch); True if it was removed. A copy written since (another
        node published the block again) is kept, however the two calls interleave where
        the storage allows it (docs/tenants.md says where it does not)."""
        raise NotImplementedError(f"{self.kind.value} tier {self.name!r} has no expiry (shared tiers do)")

    def remove_leftover(self, obj: StoredObject, cutoff: float) -> bool:
        """Remove the leftover *obj* (from :meth:`inventory`) if it is still older than
        *cutoff*; True if it was removed."""
        raise NotImplementedError(f"{self.kind.value} tier {self.name!r} has no leftovers (shared tiers do)")

    def open_file(self, name: str) -> BackingFile | None:
        """The copy's file, open, when its bytes from offset 0 are exactly the payload
        and have been checked against the header's checksum (a file tier whose layout
        keeps the header beside the payload); None when this copy has no such file (a
        volatile or object tier, a header before the payload). Raises the errors of
        :meth:`open`."""
        return None

    def locate(self, name: str, size: int | None = None) -> Location | None:
        """Where the copy's payload lies for a reader in another process (zero-copy
        clients), or None when this tier has no such place (objects in S3). *size*, the
        block's payload length when the caller knows it, spares file tiers a header read."""
        return None

    def open_located(self, name: str, size: int | None = None) -> tuple[BlockRef, Location | None]:
        """:meth:`open` and :meth:`locate` of one copy together (a lease's hold on a
        volatile copy); a tier that can does both in one look (DRAM)."""
        ref = self.open(name)
        try:
            return ref, self.locate(name, size)
        except BaseException:
            ref.release()
            raise

    # Tiers whose replaced or dropped copies keep their room while a reader holds them
    # (DRAM: the extent is reused only after the last BlockRef is released) say so, and
    # report those copies for the store to count against the tier and the block's
    # namespace: the room is taken whoever holds it (docs/tenants.md, "Quotas").
    keeps_held: ClassVar[bool] = False

    def held_changes(self) -> list[HeldChange]:
        """The :class:`HeldChange` records since the last call, in order (the store drains
        them under its lock). Tiers that keep nothing for readers return none."""
        return []

    # Volatile shared-memory tiers (DRAM) also let a client write a block's bytes straight
    # into a reserved extent (kvfs.ingest): ``reservable`` is True and they implement
    # reserve / reserved_view / reserved_location / commit / abort, and share the file.
    reservable: ClassVar[bool] = False

    def reserve(self, size: int) -> int:
        """A free extent of *size* bytes no reader sees; returns its offset."""
        raise NotImplementedError(f"tier {self.name!r} does not take client-written extents")

    def reserved_view(self, offset: int, size: int) -> memoryview:
        raise NotImplementedError(f"tier {self.name!r} does not take client-written extents")

    def reserved_location(self, offset: int, size: int) -> Location:
        raise NotImplementedError(f"tier {self.name!r} does not take client-written extents")

    def commit(self, name: str, offset: int, size: int, checksum: int) -> None:
        """Publish the reserved extent at *offset* as block *name* (replacing atomically)."""
        raise NotImplementedError(f"tier {self.name!r} does not take client-written extents")

    def abort(self, offset: int, size: int) -> None:
        """Return a reserved extent that will not be published."""
        raise NotImplementedError(f"tier {self.name!r} does not take client-written extents")

    def share(self, writable: bool) -> int:
        """A new descriptor of the tier's memory file for a client to map: read-only
        unless *writable* (the caller passes it on and closes it)."""
        raise NotImplementedError(f"tier {self.name!r} has no memory file to share")

    def close(self) -> None:
        """Release resources; the tier is unusable afterwards."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
