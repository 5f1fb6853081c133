"""The FUSE filesystem: one pyfuse3 ``Operations`` class over a :class:`~kvfs.store.Store`.

Handlers translate FUSE requests into store calls and back; the only exception a handler
raises is ``FUSEError``, and :func:`errno_of` is the one place a :class:`KvfsError` (or an
``OSError``) becomes an errno. docs/SEMANTICS.md states, operation by operation, what
each handler does and which errno it returns; tests/test_mount_semantics.py checks it.

Inodes. Names get inode numbers on first lookup (``_Inodes``: a bidirectional map with
exact lookup counts; ``forget`` drops an inode when the kernel's count reaches zero and no
handle uses it). A name whose block is *replaced* (sealed over, renamed over) or removed
gets a fresh inode afterwards; the old one is *detached*: it keeps serving the handles
open on it (old readers keep their bytes) and answers ``open`` with ``ESTALE``, which
makes the kernel look the name up again. So the kernel's page cache for an inode always
holds one block's bytes, which is what makes ``keep_cache`` safe for sealed blocks.

Write-once. ``create`` (or ``open`` with ``O_TRUNC``) returns a write handle: a bytearray
in the daemon, random writes allowed. ``flush``/``fsync``/``release`` seal it with
``store.put``; until then the name stays invisible (lookup ``ENOENT``, or the block it
replaces). Sealed blocks are read through a :class:`~kvfs.tier.BlockRef` held per open
read handle.

Never blocking the loop. Store calls that may touch a persistent tier run in a worker
thread under that tier's ``trio.CapacityLimiter`` (``concurrency`` in its config); reads
of a block whose hottest copy is in DRAM are served on the loop.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat as stat_mod
import time
from dataclasses import dataclass, field

import pyfuse3
import trio
from pyfuse3 import FUSEError

from kvfs.errors import (
    BlockCorrupt,
    BlockExists,
    BlockNotFound,
    ConfigError,
    DirectoryNotEmpty,
    InvalidName,
    IsADirectory,
    KvfsError,
    NoSpace,
    NotADirectory,
    ReadOnlyBlock,
    TierFull,
    TierUnavailable,
)
from kvfs.names import normalize
from kvfs.store import BlockStat, Store, StoreBusy

from .opstats import OpStats

__all__ = ["XATTRS", "FsOptions", "KvfsOperations", "errno_of"]

log = logging.getLogger("kvfs.mount.fs")

ROOT_INODE = pyfuse3.ROOT_INODE
_NAME_MAX = 255
_SMALL_SEAL = 4 << 20  # blocks up to this size seal on the loop when DRAM has room (a memcpy)

XATTR_TIERS = b"user.kvfs.tiers"
XATTR_PINNED = b"user.kvfs.pinned"
XATTR_HITS = b"user.kvfs.hits"
XATTR_CHECKSUM = b"user.kvfs.checksum"
XATTR_PARENT = b"user.kvfs.parent"
XATTRS = (XATTR_TIERS, XATTR_PINNED, XATTR_HITS, XATTR_CHECKSUM)

# KvfsError class -> errno; the first matching base class wins (most specific first).
_ERRNO: tuple[tuple[type[BaseException], int], ...] = (
    (BlockNotFound, errno.ENOENT),  # missing, evicted, every copy bad: a miss, never EIO
    (BlockCorrupt, errno.ENOENT),
    (NoSpace, errno.ENOSPC),
    (TierFull, errno.ENOSPC),
    (IsADirectory, errno.EISDIR),
    (NotADirectory, errno.ENOTDIR),
    (DirectoryNotEmpty, errno.ENOTEMPTY),
    (BlockExists, errno.EEXIST),
    (ReadOnlyBlock, errno.EPERM),
    (InvalidName, errno.EINVAL),
    (ConfigError, errno.EINVAL),
    (TierUnavailable, errno.EHOSTDOWN),  # the block exists, but the tiers holding it are down
)


def errno_of(exc: BaseException) -> int:
    """The errno a failed store call answers with: the one place errors become errno."""
    if isinstance(exc, FUSEError):
        return exc.errno
    for cls, code in _ERRNO:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return errno.EIO


def _handler(fn):
    """Time the handler into OpStats and convert every error to FUSEError (one place)."""
    op = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: KvfsOperations, *args):
        t0 = time.perf_counter()
        try:
            result = await fn(self, *args)
        except FUSEError:
            self.opstats.observe(op, time.perf_counter() - t0, True)
            raise
        except (KvfsError, OSError) as exc:
            self.opstats.observe(op, time.perf_counter() - t0, True)
            code = errno_of(exc)
            if code == errno.EIO:
                log.warning("%s failed: %s", op, exc)
            raise FUSEError(code) from exc
        except Exception as exc:  # a bug must fail one request, not take the mount down
            self.opstats.observe(op, time.perf_counter() - t0, True)
            log.exception("%s failed unexpectedly; answering EIO", op)
            raise FUSEError(errno.EIO) from exc
        self.opstats.observe(op, time.perf_counter() - t0, False)
        return result

    return wrapper


@dataclass(frozen=True, kw_only=True)
class FsOptions:
    """Per-file FUSE settings (chosen by ``kvfs bench fuse``; see docs/benchmarks-fuse.md).

    ``keep_cache``: sealed blocks are immutable and a replaced block gets a new inode, so
    the kernel may keep their pages across opens. ``direct_io_read``/``direct_io_write``:
    bypass the page cache (breaks mmap of sealed blocks; never used for them by default).
    ``attr_timeout``/``entry_timeout``: seconds the kernel may cache attributes and names.
    """

    keep_cache: bool = True
    direct_io_read: bool = False
    direct_io_write: bool = False
    attr_timeout: float = 1.0
    entry_timeout: float = 1.0
    read_ahead_kb: int = 2048
    """Set on the mount's backing device (sysfs; needs root): the kernel's default of
    128 KiB splits a page-cache miss into 128 KiB requests; 2 MiB lets them reach the
    1 MiB FUSE maximum (2.3x faster uncached reads, docs/benchmarks-fuse.md). 0: leave."""
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)


@dataclass(slots=True, eq=False)
class _Inode:
    ino: int
    name: str | None  # None once detached (replaced or removed)
    is_dir: bool
    nlookup: int = 0
    handles: int = 0
    checksum: int | None = None  # checksum of the block the kernel may have cached pages of
    size: int = 0  # last known size (answers getattr once detached)
    mtime: float = 0.0
    """Fixed for the inode's life (an inode is one block: a replacement gets a new one).
    A changing mtime would make the kernel drop the pages it cached from the writes."""


class _Inodes:
    """name <-> inode, with the kernel's lookup count per inode (exact; see ``forget``)."""

    def __init__(self) -> None:
        self.by_ino: dict[int, _Inode] = {ROOT_INODE: _Inode(ROOT_INODE, "", True, nlookup=1)}
        self.by_name: dict[str, int] = {"": ROOT_INODE}
        self._next = ROOT_INODE + 1

    def get(self, ino: int) -> _Inode:
        node = self.by_ino.get(ino)
        if node is None:
            raise FUSEError(errno.ENOENT)
        return node

    def for_name(self, name: str, is_dir: bool) -> _Inode:
        """The inode for *name*, made if needed; a name whose kind changed gets a new one."""
        ino = self.by_name.get(name)
        if ino is not None:
            node = self.by_ino[ino]
            if node.is_dir == is_dir:
                return node
            self.detach(name)
        node = _Inode(self._next, name, is_dir)
        self._next += 1
        self.by_ino[node.ino] = node
        self.by_name[name] = node.ino
        return node

    def detach(self, name: str) -> _Inode | None:
        """Unbind *name* from its inode (the block was replaced or removed)."""
        ino = self.by_name.pop(name, None)
        if ino is None:
            return None
        node = self.by_ino[ino]
        node.name = None
        self._collect(node)
        return node

    def move(self, old: str, new: str) -> None:
        self.detach(new)
        ino = self.by_name.pop(old, None)
        if ino is not None:
            self.by_name[new] = ino
            self.by_ino[ino].name = new

    def forget(self, ino: int, n: int) -> None:
        node = self.by_ino.get(ino)
        if node is None or ino == ROOT_INODE:
            return
        node.nlookup -= n
        if node.nlookup < 0:  # pragma: no cover - would be a kernel or bookkeeping bug
            log.error("inode %d forgotten more often than looked up", ino)
            node.nlookup = 0
        self._collect(node)

    def _collect(self, node: _Inode) -> None:
        if node.nlookup == 0 and node.handles == 0 and node.ino != ROOT_INODE:
            self.by_ino.pop(node.ino, None)
            if node.name is not None and self.by_name.get(node.name) == node.ino:
                del self.by_name[node.name]

    def release(self, node: _Inode) -> None:
        node.handles -= 1
        self._collect(node)


