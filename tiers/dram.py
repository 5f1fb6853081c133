"""The ``dram`` tier: one shared-memory arena of pinned host memory.

The arena is a file under ``/dev/shm`` mapped shared, reserved and mlocked (where the
memlock limit allows) as it is used. Blocks are extents of it, addressed by ``(offset,
length)`` so clients and the GPU agent can map the same file and read without a copy
(:meth:`DramTier.locate`).

A reader holds a :class:`~kvfs.tier.BlockRef` on an extent; replacing, renaming over or
deleting the block while it is held retires the extent, which is reused only after the
last ref is released. So a reader never sees another block's bytes. A retired extent that
is still held keeps its room: the tier reports it (:meth:`DramTier.held_changes`, a
:class:`~kvfs.tier.HeldChange` when it is retired and one when it is freed) and the store
counts it against the tier's capacity and the namespace of the name it had.

Ownership. The arena belongs to one daemon: it holds an exclusive ``flock`` on the file
while the tier is open, and a second daemon given the same ``path`` is refused, naming the
holder (:mod:`kvfs.ownership`). The file's first 4 KiB are a header marking it as a kvfs
arena; a configured ``path`` that names an existing file without it (or a symlink, or not
a regular file) is refused, never truncated.

Reservation. The file gets its whole size at start after checking the filesystem's free
space, so a ``/dev/shm`` too small for the arena is a clear error at mount. Its memory is
reserved (``posix_fallocate``), then locked (``mlock``) or populated, in steps of
:data:`STEP` as extents are first handed out, and ahead of them only by the window its
owner asks :meth:`DramTier.reserve_ahead` for from a background thread (the mount keeps 64
MiB reserved past the highest extent once something was written, so seals land in memory
already faulted in): an idle daemon holds what it has used and at most that window, and a
mount does not wait for gigabytes to be faulted in. No extent is ever
handed out (to the daemon's writes or a client's reservation) before it is reserved, so
writing the arena never SIGBUSes; if ``/dev/shm`` fills up meanwhile, the arena stops
growing and behaves as a smaller tier (puts there evict or fall to the next tier).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvfs.allocator import ExtentAllocator
from kvfs.config import DramConfig, TierKind
from kvfs.errors import BlockNotFound, TierFull, TierInUse, TierUnavailable
from kvfs.ownership import lock_exclusive, locked_by_someone
from kvfs.pieces import Pieces
from kvfs.tier import BlockInfo, BlockRef, HeldChange, Location, Tier
from kvfs.units import format_size

__all__ = ["DramTier"]

log = logging.getLogger("kvfs.tiers.dram")

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
HEADER = 4096  # the arena file's first page: the marker below, then nothing
STEP = 2 << 20  # the arena is reserved and locked this much at a time, as extents are handed out
_AHEAD_STEP = 4 * STEP  # reserve_ahead publishes what it reserved this often
_MAGIC = b"KVFSARENA\x01\n"


@dataclass(slots=True, eq=False)
class _Extent:
    offset: int
    length: int
    checksum: int
    refs: int = 0
    retired: bool = False
    token: int = 0
    """Set when it was retired while held (its :class:`HeldChange`'s token)."""
    location: Location | None = None
    """Where it lies in the arena file, made at its first lease and kept (a lease of a
    hot block then builds nothing for it)."""


class _Libc:
    """``mlock(2)`` and ``madvise(2)`` through ctypes (no binding in the standard library;
    ``mmap.madvise`` holds the GIL while the kernel faults pages in, ctypes lets it go)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("c")
        self._libc = ctypes.CDLL(name, use_errno=True) if name else None

    def mlock(self, addr: int, length: int) -> int:
        """0, or the errno of the failure."""
        if self._libc is None:  # pragma: no cover - every Linux has a libc
            return -1
        if self._libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(length)) == 0:
            return 0
        return ctypes.get_errno()

    def madvise(self, addr: int, length: int, advice: int) -> int:
        """0, or the errno of the failure."""
        if self._libc is None:  # pragma: no cover - every Linux has a libc
            return -1
        if self._libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(length), ctypes.c_int(advice)) == 0:
            return 0
        return ctypes.get_errno()


_SHM = "/dev/shm"
_ARENA_NAME = re.compile(r"^kvfs-(\d+)-[0-9a-f]{8}$")


def remove_stale_arenas(directory: str = _SHM) -> list[str]:
    """Delete private arenas (``kvfs-<pid>-<hex>``) left by daemons that died without
    closing (killed, crashed): their memory stays allocated in tmpfs until someone does.
    An arena whose pid is alive, or that some process still holds locked, is kept.
    Returns the paths removed."""
    removed: list[str] = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        m = _ARENA_NAME.match(entry)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # alive (or not ours to signal): leave it
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        path = os.path.join(directory, entry)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if locked_by_someone(fd):
                continue  # the pid was reused, but a daemon holds it: not stale
            os.unlink(path)
            removed.append(path)
            log.info("removed the DRAM arena %s left by a daemon that is gone", path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def _open_arena(path: Path, *, private: bool, what: str) -> int:
    """A descriptor of the arena file at *path*, locked by this process: created, or an
    arena kvfs made earlier that nobody holds. Raises :class:`TierInUse` otherwise."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
    except FileExistsError:
        if private:  # pragma: no cover - a random name taken: astronomically unlikely
            raise
        try:
            fd = os.open(path, flags)
        except OSError as exc:  # a symlink (ELOOP), a directory, a file we may not open
            raise TierInUse(
                f"{what}: {path} exists and is not a kvfs arena ({exc.strerror}); kvfs will not use it: "
                "remove it or set another tiers[0].path"
            ) from exc
        created = False
    except OSError as exc:
        raise TierUnavailable(f"{what}: cannot create the arena {path}: {exc.strerror}") from exc
    try:
        if not created:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or os.pread(fd, len(_MAGIC), 0) != _MAGIC:
                raise TierInUse(
                    f"{what}: {path} exists and is not a kvfs arena; kvfs will not overwrite it: "
                    "remove it or set another tiers[0].path"
                )
        lock_exclusive(fd, str(path), what)
        return fd
    except BaseException:
        os.close(fd)
        if created:
            os.unlink(path)
        raise


def _size_file(fd: int, path: Path, size: int, what: str) -> None:
    """Give the arena file its size, empty (sparse), after checking that the filesystem has
    room for all of it now: a ``/dev/shm`` too small is a clear error at mount. The memory
    itself is reserved as it is used (:meth:`DramTier._reserve_to`)."""
    os.ftruncate(fd, 0)  # a re-used arena's old bytes are nobody's now
    free = os.statvfs(path.parent)
    avail = free.f_bavail * free.f_frsize
    if avail < size:
        raise TierUnavailable(
            f"{what}: the arena needs {format_size(size)} but {path.parent} has only {format_size(avail)} free; "
            f"lower tiers[0].capacity or give {path.parent} more room"
        )
    os.ftruncate(fd, size)


class DramTier(Tier):
    kind = TierKind.DRAM
    persistent = False
    shared = False
    reservable = True
    keeps_held = True

    def __init__(self, config: DramConfig) -> None:
        super().__init__(config)
        assert config.capacity is not None
        what = f"dram tier {config.name!r}"
        private = config.path is None
        if private:
            remove_stale_arenas()
            self.path = Path(f"{_SHM}/kvfs-{os.getpid()}-{secrets.token_hex(4)}")
        else:
            self.path = Path(config.path)  # type: ignore[arg-type]
        self._path = str(self.path)
        size = HEADER + config.capacity - config.capacity % 4096
        self._fd = _open_arena(self.path, private=private, what=what)
        try:
            _size_file(self._fd, self.path, size, what)
            self._mm = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self._fd)
            os.unlink(self.path)
            raise
        self._what = what
        self._libc = _Libc()
        self._addr = ctypes.addressof(ctypes.c_char.from_buffer(self._mm))  # the mapping's start, for mlock
        self.locked = config.mlock  # until an mlock fails (the memlock limit): then pages may be swapped
        self._prefault = config.prefault
        self._reserved = 0  # bytes of the file, from its start, reserved and locked (or populated)
        self._stuck = False  # the last reservation failed (the filesystem is full): said once
        self._ahead_stuck = False  # reserve_ahead found the filesystem full: no window until a put grows it
        self._whole = memoryview(self._mm)
        self._view = self._whole[HEADER:]
        self._ro = self._view.toreadonly()
        self._alloc = ExtentAllocator(size - HEADER)
        self._index: dict[str, _Extent] = {}
        self._lock = threading.Lock()
        self._growing = threading.Lock()  # one reserve_ahead at a time, and none past close
        self._closed = False
        self._held: dict[int, HeldChange] = {}  # not yet drained, in order: +token retired, -token freed
        self._tokens = 0
        try:
            self._reserve_to(HEADER)
        except TierFull as exc:  # the filesystem filled up since the check above
            self.close()
            raise TierUnavailable(f"{what}: {exc}; lower tiers[0].capacity") from exc
        os.pwrite(self._fd, _MAGIC, 0)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of the arena file reserved so far (its header included): what this tier
        holds of ``/dev/shm``; it grows as extents are first used, up to :attr:`arena_size`."""
        return self._reserved

    def _reserve_to(self, end: int) -> None:
        """Reserve the arena file up to *end* (a file offset), rounded up to :data:`STEP`:
        ``posix_fallocate``, then ``mlock`` (or populate) the new range, so a write there can
        never SIGBUS and its first touch costs no page faults. Raises :class:`TierFull`
        (nothing reserved) when the filesystem has no room. Under ``_lock``, or before
        the tier is shared."""
        if end <= self._reserved:
            return
        start = self._reserved
        stop = min(len(self._mm), -(-end // STEP) * STEP)
        try:
            os.posix_fallocate(self._fd, start, stop - start)
        except OSError as exc:
            if not self._stuck:
                self._stuck = True
                log.warning(
                    "%s: the arena cannot grow past %s of %s: %s is full (%s); it holds no more until room is made",
                    self._what,
                    format_size(start),
                    format_size(len(self._mm)),
                    self.path.parent,
                    exc.strerror,
                )
            raise TierFull(
                f"DRAM arena cannot grow past {format_size(start)}: {self.path.parent} is full ({exc.strerror})"
            ) from exc
        self._stuck = self._ahead_stuck = False
        self._fault_in(start, stop)
        self._reserved = stop

    def reserve_ahead(self, window: int) -> int:
        """Reserve the arena up to *window* bytes (rounded up to :data:`STEP`) past the
        highest extent handed out, so the puts that follow land in memory that is already
        there instead of each growing the arena on its caller's path (``posix_fallocate``
        and the fault-in cost ~1.1 ms per 2 MiB: most of a seal). The work is done outside
        the tier's lock, in the caller's thread (a background one: the mount's background
        pass); a put that needs the same range meanwhile reserves it itself (the work done
        twice, harmless). Returns the bytes newly reserved; 0 when nothing was wanted, the
        tier is closed, or the filesystem is full (the puts' own reservation says so)."""
        grown = 0
        with self._growing:
            while not self._closed:
                with self._lock:
                    start = self._reserved
                    stop = min(self._ahead_end(window), start + _AHEAD_STEP)
                if stop <= start:
                    break
                try:
                    os.posix_fallocate(self._fd, start, stop - start)
                except OSError:
                    self._ahead_stuck = True  # asked again only once a put could grow the arena
                    break
                self._fault_in(start, stop)
                with self._lock:  # each step published at once: the puts meanwhile use it
                    grown += max(0, stop - self._reserved)
                    self._reserved = max(self._reserved, stop)
        return grown

    def unreserved_ahead(self, window: int) -> int:
        # a hint for the owner's loop, read without the lock (a put may hold it through a
        # copy): reserve_ahead decides again under it
        if self._closed or self._ahead_stuck:
            return 0
        return max(0, self._ahead_end(window) - self._reserved)

    def _ahead_end(self, window: int) -> int:
        """Where :meth:`reserve_ahead` of *window* reserves to (a file offset; exact under
        ``_lock``); nothing past the first step before the first extent is handed out (a
        daemon that never writes holds no window)."""
        high = self._alloc.high_water()
        if high == 0:
            return self._reserved
        want = HEADER + high + window
        return min(HEADER + self._alloc.size, -(-want // STEP) * STEP)  # the arena's end

    def _fault_in(self, start: int, stop: int) -> None:
        """Lock (or populate) the arena's pages in ``[start, stop)``, reserved already."""
        if self.locked:
            err = self._libc.mlock(self._addr + start, stop - start)  # faults the range in, once
            if err:
                self.locked = False
                log.info("%s: mlock of the DRAM arena failed (errno %d); its pages may be swapped", self._what, err)
        if self._prefault and not self.locked:
            self._populate(start, stop - start)

    def _populate(self, start: int, length: int) -> None:
        """Touch the pages of ``[start, start + length)`` now, in one call where the kernel
        has one, so the first writes there do not pay a fault per page."""
        if self._libc.madvise(self._addr + start, length, _MADV_POPULATE_WRITE) == 0:  # Linux 5.14+
            return
        pages = np.frombuffer(self._mm, dtype=np.uint8)[start : start + length : mmap.PAGESIZE]
        pages[:] = 0  # one strided write per page, in C (the range is reserved and unused)
        del pages

    def _take(self, size: int) -> int | None:
        """A free extent of *size* bytes, reserved (under ``_lock``), or None when no hole is
        large enough; :class:`TierFull` when the arena cannot grow to hold it."""
        off = self._alloc.alloc(size)
        if off is None:
            return None
        try:
            self._reserve_to(HEADER + off + self._alloc.round(size))
        except TierFull:
            self._alloc.free(off, size)
            raise
        return off

    def footprint(self, name: str, size: int) -> int:
        return self._alloc.round(size)

    def put(self, name: str, data: Any, checksum: int) -> None:
        pieces = Pieces.of(data)
        n = len(pieces)
        with self._lock:
            off = self._take(n)
            if off is None:
                raise TierFull(f"DRAM arena has no free extent of {n} bytes")
            ext = _Extent(off, n, checksum)
            pieces.copy_to(self._view[off : off + n])
            old = self._index.get(name)
            self._index[name] = ext
            if old is not None:
                self._retire(old, name)

    def _retire(self, ext: _Extent, name: str) -> None:
        """Under the lock: *ext* (the copy of *name*) leaves the index; its room is free
        now, or, while readers hold it, once the last lets go (reported meanwhile)."""
        ext.retired = True
        if ext.refs == 0:
            self._alloc.free(ext.offset, ext.length)
            return
        self._tokens += 1
        ext.token = self._tokens
        self._held[ext.token] = HeldChange(ext.token, name, self._alloc.round(ext.length))

    def _release(self, ext: _Extent) -> None:
        with self._lock:
            ext.refs -= 1
            if ext.refs == 0 and ext.retired:
                self._alloc.free(ext.offset, ext.length)
                if ext.token and self._held.pop(ext.token, None) is None:  # not drained yet: never counted
                    self._held[-ext.token] = HeldChange(ext.token, "", -self._alloc.round(ext.length))

    def held_changes(self) -> list[HeldChange]:
        with self._lock:
            out, self._held = list(self._held.values()), {}
        return out

    def open(self, name: str) -> BlockRef:
        with self._lock:
            ext = self._index.get(name)
            if ext is None:
                raise BlockNotFound(name)
            ext.refs += 1
        return BlockRef(self._ro[ext.offset : ext.offset + ext.length], ext.checksum, lambda: self._release(ext))

    def open_located(self, name: str, size: int | None = None) -> tuple[BlockRef, Location]:
        """:meth:`open` and :meth:`locate` in one look under the lock (a lease's hold): the
        ref holds the extent, the location is the extent's own, made once."""
        with self._lock:
            ext = self._index.get(name)
            if ext is None:
                raise BlockNotFound(name)
            ext.refs += 1
            loc = ext.location
            if loc is None:
                loc = ext.location = Location(path=self._path, offset=HEADER + ext.offset, length=ext.length)
        start = ext.offset
        return BlockRef(self._ro[start : start + ext.length], ext.checksum, lambda: self._release(ext)), loc

    # -- extents written by clients (two-phase puts, kvfs.ingest) ---------------------

    def reserve(self, size: int) -> int:
        """A free extent of *size* bytes, outside the index (no reader sees it); returns its
        arena offset. Raises :class:`TierFull` when no hole is large enough."""
        with self._lock:
            off = self._take(size)
        if off is None:
            raise TierFull(f"DRAM arena has no free extent of {size} bytes")
        return off

    def reserved_view(self, offset: int, size: int) -> memoryview:
        """A read-only view of a reserved extent (to checksum what a client wrote)."""
        return self._ro[offset : offset + size]

    def reserved_location(self, offset: int, size: int) -> Location:
        return Location(path=str(self.path), offset=HEADER + offset, length=size)

    def commit(self, name: str, offset: int, size: int, checksum: int) -> None:
        """Publish the reserved extent at *offset* as block *name*, replacing an existing
        copy atomically (readers of the old one keep it until they release)."""
        with self._lock:
            old = self._index.get(name)
            self._index[name] = _Extent(offset, size, checksum)
            if old is not None:
                self._retire(old, name)

    def abort(self, offset: int, size: int) -> None:
        """Return a reserved extent that will not be published."""
        with self._lock:
            self._alloc.free(offset, size)

    def share(self, writable: bool) -> int:
        """A new descriptor of the arena file for a client: opened read-only unless
        *writable*, so a reader's mapping cannot be made writable. Reopened through
        ``/proc/self/fd`` (the same inode: nobody can swap the file under its name)."""
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC
        return os.open(f"/proc/self/fd/{self._fd}", flags)

    @property
    def arena_size(self) -> int:
        """Bytes of the arena file (its header page included)."""
        return len(self._mm)

    def locate(self, name: str, size: int | None = None) -> Location:
        """Where the block lies in the arena file (for zero-copy clients, who must hold a
        ref or a lease on it while they read)."""
        with self._lock:
            ext = self._index.get(name)
            if ext is None:
                raise BlockNotFound(name)
            loc = ext.location
            if loc is None:
                loc = ext.location = Location(path=self._path, offset=HEADER + ext.offset, length=ext.length)
            return loc

    def delete(self, name: str) -> None:
        with self._lock:
            ext = self._index.pop(name, None)
            if ext is not None:
                self._retire(ext, name)

    def rename(self, old: str, new: str) -> None:
        with self._lock:
            ext = self._index.pop(old, None)
            if ext is None:
                raise BlockNotFound(old)
            replaced = self._index.get(new)
            self._index[new] = ext
            if replaced is not None:
                self._retire(replaced, new)

    def stat(self, name: str) -> BlockInfo | None:
        with self._lock:
            ext = self._index.get(name)
            return None if ext is None else BlockInfo(name, ext.length, ext.checksum)

    def scan(self, prefix: str = "") -> Iterator[BlockInfo]:
        with self._lock:
            items = [(n, e) for n, e in self._index.items() if not prefix or n.startswith(prefix + "/")]
        for n, e in items:
            yield BlockInfo(n, e.length, e.checksum)

    @property
    def free_bytes(self) -> int:
        return self._alloc.free_bytes

    def close(self) -> None:
        with self._growing:  # a reserve_ahead running now ends first; none starts after
            self._closed = True
        with self._lock:
            self._index.clear()
        try:
            self._ro.release()
            self._view.release()
            self._whole.release()
            self._mm.close()
        except BufferError:
            log.warning("DRAM arena still has readers at close; it is unmapped when they finish")
        if self._fd < 0:
            return
        try:
            os.unlink(self.path)  # ours: created or re-used (marked) while we hold its lock
        except FileNotFoundError:
            pass
        os.close(self._fd)  # drops the lock
        self._fd = -1
