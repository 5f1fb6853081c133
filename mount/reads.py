"""Opening sealed blocks for reading: from DRAM, from the store, or by the kernel itself.

:class:`BlockReads` finds what an open for reading serves (:meth:`BlockReads.source`) and
makes its handle (:meth:`BlockReads.open`):

- **A DRAM hit** (``Store.open_hot``, on the loop): a :class:`~kvfs.tier.BlockRef` into the
  arena. The kernel keeps the pages it reads through the daemon across opens
  (``keep_cache``: one inode per version), so the first read of an inode costs 1 MiB READs
  and later ones are page-cache hits.
- **Passthrough** (kernel transport, ``CAP_SYS_ADMIN``): when the block's hottest copy is a
  disk file holding exactly the payload (``Store.open_file``: block format version 3,
  checked against the checksum once per file), the file is registered as the inode's
  backing file and the kernel reads it without asking the daemon — no READ requests,
  the backing file's page cache shared with every other reader of it.
- **Otherwise** ``Store.open`` in a worker thread (disk, posix, s3 copies; verified,
  promoted per the policy): a ref, served like a DRAM hit.

An inode keeps its backing id after its last passthrough file closes (at most
:data:`IDLE_BACKINGS` ids, :data:`IDLE_BYTES` of files, oldest let go first): its next
open only asks the catalog whether its version is still the block's
(``BackingFiles.touch``, on the loop) and reuses the id — no file opened, no thread.

The kernel allows an inode one way at a time: while files of it are open through the page
cache, a passthrough open of it fails (``EIO`` to the opener), and while passthrough files
of it are open, so does a page-cache open, and every passthrough open of it must name the
same backing file. So each :class:`~kvfs.mount.inodes.Inode` counts its open handles of
each kind (``cached``, ``passthrough``) and keeps its backing id while passthrough handles
are open; an open follows what the inode already has open. Read-only opens are answered
``FOPEN_NOFLUSH``: nothing is reported at their close, so the kernel sends no FLUSH.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from collections import OrderedDict
from dataclasses import dataclass

from pyfuse3 import FUSEError

from kvfs.store import BlockStat, Store
from kvfs.tier import BackingFile, BlockRef

from .inodes import Inode
from .options import FsOptions
from .transport import FileReply, FuseTransport
from .workers import MetaCall, SlowCall

__all__ = ["BlockReads", "ReadHandle", "StaleBacking"]

log = logging.getLogger("kvfs.mount.reads")

IDLE_BACKINGS = 256
"""Backing ids kept registered for inodes with no passthrough file open (their next open
then needs no file opened or checked: a catalog check on the loop)."""
IDLE_BYTES = 256 << 20
"""...and the most bytes of block files they may hold open (a block evicted or replaced
meanwhile keeps its disk space until its id is dropped)."""


def _max_files() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, min(4096, soft // 4)) if soft != resource.RLIM_INFINITY else 4096


MAX_FILES = _max_files()
"""Backing files kept open at once (a quarter of the descriptors this process may open,
at most 4096)."""


class StaleBacking(Exception):
    """The backing file of an inode with passthrough files open changed since it was
    checked: the inode may not be opened again (the name needs a new inode)."""


def _identity(fd: int) -> tuple[int, ...]:
    st = os.fstat(fd)
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class KeptBacking:
    """The source of an open served from the backing id its inode already has."""

    __slots__ = ("checksum", "size")

    def __init__(self, checksum: int, size: int) -> None:
        self.checksum = checksum
        self.size = size

    def __len__(self) -> int:
        return self.size

    def close(self) -> None:
        pass


Source = BlockRef | BackingFile | KeptBacking


@dataclass(slots=True, eq=False)
class ReadHandle:
    """An open file handle of a sealed block: its bytes (*ref*), or None when the kernel
    reads them from the inode's backing file (passthrough)."""

    node: Inode
    ref: BlockRef | None