@dataclass(slots=True, eq=False)
class _ReadHandle:
    node: _Inode
    ref: object  # BlockRef


@dataclass(slots=True, eq=False)
class _WriteHandle:
    node: _Inode
    name: str
    buf: bytearray = field(default_factory=bytearray)
    dirty: bool = True  # not sealed since the last change
    parent: str | None = None  # user.kvfs.parent set before close: the prefix chain's parent


class KvfsOperations(pyfuse3.Operations):
    """FUSE requests over *store*. *opstats* records every operation's latency."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, store: Store, options: FsOptions = FsOptions(), opstats: OpStats | None = None) -> None:
        super().__init__()
        self.store = store
        self.options = options
        self.opstats = opstats if opstats is not None else OpStats()
        self.inodes = _Inodes()
        self._handles: dict[int, _ReadHandle | _WriteHandle] = {}
        self._dirs: dict[int, list[tuple[str, bool]]] = {}
        self._dir_nodes: dict[int, _Inode] = {}
        self._next_fh = 1
        self._limiters = [trio.CapacityLimiter(max(1, t.config.concurrency)) for t in store.tiers]
        self._hot_volatile = not store.tiers[0].persistent
        self._max_block = max((t.capacity or (1 << 62)) for t in store.tiers)
        self._nursery: trio.Nursery | None = None
        self.started = time.time()

    def attach_nursery(self, nursery: trio.Nursery) -> None:
        """Where kernel cache invalidations run (they must not run inside a handler)."""
        self._nursery = nursery

    # -- helpers -------------------------------------------------------------------

    async def _slow(self, tier: int, fn, *args):
        """Run a store call that may touch tier *tier* (or colder) in a worker thread,
        abandoned if the loop is cancelled (an unmount never waits on a hung tier)."""
        tier = min(max(tier, 0), len(self._limiters) - 1)
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiters[tier], abandon_on_cancel=True)

    async def _meta(self, fn, *args):
        """A store metadata call: on the loop when it needs nothing but the catalog (the
        store answers local blocks from memory and revalidates them in the background);
        in a worker thread when the store says it would wait (StoreBusy), under the
        limiter of the tier it names (a shared tier to ask about a name this node does
        not know, a file to delete), or the hottest tier's when only its lock was busy.
        So metadata of local blocks never queues behind shared-tier calls."""
        try:
            return self.store.nowait(fn, *args)
        except StoreBusy as busy:
            limiter = self._limiters[busy.tier if busy.tier is not None else 0]
            return await trio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=True)

    def _probe(self, name: str) -> tuple[bool, BlockStat | None]:
        """``(is_dir, stat or None)`` of *name*: the store half of a lookup (thread-safe)."""
        if self.store.is_dir(name):
            return True, None
        return False, self.store.lookup(name)

    def _probe_many(self, names: list[str]) -> list[tuple[bool, BlockStat | None]]:
        return [self._probe(n) for n in names]

    def _fits_in_dram(self, n: int) -> bool:
        """True when a block of *n* bytes goes into free DRAM without evicting anything,
        so sealing it is a memory copy that may run on the loop."""
        if not self._hot_volatile or n > _SMALL_SEAL:
            return False
        free = getattr(self.store.tiers[0], "free_bytes", 0)
        return free >= n + _SMALL_SEAL

    def _seal_tier(self) -> int:
        # sealing lands in the hottest tier but may demote evicted blocks to the next one
        return 1 if len(self._limiters) > 1 else 0

    def _coldest(self, st: BlockStat | None) -> int:
        """The tier whose limiter a delete or rename of *st* runs under: its coldest local
        copy's (the store updates shared copies in the background), or, for a block only
        shared tiers hold, the first of those."""
        if st is None or not st.tiers:
            return 0
        indexes = [self.store.tier_index(t) for t in st.tiers]
        local = [i for i in indexes if not self.store.tiers[i].shared]
        return local[-1] if local else indexes[0]

    def _child(self, parent_ino: int, name: bytes) -> str:
        parent = self.inodes.get(parent_ino)
        if parent.name is None:
            raise FUSEError(errno.ENOENT)
        if len(name) > _NAME_MAX:
            raise FUSEError(errno.ENAMETOOLONG)
        try:
            base = name.decode("utf-8")
        except UnicodeDecodeError:
            raise FUSEError(errno.EINVAL) from None
        return normalize(f"{parent.name}/{base}" if parent.name else base)

    def _new_fh(self, handle) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = handle
        handle.node.handles += 1
        return fh

    def _handle(self, fh: int):
        h = self._handles.get(fh)
        if h is None:
            raise FUSEError(errno.EBADF)
        return h

    def _pending(self, node: _Inode) -> _WriteHandle | None:
        """The newest write handle on *node*, if a file is being written there."""
        found = None
        for h in self._handles.values():
            if isinstance(h, _WriteHandle) and h.node is node:
                found = h
        return found

    def _attr(self, node: _Inode, size: int, mtime: float, atime: float | None = None) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        a.entry_timeout = self.options.entry_timeout
        a.attr_timeout = self.options.attr_timeout
        if node.is_dir:
            a.st_mode = stat_mod.S_IFDIR | 0o755
            a.st_nlink = 1  # "unknown": find(1) must not assume leaf directories
            a.st_size = 0
        else:
            a.st_mode = stat_mod.S_IFREG | 0o644
            a.st_nlink = 1 if node.name is not None else 0
            a.st_size = size
        a.st_uid = self.options.uid
        a.st_gid = self.options.gid
        a.st_rdev = 0
        a.st_blksize = 1 << 20
        a.st_blocks = (a.st_size + 511) // 512
        mt = int(mtime * 1e9)
        a.st_mtime_ns = mt
        a.st_ctime_ns = mt
        a.st_atime_ns = int((atime if atime is not None else mtime) * 1e9)
        return a

    async def _node_attr(self, node: _Inode) -> pyfuse3.EntryAttributes:
        """Attributes of *node* now; ENOENT when its name holds nothing any more."""
        if node.name is None:
            return self._attr(node, node.size, node.mtime)
        if node.is_dir:
            if not await self._meta(self.store.is_dir, node.name):
                raise FUSEError(errno.ENOENT)
            return self._attr(node, 0, self.started)
        st = await self._meta(self.store.lookup, node.name)
        if st is not None:
            node.size = st.size
            node.mtime = node.mtime or st.created
            return self._attr(node, st.size, node.mtime, st.accessed)
        w = self._pending(node)
        if w is not None:
            return self._attr(node, len(w.buf), node.mtime or time.time())
        raise FUSEError(errno.ENOENT)

    async def _entry(self, name: str) -> pyfuse3.EntryAttributes:
        """Attributes for *name*, resolving it to its (possibly new) inode; ENOENT if absent.
        Does not count a lookup."""
        return self._entry_from(name, *await self._meta(self._probe, name))

    def _entry_from(self, name: str, is_dir: bool, st: BlockStat | None) -> pyfuse3.EntryAttributes:
        """The inode half of a lookup, on the loop (the inode table is the loop's)."""
        if is_dir:
            node = self.inodes.for_name(name, True)
            return self._attr(node, 0, self.started)
        if st is None:
            raise FUSEError(errno.ENOENT)
        node = self.inodes.for_name(name, False)
        node.size = st.size
        node.mtime = node.mtime or st.created
        return self._attr(node, st.size, node.mtime, st.accessed)

    def _invalidate_entry(self, name: str) -> None:
        """Make the kernel drop its dentry of *name* (in the background: it may block while
        a request on the directory is in flight)."""
        parent, _, base = name.rpartition("/")
        pino = self.inodes.by_name.get(parent)
        if pino is None or self._nursery is None:
            return

        def notify() -> None:
            try:
                pyfuse3.invalidate_entry(pino, base.encode())
            except OSError as exc:  # the kernel may have dropped it already
                log.debug("invalidate_entry(%s) failed: %s", name, exc)

        self._nursery.start_soon(trio.to_thread.run_sync, notify)

    async def _invalidate_inode(self, ino: int) -> None:
        """Drop the kernel's cached attributes and pages of *ino* (no writeback cache, so
        this cannot wait on us; it runs in a thread all the same)."""

        def notify() -> None:
            try:
                pyfuse3.invalidate_inode(ino)
            except OSError as exc:
                log.debug("invalidate_inode(%d) failed: %s", ino, exc)

        await trio.to_thread.run_sync(notify)

    # -- names ---------------------------------------------------------------------

    @_handler
    async def lookup(self, parent_inode, name, ctx=None):
        path = self._child(parent_inode, name)
        attr = await self._entry(path)
        self.inodes.get(attr.st_ino).nlookup += 1
        return attr

    async def forget(self, inode_list):
        for ino, n in inode_list:
            self.inodes.forget(ino, n)

    @_handler
    async def getattr(self, inode, ctx=None):
        return await self._node_attr(self.inodes.get(inode))

    @_handler
    async def setattr(self, inode, attr, fields, fh, ctx):
        node = self.inodes.get(inode)
        if fields.update_mode or fields.update_uid or fields.update_gid:
            raise FUSEError(errno.EPERM)  # modes and owners follow the mounting user
        if fields.update_size:
            w = self._handles.get(fh) if fh is not None else self._pending(node)
            if not isinstance(w, _WriteHandle) or w.node is not node:
                raise FUSEError(errno.EPERM)  # a sealed block is immutable
            if attr.st_size > self._max_block:
                raise FUSEError(errno.EFBIG)
            n = attr.st_size
            if n < len(w.buf):
                del w.buf[n:]
            else:
                w.buf.extend(bytes(n - len(w.buf)))
            w.dirty = True
        # atime/mtime updates (touch) are accepted and ignored: times are kvfs's own
        return await self._node_attr(node)

    @_handler
    async def mkdir(self, parent_inode, name, mode, ctx):
        path = self._child(parent_inode, name)
        await self._meta(self.store.mkdir, path)
        attr = await self._entry(path)
        self.inodes.get(attr.st_ino).nlookup += 1
        return attr

    @_handler
    async def rmdir(self, parent_inode, name, ctx):
        path = self._child(parent_inode, name)
        is_dir, st = await self._meta(self._probe, path)
        if not is_dir:
            raise FUSEError(errno.ENOTDIR if st is not None else errno.ENOENT)
        await self._meta(self.store.rmdir, path)
        self.inodes.detach(path)

    @_handler
    async def unlink(self, parent_inode, name, ctx):
        path = self._child(parent_inode, name)
        is_dir, st = await self._meta(self._probe, path)
        if st is None:
            raise FUSEError(errno.EISDIR if is_dir else errno.ENOENT)
        await self._slow(self._coldest(st), self.store.delete, path)
        self.inodes.detach(path)

    @_handler
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise FUSEError(errno.EINVAL)
        is_dir, st = await self._meta(self._probe, old)
        if st is None:
            if is_dir:
                raise FUSEError(errno.EXDEV)  # mv falls back to copy and remove
            raise FUSEError(errno.ENOENT)
        if flags & pyfuse3.RENAME_NOREPLACE:
            new_dir, new_st = await self._meta(self._probe, new)
            if new_dir or new_st is not None:
                raise FUSEError(errno.EEXIST)
        if old == new:
            return
        await self._slow(self._coldest(st), self.store.rename, old, new)
        self.inodes.move(old, new)

    async def symlink(self, parent_inode, name, target, ctx):
        self.opstats.observe("symlink", 0.0, True)
        raise FUSEError(errno.EPERM)

    async def link(self, inode, new_parent_inode, new_name, ctx):
        self.opstats.observe("link", 0.0, True)
        raise FUSEError(errno.EPERM)

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        self.opstats.observe("mknod", 0.0, True)
        raise FUSEError(errno.EPERM)

    async def readlink(self, inode, ctx):
        self.opstats.observe("readlink", 0.0, True)
        raise FUSEError(errno.EINVAL)

    # -- directories ---------------------------------------------------------------

    @_handler
    async def opendir(self, inode, ctx):
        node = self.inodes.get(inode)
        if node.name is None:
            raise FUSEError(errno.ENOENT)
        listing = await self._meta(self.store.listdir, node.name)
        fh = self._next_fh
        self._next_fh += 1
        # a sorted snapshot: offsets (index + 1) stay valid while entries come and go
        self._dirs[fh] = sorted(listing.items())
        node.handles += 1
        self._dir_nodes[fh] = node
        return fh

    @_handler
    async def readdir(self, fh, start_id, token):
        entries = self._dirs.get(fh)
        node = self._dir_nodes.get(fh)
        if entries is None or node is None or node.name is None:
            raise FUSEError(errno.EBADF)
        prefix = f"{node.name}/" if node.name else ""
        for chunk in range(start_id, len(entries), 256):
            names = [prefix + base for base, _ in entries[chunk : chunk + 256]]
            probes = await self._meta(self._probe_many, names)  # one trip per 256
            for k, (name, probe) in enumerate(zip(names, probes)):
                try:
                    attr = self._entry_from(name, *probe)
                except FUSEError:
                    continue  # removed since opendir
                if not pyfuse3.readdir_reply(token, name.rpartition("/")[2].encode(), attr, chunk + k + 1):
                    return
                self.inodes.get(attr.st_ino).nlookup += 1

    @_handler
    async def releasedir(self, fh):
        self._dirs.pop(fh, None)
        node = self._dir_nodes.pop(fh, None)
        if node is not None:
            self.inodes.release(node)

    async def fsyncdir(self, fh, datasync):
        return None

    # -- files ---------------------------------------------------------------------

    def _write_info(self, fh: int, replacing: bool = False) -> pyfuse3.FileInfo:
        # A replacement (O_TRUNC on a sealed block) shares its inode with the old block's
        # readers: its writes must bypass the page cache, or they would read new bytes.
        direct = self.options.direct_io_write or replacing
        return pyfuse3.FileInfo(fh=fh, direct_io=direct, keep_cache=False)

    @_handler
    async def create(self, parent_inode, name, mode, flags, ctx):
        path = self._child(parent_inode, name)
        is_dir, st = await self._meta(self._probe, path)
        if is_dir:
            raise FUSEError(errno.EISDIR)
        parent = path.rpartition("/")[0]
        if not await self._meta(self.store.is_dir, parent):
            raise FUSEError(errno.ENOENT)
        if st is not None and flags & os.O_EXCL:
            raise FUSEError(errno.EEXIST)
        pending = self.inodes.by_name.get(path)
        if pending is None or self._pending(self.inodes.by_ino[pending]) is None:
            self.inodes.detach(path)  # a fresh inode: no cached pages of an older block
        node = self.inodes.for_name(path, False)
        node.mtime = time.time()
        fh = self._new_fh(_WriteHandle(node, path))
        node.nlookup += 1
        attr = self._attr(node, 0, node.mtime)
        attr.entry_timeout = 0  # not visible to others until sealed: don't cache the name
        return self._write_info(fh), attr

    @_handler
    async def open(self, inode, flags, ctx):
        node = self.inodes.get(inode)
        if node.is_dir:
            raise FUSEError(errno.EISDIR)
        name = node.name  # the node may be renamed or retired while this handler awaits
        if name is None:
            raise FUSEError(errno.ESTALE)  # replaced or removed: the kernel looks the name up again
        if flags & os.O_ACCMODE != os.O_RDONLY:
            sealed = await self._meta(self.store.exists, name)
            if not sealed:
                raise FUSEError(errno.ENOENT)  # a file being written is not visible yet
            if not flags & os.O_TRUNC or flags & os.O_APPEND:
                raise FUSEError(errno.EPERM)  # a sealed block is immutable: replace it with O_TRUNC
            fh = self._new_fh(_WriteHandle(node, name))
            return self._write_info(fh, replacing=True)
        st = await self._meta(self.store.lookup, name)
        if st is None:
            raise FUSEError(errno.ENOENT)  # being written (not sealed yet), evicted or removed
        hot = self.store.open_hot(name) if self._hot_volatile else None  # never waits, never asks a shared tier
        if hot is not None:
            ref = hot  # a DRAM hit: memory speed, served on the loop
        elif st.tiers and st.tiers[0] == self.store.tiers[0].name:
            ref = await self._slow(1, self.store.open, name)
        else:
            first = self.store.tier_index(st.tiers[0]) if st.tiers else 0
            ref = await self._slow(first, self.store.open, name)
        keep = self.options.keep_cache and node.checksum == ref.checksum
        node.checksum = ref.checksum
        node.size = len(ref.data)
        fh = self._new_fh(_ReadHandle(node, ref))
        return pyfuse3.FileInfo(fh=fh, keep_cache=keep, direct_io=self.options.direct_io_read)

    @_handler
    async def read(self, fh, off, size):
        h = self._handle(fh)
        if isinstance(h, _WriteHandle):
            return bytes(h.buf[off : off + size])
        return bytes(h.ref.data[off : off + size])

    @_handler
    async def write(self, fh, off, buf):
        h = self._handle(fh)
        if not isinstance(h, _WriteHandle):
            raise FUSEError(errno.EBADF)
        end = off + len(buf)
        if end > self._max_block:
            raise FUSEError(errno.EFBIG)
        b = h.buf
        if off == len(b):
            b += buf
        else:
            if off > len(b):
                b.extend(bytes(off - len(b)))
            b[off:end] = buf
        h.dirty = True
        return len(buf)

    async def _seal(self, h: _WriteHandle) -> None:
        if not h.dirty:
            return
        replaced = await self._meta(self.store.exists, h.name)
        if self._fits_in_dram(len(h.buf)):
            try:  # a memcpy into the arena: no thread, unless the store is busy
                st = self.store.nowait(self.store.put, h.name, h.buf, parent=h.parent)
            except StoreBusy:
                st = await self._slow(
                    self._seal_tier(), functools.partial(self.store.put, parent=h.parent), h.name, h.buf
                )
        else:
            st = await self._slow(self._seal_tier(), functools.partial(self.store.put, parent=h.parent), h.name, h.buf)
        h.dirty = False
        # The kernel's pages of a new file came from these writes (through the page cache),
        # so they are the sealed bytes: later opens may keep them. A replacement wrote with
        # direct_io and its inode is retired below.
        h.node.checksum = st.checksum if not (replaced or self.options.direct_io_write) else None
        if replaced and self.inodes.by_name.get(h.name) == h.node.ino:
            # old readers keep the old inode (and their bytes); the name gets a new one.
            # The kernel zeroed the old inode's size at the O_TRUNC open and grew it with
            # the writes: drop that so old readers ask us (getattr: the old size) again.
            self.inodes.detach(h.name)
            await self._invalidate_inode(h.node.ino)
            self._invalidate_entry(h.name)

    @_handler
    async def flush(self, fh):
        h = self._handle(fh)
        if isinstance(h, _WriteHandle):
            await self._seal(h)

    @_handler
    async def fsync(self, fh, datasync):
        h = self._handle(fh)
        if isinstance(h, _WriteHandle):
            await self._seal(h)

    @_handler
    async def release(self, fh):
        h = self._handles.pop(fh, None)
        if h is None:
            return
        try:
            if isinstance(h, _WriteHandle):
                try:
                    await self._seal(h)
                except (KvfsError, FUSEError) as exc:
                    log.warning("sealing %s on release failed: %s", h.name, exc)
                    raise
            else:
                h.ref.release()
        finally:
            self.inodes.release(h.node)

    # -- filesystem ----------------------------------------------------------------

    @_handler
    async def statfs(self, ctx):
        s = await self._meta(self.store.statistics)
        bs = 4096
        cap = sum(t.capacity for t in s.tiers if t.capacity is not None)
        used = sum(t.used for t in s.tiers if t.capacity is not None)
        st = pyfuse3.StatvfsData()
        st.f_bsize = bs
        st.f_frsize = bs
        st.f_blocks = cap // bs
        st.f_bfree = max(cap - used, 0) // bs
        st.f_bavail = st.f_bfree
        st.f_files = s.blocks + st.f_bfree
        st.f_ffree = st.f_bfree
        st.f_favail = st.f_bfree
        st.f_namemax = _NAME_MAX
        return st

    @_handler
    async def access(self, inode, mode, ctx):
        return True

    # -- extended attributes -------------------------------------------------------

    async def _block_stat(self, inode: int) -> BlockStat:
        node = self.inodes.get(inode)
        if node.is_dir:
            raise FUSEError(pyfuse3.ENOATTR)
        if node.name is None:
            raise FUSEError(errno.ENOENT)
        return await self._meta(self.store.stat, node.name)

    @_handler
    async def getxattr(self, inode, name, ctx):
        st = await self._block_stat(inode)
        if name == XATTR_TIERS:
            return ",".join(st.tiers).encode()
        if name == XATTR_PINNED:
            return b"1" if st.pinned else b"0"
        if name == XATTR_HITS:
            return str(st.hits).encode()
        if name == XATTR_CHECKSUM:
            return st.checksum_hex.encode()
        if name == XATTR_PARENT and st.parent:
            return st.parent.encode()
        raise FUSEError(pyfuse3.ENOATTR)

    @_handler
    async def listxattr(self, inode, ctx):
        node = self.inodes.get(inode)
        if node.is_dir:
            return []
        await self._block_stat(inode)
        return list(XATTRS)

    @_handler
    async def setxattr(self, inode, name, value, ctx):
        if name == XATTR_PARENT:  # only while the file is being written: a sealed block is immutable
            w = self._pending(self.inodes.get(inode))
            if w is None:
                raise FUSEError(errno.EPERM)
            try:
                w.parent = normalize(value.decode()) or None
            except (UnicodeDecodeError, KvfsError):
                raise FUSEError(errno.EINVAL) from None
            return
        st = await self._block_stat(inode)
        if name == XATTR_PINNED:
            v = value.strip()
            if v not in (b"0", b"1"):
                raise FUSEError(errno.EINVAL)
            await self._meta(self.store.pin, st.name, v == b"1")
            return
        if name in XATTRS:
            raise FUSEError(errno.EPERM)  # read-only kvfs state
        raise FUSEError(errno.ENOTSUP)  # no arbitrary user attributes

    @_handler
    async def removexattr(self, inode, name, ctx):
        st = await self._block_stat(inode)
        if name == XATTR_PINNED:
            await self._meta(self.store.pin, st.name, False)
            return
        if name in XATTRS:
            raise FUSEError(errno.EPERM)
        raise FUSEError(pyfuse3.ENOATTR)

    # -- lifecycle -----------------------------------------------------------------

    def close_handles(self) -> None:
        """Release every read handle's BlockRef (after the loop stopped, before store.close).
        Files still open for writing are dropped unsealed: they never became visible."""
        for h in self._handles.values():
            if isinstance(h, _ReadHandle):
                h.ref.release()
            else:
                log.warning("%s was still open for writing at unmount; it is not sealed", h.name)
        self._handles.clear()