class BlockReads:
    """Sources and handles of opens for reading (see the module doc). *slow* runs a
    store call in a worker thread under a tier's limiter; *meta* runs a metadata call
    (on the loop when it can)."""

    def __init__(
        self,
        store: Store,
        options: FsOptions,
        *,
        slow: SlowCall,
        meta: MetaCall,
    ) -> None:
        self.store = store
        self.options = options
        self._slow = slow
        self._meta = meta
        self._hot_volatile = not store.tiers[0].persistent
        self._files = [i for i, t in enumerate(store.tiers) if t.persistent and not t.shared]
        self.transport: FuseTransport | None = None
        self._idle: OrderedDict[int, Inode] = OrderedDict()  # inode number -> inode, oldest first
        self._idle_bytes = 0
        self._files_of: dict[int, BackingFile] = {}  # inode number -> its backing file, kept open

    def attach(self, transport: FuseTransport) -> None:
        self.transport = transport

    @property
    def passthrough(self) -> bool:
        """Whether opens may be served by the kernel from backing files."""
        t = self.transport
        return t is not None and t.passthrough and self.options.passthrough and not self.options.direct_io_read

    # -- sources ---------------------------------------------------------------------

    async def block(self, name: str) -> BlockRef:
        """A reference to the sealed block *name*'s bytes (ENOENT if absent)."""
        if self._hot_volatile:  # open_hot never waits and never asks a shared tier
            ref = self.store.open_hot(name)
            if ref is not None:
                return ref  # a DRAM hit: memory speed, served on the loop
        st = await self._meta(self.store.lookup, name)
        if st is None:
            raise FUSEError(errno.ENOENT)
        # a copy in DRAM we could not take on the loop (the store is busy): a thread, bounded
        # like the tier a seal may demote to
        return await self._slow(self._first(st) or 1, self.store.open, name)

    async def source(self, name: str, node: Inode) -> Source:
        """What an open of *node* (showing *name*) serves: a DRAM ref, the checked file
        of a disk copy for the kernel to read (when *node* may be opened that way), or a
        ref read through the store. ENOENT when the block is gone."""
        if node.backing and not node.passthrough and not node.cached and node.checksum is not None:
            # the inode's backing file, kept: whether the version is still the block's, and
            # the file what it was when checked (an fstat of our descriptor: no disk I/O)
            if not self._changed(node) and await self._meta(self.store.files.touch, name, node.checksum, node.size):
                return KeptBacking(node.checksum, node.size)
            self.drop(node)  # gone, replaced or changed: found out below, as for any inode
        if self._hot_volatile:
            ref = self.store.open_hot(name)
            if ref is not None:
                return ref
        if self.passthrough and not node.cached:
            st = await self._meta(self.store.lookup, name)
            if st is None:
                raise FUSEError(errno.ENOENT)
            first = self._first(st)
            if first in self._files:
                f = await self._slow(first, self.store.files.open, name)
                if f is not None:
                    return f
        return await self.block(name)

    def _first(self, st: BlockStat) -> int:
        return self.store.tier_index(st.tiers[0]) if st.tiers else 0

    # -- handles ---------------------------------------------------------------------

    async def open(
        self, node: Inode, name: str, src: Source, fh: int, keep_cache: bool
    ) -> tuple[ReadHandle, FileReply]:
        """The handle and the reply of an open of *node* serving *src* (whose version
        the caller checked is *node*'s). A backing file the inode cannot take now (its
        files are open through the page cache) is exchanged for a ref; a ref for an
        inode the kernel reads from its backing file is exchanged for that."""
        if isinstance(src, KeptBacking):
            self._unidle(node)
            node.passthrough += 1
            return ReadHandle(node, None), FileReply(fh=fh, noflush=self.options.noflush, backing_id=node.backing)
        if node.passthrough and node.backing:
            # the kernel reads this inode from its backing file: this open must too, as long
            # as that file is still what was checked
            if isinstance(src, BlockRef):
                src.release()
            else:
                src.close()
            if self._changed(node):
                raise StaleBacking(node.ino)
            node.passthrough += 1
            return ReadHandle(node, None), FileReply(fh=fh, noflush=self.options.noflush, backing_id=node.backing)
        if isinstance(src, BackingFile):
            backing = 0
            if not node.cached and self._room():
                self.drop(node)  # a kept id of an older check: this file was checked just now
                backing = self._register(src)
            if backing:
                node.backing = backing
                self._files_of[node.ino] = src  # kept open: fstat tells whether it changed since
                node.passthrough += 1
                return ReadHandle(node, None), FileReply(fh=fh, noflush=self.options.noflush, backing_id=backing)
            src.close()
            src = await self.block(name)  # the page cache, then
            if not node.shows(src.checksum, len(src.data)):
                src.release()
                raise FUSEError(errno.ESTALE)  # replaced meanwhile: the kernel looks the name up again
        node.cached += not self.options.direct_io_read
        reply = FileReply(
            fh=fh, keep_cache=keep_cache, direct_io=self.options.direct_io_read, noflush=self.options.noflush
        )
        return ReadHandle(node, src), reply

    def _room(self) -> bool:
        """Whether another backing file may be kept open (one descriptor each, bounded by
        :data:`MAX_FILES`: past it, opens are served through the page cache)."""
        while len(self._files_of) >= MAX_FILES and self._idle:
            self.drop(next(iter(self._idle.values())))
        return len(self._files_of) < MAX_FILES

    def _changed(self, node: Inode) -> bool:
        """Whether *node*'s backing file changed since it was checked (or is not known)."""
        f = self._files_of.get(node.ino)
        if f is None:
            return True
        try:
            return _identity(f.fd) != f.identity
        except OSError:
            return True

    def _register(self, f: BackingFile) -> int:
        assert self.transport is not None
        try:
            return self.transport.backing_open(f.fd)
        except OSError as exc:  # refused (a backing filesystem stacked too deep, ...): the daemon serves it
            log.info("passthrough refused a backing file (%s); serving the block from the daemon", exc.strerror)
            return 0

    def release(self, h: ReadHandle) -> None:
        """The handle's last descriptor is gone: its ref, or its share of the backing file."""
        node = h.node
        if h.ref is not None:
            h.ref.release()
            h.ref = None
            node.cached -= not self.options.direct_io_read
            return
        node.passthrough -= 1
        if not node.passthrough and node.backing:
            self._idle[node.ino] = node  # kept for the inode's next open (bounded)
            self._idle_bytes += node.size
            while self._idle and (len(self._idle) > IDLE_BACKINGS or self._idle_bytes > IDLE_BYTES):
                self.drop(next(iter(self._idle.values())))

    def _unidle(self, node: Inode) -> None:
        if self._idle.pop(node.ino, None) is not None:
            self._idle_bytes -= node.size

    def drop(self, node: Inode) -> None:
        """Let go of *node*'s backing id if no passthrough file of it is open (its block
        is gone or replaced, or the kept ids are over their bounds)."""
        if node.passthrough or not node.backing:
            return
        self._unidle(node)
        f = self._files_of.pop(node.ino, None)
        if f is not None:
            f.close()
        backing, node.backing = node.backing, 0
        try:
            if self.transport is not None:
                self.transport.backing_close(backing)
        except OSError as exc:  # pragma: no cover - the id was ours; the kernel dropped it already
            log.debug("backing_close(%d) failed: %s", backing, exc)

    def reserved(self, node: Inode, ref: BlockRef, fh: int) -> tuple[ReadHandle, FileReply]:
        """The handle of a retried open that takes the block its first attempt found."""
        node.cached += not self.options.direct_io_read
        reply = FileReply(fh=fh, direct_io=self.options.direct_io_read, noflush=self.options.noflush)
        return ReadHandle(node, ref), reply
