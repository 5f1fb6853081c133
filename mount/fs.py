"""The FUSE filesystem: one pyfuse3 ``Operations`` class over a :class:`~kvfs.store.Store`.

Handlers translate FUSE requests and delegate: names and inodes to
:class:`~kvfs.mount.inodes.InodeTable`, files being written (versions, bounds, seals) to
:class:`~kvfs.mount.writes.Writes`, blocks to the store; :mod:`kvfs.mount.errnos` turns
what they raise into an errno. docs/SEMANTICS.md states what each operation does and
answers; tests/mount/test_mount_semantics.py checks every numbered line of it on a real mount.
docs/mount-internals.md gives the rules (one inode per version, lookup counts, when a file
is sealed) and the life of a write and of a read as call chains.

Never blocking the loop (:mod:`kvfs.mount.workers`): store calls that may touch a
persistent tier run in a worker thread under that tier's limiter;
reads of a block whose hottest copy is in DRAM, and seals of small blocks into free DRAM,
run on the loop. Opens for reading are :mod:`kvfs.mount.reads`'s (DRAM, the store, or
the kernel itself from a backing file).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import time
from collections.abc import Sequence
from typing import NoReturn

import pyfuse3
import trio
from pyfuse3 import FUSEError

from kvfs.access import Operation, Peer
from kvfs.errors import KvfsError
from kvfs.events import Event, EventKind
from kvfs.names import check_creatable, normalize, normalize_valid
from kvfs.store import BlockIdentity, BlockStat, Store
from kvfs.tier import BlockRef

from .attrs import Attributes
from .buffer import keep_freed_memory
from .errnos import errno_of, handler, refused
from .inodes import Inode, InodeTable
from .notify import KernelNotices
from .opstats import OpStats
from .options import FsOptions
from .reads import BlockReads, ReadHandle, StaleBacking
from .reservations import Reservation, Reservations
from .storecalls import StoreCalls
from .transport import AttrFields, AttrValues, DirToken, FuseTransport, Requester, readdir_reply
from .workers import Workers
from .writes import Version, WriteHandle, Writes, default_write_buffer
from .xattrs import XATTR_PARENT, XATTR_PINNED, XATTRS, pin_request, value_of

__all__ = ["XATTRS", "FsOptions", "KvfsOperations", "errno_of"]

log = logging.getLogger("kvfs.mount.fs")

_NAME_MAX = 255
_UNBOUNDED_BLOCK = 5 << 40  # the largest block an unbounded tier takes (S3's largest object)
_NAME_CHANGES = frozenset({EventKind.STORED, EventKind.REMOVED, EventKind.RENAMED})  # events that move a name
_SETTLE_ON_LOOP = 4096  # names of a batch-client request normalized on the loop; more in a worker thread


class KvfsOperations(pyfuse3.Operations):
    """FUSE requests over *store*. *opstats* records every operation's latency;
    *write_buffer* caps the memory of files being written (bytes; None: automatic);
    *workers* runs what leaves the loop (the daemon's one :class:`Workers`)."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(
        self,
        store: Store,
        options: FsOptions = FsOptions(),
        opstats: OpStats | None = None,
        *,
        write_buffer: int | None = None,
        workers: Workers | None = None,
    ) -> None:
        super().__init__()
        keep_freed_memory()  # write buffers are reused warm (a page fault per 4 KiB otherwise)
        self.store = store
        self.options = options
        self.opstats = opstats if opstats is not None else OpStats()
        self.inodes = InodeTable()
        self._handles: dict[int, ReadHandle | WriteHandle] = {}
        self._dirs: dict[int, tuple[Inode, list[str]]] = {}
        self.reserved = Reservations(self.inodes)
        self._next_fh = 1
        # store calls on the loop or in worker threads (mount/workers.py, mount/storecalls.py)
        self.workers = workers if workers is not None else Workers(store)
        self.calls = StoreCalls(store, slow=self.workers.tier, loop_first=self.workers.loop_or_tier)
        self._slow, self._meta, self._change, self._put = (
            self.workers.tier,
            self.workers.meta,
            self.calls.change,
            self.calls.put,
        )
        self._probe, self._probe_many = self.calls.probe, self.calls.probe_many
        self._promise = self.calls.promise
        shared = [i for i, t in enumerate(store.tiers) if t.shared]
        # A miss may be cached by the kernel as long as names cannot appear behind its back:
        # with shared tiers another node may write one, which the store notices after its
        # negative TTL.
        self._negative_timeout = min(options.entry_timeout, store.negative_ttl) if shared else options.entry_timeout
        largest = max((t.capacity if t.capacity is not None else _UNBOUNDED_BLOCK) for t in store.tiers)
        cap = write_buffer if write_buffer is not None else default_write_buffer()
        self.writes = Writes(
            cap=cap,
            max_block=min(largest, cap),
            release_wait=options.release_wait,
            opstats=self.opstats,
            promise=self._promise,
            give_up=store.give_up_promise,
        )
        # Without shared tiers a name changes only through this daemon, which tells the
        # kernel when its store removes, replaces or renames one (names_changed): sealed
        # names may be cached long, sparing a LOOKUP per open of a name idle over 1 s.
        self.attrs = Attributes(
            options,
            negative_timeout=self._negative_timeout,
            sealed_entry_timeout=options.entry_timeout if shared else options.sealed_entry_timeout,
            namespaces=store.namespaces,
        )
        self._events_dropped = store.events.dropped
        self.notices = KernelNotices(self.inodes, self.workers.kernel)
        self.reads = BlockReads(store, options, slow=self._slow, meta=self._meta)

    def attach_nursery(self, nursery: trio.Nursery, transport: FuseTransport) -> None:
        """Where kernel cache invalidations run (they must not run inside a handler), and
        the transport they go through (its passthrough, when it has it, serves blocks)."""
        self.notices.attach(nursery, transport)
        self.reads.attach(transport)

    async def settle_outside(self, names: list[str]) -> None:
        """Before a read of *names* from outside the mount (the batch client): wait for the
        seals of files closed on the mount (the kernel's release comes after ``close``
        returned), so close-to-open holds between a program writing through the mount and
        an engine reading through the client. Names as the caller got them: one that is not a
        valid kvfs name is skipped (the store's call answers it with its error)."""
        if not self.writes.writing:
            return
        # a big batch's names are normalized in a worker thread: the loop serves FUSE meanwhile
        keys = (
            normalize_valid(names) if len(names) <= _SETTLE_ON_LOOP else await self.workers.cpu(normalize_valid, names)
        )
        pending = [k for k in keys if self.writes.has(k)]
        if pending:
            await self._settle(*pending)

    async def published_outside(self, names: list[str]) -> None:
        """Blocks *names* were published or replaced outside the mount (the batch client's
        puts): the names' inodes showing older versions are detached and the kernel drops
        what it cached of them (a miss, an older version's inode and size) before this
        returns, so a program that looks after the put returned sees the new block."""
        for name in names:
            node = self.inodes.bound(name)
            if node is not None and not node.is_dir and node.version is None:
                self.inodes.detach(name)  # handles open on it keep their version
        await self.notices.entries_now(names)

    def names_changed(self, events: list[Event], dropped: int) -> None:
        """The store's events since the last call (drained by the control side at least
        once a second) and its count of events lost so far: the kernel forgets the names
        of blocks removed, replaced or renamed behind it (the next lookup asks the store),
        all of the names it holds when events were lost. On the loop; the notifications
        go out in a worker thread."""
        if dropped != self._events_dropped:
            self._events_dropped = dropped
            names = [n for n, node in list(self.inodes.by_name.items()) if not node.is_dir]
        else:
            names = []
            for ev in events:
                if ev.kind is EventKind.STORED:
                    node = self.inodes.bound(ev.name)
                    if node is not None and node.version is None and node.size == ev.size:
                        # the inode the kernel holds has that size already (this mount's own
                        # seal, as a rule): its name may stay; an open still asks the daemon,
                        # which answers ESTALE for any other version of the same size
                        continue
                if ev.kind in _NAME_CHANGES:
                    names.append(ev.name)
                    if ev.kind is EventKind.RENAMED and ev.detail:
                        names.append(ev.detail)  # the old name
        bound = [n for n in dict.fromkeys(names) if (node := self.inodes.bound(n)) is not None and not node.is_dir]
        if bound:
            self.notices.entries(bound)

    async def _open_block(self, name: str) -> BlockRef:
        """A reference to the sealed block *name*'s bytes (ENOENT if absent)."""
        return await self.reads.block(name)

    # -- names, inodes and attributes --------------------------------------------------

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

    def _resolve(self, name: str, is_dir: bool, st: BlockStat | BlockIdentity | None) -> Inode | None:
        """The inode *name* shows now (on the loop: the inode table is the loop's): its
        directory, its sealed block, or else the file being written there; None if none."""
        if is_dir:
            return self.inodes.directory(name)
        if st is not None:
            return self.inodes.sealed(name, st.checksum, st.size, st.created)
        v = self.writes.newest(name)
        if v is not None and v.node.version is v:
            self.inodes.bind(v.node, name)
            return v.node
        return None

    async def _settle(self, *names: str) -> None:
        """Wait for seals of *names* in progress (and closes about to be released)."""
        for name in names:
            if self.writes.has(name):
                await self.writes.settle(name)

    def _detach(self, node: Inode) -> None:
        """*node* no longer shows what its name holds: the name gets a new inode."""
        if node.name is not None:
            name = node.name
            self.inodes.detach(name)
            self.notices.entry(name)

    @handler
    async def lookup(self, parent_inode: int, name: bytes, ctx: Requester | None = None) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        r = self.reserved.take(path, ctx.pid) if ctx is not None and self.reserved else None
        if r is not None:  # the retry of an open answered ESTALE: the inode set aside for it
            self.inodes.looked_up(r.node)
            attr = self.attrs.of(r.node)
            attr.entry_timeout = 0  # nobody else is to reach it through this name
            if r.ref is None:  # a writer's: its size changes from here on
                attr.attr_timeout = self.options.entry_timeout
            return attr
        await self._settle(path)
        is_dir, st = await self._meta(self._probe, path)
        node = self._resolve(path, is_dir, st)
        if node is None:
            return self.attrs.negative()
        self.inodes.looked_up(node)
        self.notices.shed(self.options.max_inodes)  # past it the kernel forgets the idlest names
        return self.attrs.of(node)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for ino, n in inode_list:
            self.inodes.forget(ino, n)

    @handler
    async def getattr(self, inode: int, ctx: Requester | None = None) -> pyfuse3.EntryAttributes:
        node = self.inodes.get(inode)
        if node.is_dir:
            if node.name is None or not await self._meta(self.store.is_dir, node.name):
                raise FUSEError(errno.ENOENT)
            return self.attrs.of(node)
        if node.version is not None or node.name is None:
            return self.attrs.of(node)  # being written, or detached: its own attributes
        name = node.name
        st = await self._meta(self.store.lookup, name)
        if st is not None and node.shows(st.checksum, st.size):
            return self.attrs.of(node, st.accessed)
        # replaced or gone: this inode keeps its version for the handles open on it; the
        # name gets a fresh inode at the next lookup
        if self.inodes.bound(name) is node:
            self.inodes.detach(name)
            self.notices.entry(name)
        if node.handles or st is not None:
            return self.attrs.of(node)
        raise FUSEError(errno.ENOENT)

    @handler
    async def setattr(
        self,
        inode: int,
        attr: AttrValues,
        fields: AttrFields,
        fh: int | None,
        ctx: Requester,
    ) -> pyfuse3.EntryAttributes:
        node = self.inodes.get(inode)
        uid, gid = self.attrs.owner(node.name if node.name is not None else node.was)
        if (fields.update_uid and attr.st_uid != uid) or (fields.update_gid and attr.st_gid != gid):
            raise FUSEError(errno.EPERM)  # owners follow the mounting user or the namespace; chown to it is accepted
        # mode changes (chmod, fchmod) are accepted and change nothing: modes are kvfs's own
        if fields.update_size:
            h = self._handles.get(fh) if fh is not None else None
            v = h.version if isinstance(h, WriteHandle) else node.version
            if v is None or v.ended:
                raise FUSEError(errno.EPERM)  # a sealed block is immutable
            await self.writes.truncate(v, attr.st_size)
        # atime/mtime updates (touch) are accepted and ignored: times are kvfs's own
        return self.attrs.of(node)

    # -- namespace -------------------------------------------------------------------

    @handler
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Requester) -> pyfuse3.EntryAttributes:
        path = self._child(parent_inode, name)
        self._allow(path, ctx, Operation.WRITE)
        if self.writes.has(path):
            raise FUSEError(errno.EEXIST)
        await self._meta(self.store.mkdir, path)
        node = self.inodes.directory(path)
        self.inodes.looked_up(node)
        return self.attrs.of(node)

    @handler
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Requester) -> None:
        path = self._child(parent_inode, name)
        self._allow(path, ctx, Operation.WRITE)
        is_dir, st = await self._meta(self._probe, path)
        if not is_dir:
            raise FUSEError(errno.ENOTDIR if st is not None or self.writes.has(path) else errno.ENOENT)
        if self.writes.names_in(path):
            raise FUSEError(errno.ENOTEMPTY)  # files are being written in it
        await self._meta(self.store.rmdir, path)
        self.inodes.detach(path)

    @handler
    async def unlink(self, parent_inode: int, name: bytes, ctx: Requester) -> None:
        path = self._child(parent_inode, name)
        self._allow(path, ctx, Operation.WRITE)
        await self._settle(path)
        is_dir, st = await self._meta(self._probe, path)
        pending = self.writes.has(path)
        if st is None and not pending:
            raise FUSEError(errno.EISDIR if is_dir else errno.ENOENT)
        self.writes.unlink(path)  # files being written there are dropped when closed
        if st is not None:
            await self._change(st, self.store.delete, path)
        self.inodes.detach(path)

    @handler
    async def rename(
        self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes, flags: int, ctx: Requester
    ) -> None:
        old = self._child(parent_inode_old, name_old)
        new = self._child(parent_inode_new, name_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise FUSEError(errno.EINVAL)
        check_creatable(new)  # a reserved name is never a block's (kvfs.names): EINVAL
        self._allow(old, ctx, Operation.WRITE)
        self._allow(new, ctx, Operation.WRITE)
        await self._settle(old, new)
        is_dir, st = await self._meta(self._probe, old)
        pending = self.writes.has(old)
        if st is None and not pending:
            raise FUSEError(errno.EXDEV if is_dir else errno.ENOENT)  # mv falls back to copy and remove
        new_dir, new_st = await self._meta(self._probe, new)
        if flags & pyfuse3.RENAME_NOREPLACE and (new_dir or new_st is not None or self.writes.has(new)):
            raise FUSEError(errno.EEXIST)
        if old == new:
            return
        if new_dir:
            raise FUSEError(errno.EISDIR)
        if st is not None:
            await self._change(st, self.store.rename, old, new)
        # a file being written moves with its name; it is published under the new one
        # (replacing what is there then), and files being written at the target lose it
        self.writes.rename(old, new)
        self.inodes.move(old, new)

    symlink = refused("symlink", errno.EPERM)
    link = refused("link", errno.EPERM)
    mknod = refused("mknod", errno.EPERM)
    readlink = refused("readlink", errno.EINVAL)

    # -- directories -----------------------------------------------------------------

    @handler
    async def opendir(self, inode: int, ctx: Requester) -> int:
        node = self.inodes.get(inode)
        if node.name is None:
            raise FUSEError(errno.ENOENT)
        self._allow(node.name, ctx, Operation.LIST)
        listing = await self._meta(self.store.listdir, node.name)
        names = set(listing)
        names.update(self.writes.names_in(node.name))  # files being written are listed too
        fh = self._next_fh
        self._next_fh += 1
        # a sorted snapshot: offsets (index + 1) stay valid while entries come and go
        self._dirs[fh] = (node, sorted(names))
        self.inodes.opened(node)
        return fh

    @handler
    async def readdir(self, fh: int, start_id: int, token: DirToken) -> None:
        entry = self._dirs.get(fh)
        if entry is None or entry[0].name is None:
            raise FUSEError(errno.EBADF)
        node, bases = entry
        prefix = f"{node.name}/" if node.name else ""
        for chunk in range(start_id, len(bases), 256):
            part = bases[chunk : chunk + 256]
            names = [prefix + base for base in part]
            probes = await self._meta(self._probe_many, names)  # one trip per 256
            for k, (name, probe) in enumerate(zip(names, probes)):
                child = self._resolve(name, *probe)
                if child is None:
                    continue  # removed since opendir
                if not readdir_reply(token, part[k].encode(), self.attrs.of(child), chunk + k + 1):
                    return
                self.inodes.looked_up(child)

    @handler
    async def releasedir(self, fh: int) -> None:
        entry = self._dirs.pop(fh, None)
        if entry is not None:
            self.inodes.closed(entry[0])

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None

    # -- files -----------------------------------------------------------------------

    def _new_fh(self, handle: ReadHandle | WriteHandle, fh: int | None = None) -> int:
        """Register *handle* under a new file handle (or *fh*, taken with :meth:`_take_fh`)."""
        if fh is None:
            fh = self._take_fh()
        self._handles[fh] = handle
        self.inodes.opened(handle.node)
        if isinstance(handle, WriteHandle):
            self.writes.opened(handle.version)
        return fh

    def _take_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def _handle(self, fh: int) -> ReadHandle | WriteHandle:
        h = self._handles.get(fh)
        if h is None:
            raise FUSEError(errno.EBADF)
        return h

    @handler
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Requester
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._child(parent_inode, name)
        check_creatable(path)  # a reserved name is never a block's (kvfs.names): EINVAL
        self._allow(path, ctx, Operation.WRITE)
        await self._settle(path)
        is_dir, st = await self._meta(self._probe, path)
        if is_dir:
            raise FUSEError(errno.EISDIR)
        if flags & os.O_EXCL and (st is not None or self.writes.has(path)):
            raise FUSEError(errno.EEXIST)
        # a fresh inode for a fresh version: the kernel has no pages or size of it
        node = self.inodes.new(path, False)
        node.mtime = time.time()
        v = self.writes.start(path, node)
        node.version = v
        fh = self._new_fh(WriteHandle(node, v, ctx.pid))
        self.inodes.looked_up(node)
        info = pyfuse3.FileInfo(fh=fh, direct_io=self.options.direct_io_write, keep_cache=False)
        return info, self.attrs.of(node)

    @handler
    async def open(self, inode: int, flags: int, ctx: Requester) -> pyfuse3.FileInfo:
        node = self.inodes.get(inode)
        if node.is_dir:
            raise FUSEError(errno.EISDIR)
        r = self.reserved.for_inode(inode) if self.reserved else None
        if r is not None:
            return await self._open_reserved(r, flags, ctx)
        if node.name is not None:
            await self._settle(node.name)
        name = node.name  # it may have been renamed or detached while this handler waited
        if name is None:  # replaced or removed: the kernel looks the name up again
            await self._bounce(node.was, flags, ctx.pid)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            return await self._open_read(node, name, ctx.pid)
        self._allow(name, ctx, Operation.WRITE)
        return await self._open_write(node, name, flags, ctx.pid)

    async def _bounce(self, name: str | None, flags: int, pid: int, ref: BlockRef | None = None) -> NoReturn:
        """Answer an open ESTALE, with what its retry needs set aside (:mod:`.reservations`):
        for a reader the block *name* holds now (*ref*, or opened here), for a writer an
        inode of its own. Always raises."""
        if name is not None:
            if flags & os.O_ACCMODE != os.O_RDONLY:
                st = await self._meta(self.store.lookup, name)
                self.reserved.reserve(name, pid, size=st.size if st is not None else 0)
            else:
                if ref is None:
                    try:
                        ref = await self._open_block(name)
                    except (KvfsError, FUSEError) as exc:
                        if errno_of(exc) != errno.ENOENT:
                            raise
                if ref is not None:
                    self.reserved.reserve(name, pid, ref=ref)
        raise FUSEError(errno.ESTALE)

    async def _open_read(self, node: Inode, name: str, pid: int) -> pyfuse3.FileInfo:
        if node.version is not None:
            # being written: there is no block to read yet (unless one was sealed under the
            # name since the kernel looked it up: then it looks again)
            if await self._meta(self.store.lookup, name) is not None:
                self._detach(node)
                await self._bounce(name, os.O_RDONLY, pid)
            raise FUSEError(errno.ENOENT)
        try:
            src = await self.reads.source(name, node)
        except (KvfsError, FUSEError) as exc:
            if errno_of(exc) == errno.ENOENT:
                self._detach(node)  # evicted or removed: a miss, and a new inode if it comes back
            raise
        if not node.shows(src.checksum, len(src)):
            self._detach(node)  # a new version (here or on another node): a new inode
            if isinstance(src, BlockRef):
                await self._bounce(name, os.O_RDONLY, pid, src)
            src.close()
            await self._bounce(name, os.O_RDONLY, pid)
        keep = self.options.keep_cache and node.cache_ok
        fh = self._take_fh()
        try:
            h, info = await self.reads.open(node, name, src, fh, keep)
        except StaleBacking:  # its backing file changed behind the tier: a new inode checks it again
            self._detach(node)
            await self._bounce(name, os.O_RDONLY, pid)
        if h.ref is not None:
            node.cache_ok = True  # an open without keep_cache drops the kernel's pages of it
        self._new_fh(h, fh)
        return info

    async def _open_write(self, node: Inode, name: str, flags: int, pid: int) -> pyfuse3.FileInfo:
        v = node.version
        if v is not None and not v.ended:
            if not flags & os.O_TRUNC:  # a second open of a file being written (by path, or O_RDWR): the same file
                fh = self._new_fh(WriteHandle(node, v, pid))
                return pyfuse3.FileInfo(fh=fh, direct_io=self.options.direct_io_write, keep_cache=True)
            # O_TRUNC: a new version of its own, through the same inode (only writers use it:
            # a file being written has no readers), its writes bypassing the page cache
            v.shares_inode = True
            new = self.writes.start(name, node, shares_inode=True)
            fh = self._new_fh(WriteHandle(node, new, pid))
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=True)
        # A new version of a sealed block. Its writer must not share the block's inode with
        # the block's readers: the kernel would change the size they see as it writes. So
        # the old block's inode is detached (its readers keep it), and the open is answered
        # ESTALE: the kernel looks the name up again, within the same call, from the same
        # thread, and that lookup returns an inode of the writer's own.
        self._detach(node)
        await self._bounce(name, flags, pid)

    async def _open_reserved(self, r: Reservation, flags: int, ctx: Requester) -> pyfuse3.FileInfo:
        """The retried open of an inode set aside for it (see :meth:`_bounce`)."""
        reading = flags & os.O_ACCMODE == os.O_RDONLY
        if ctx.pid != r.pid:
            raise FUSEError(errno.ESTALE)  # someone else came through the retry's name: look again
        if reading != (r.ref is not None):
            # its own thread, but another kind of open: the retry never came (the kernel
            # refused it): give the reservation up so its next lookup finds the name's inode
            self.reserved.release(r)
            raise FUSEError(errno.ESTALE)
        self.reserved.claim(r)
        node = r.node
        try:
            if reading:  # the block the first attempt found, whatever was sealed since
                ref, r.ref = r.ref, None
                assert ref is not None
                fh = self._take_fh()
                h, info = self.reads.reserved(node, ref, fh)
                self._new_fh(h, fh)
                node.cache_ok = True
                return info
            base = None
            if not flags & os.O_TRUNC:  # a new version that starts as the old bytes (the newest)
                try:
                    base = await self._open_block(r.name)
                except (KvfsError, FUSEError) as exc:
                    if errno_of(exc) != errno.ENOENT:
                        raise
                    # gone meanwhile (evicted, unlinked): as if it were created now
            v = self.writes.start(r.name, node, base=base)
            node.version = v
            fh = self._new_fh(WriteHandle(node, v, ctx.pid))
            return pyfuse3.FileInfo(fh=fh, direct_io=self.options.direct_io_write, keep_cache=False)
        finally:
            self.reserved.done(r)

    @handler
    # pyfuse3 declares bytes; both transports copy any buffer into the reply, and a view
    # of the block spares a copy
    async def read(self, fh: int, off: int, size: int) -> bytes | memoryview:  # type: ignore[override]
        h = self._handle(fh)
        if isinstance(h, ReadHandle):
            if h.ref is None:  # pragma: no cover - the kernel reads a passthrough file itself
                raise FUSEError(errno.EIO)
            return h.ref.data[off : off + size]  # a view: the transport copies it into the reply
        return h.version.buffer.read(off, size)

    @handler
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        h = self._handle(fh)
        if not isinstance(h, WriteHandle):
            raise FUSEError(errno.EBADF)
        return await self.writes.write(h.version, off, buf)

    @handler
    async def flush(self, fh: int, pid: int | None = None) -> None:
        """A ``close`` of *fh*; *pid*: the closing task where the transport knows it (pyfuse3
        does not: then *fh*'s opener is asked). See ``Writes.flush``."""
        h = self._handle(fh)
        if isinstance(h, WriteHandle):
            await self.writes.flush(h, pid)

    @handler
    async def fsync(self, fh: int, datasync: bool) -> None:
        h = self._handle(fh)
        if isinstance(h, WriteHandle):
            await self.writes.seal(h.version, final=False, put=self._put, published=self._published)

    @handler
    async def release(self, fh: int) -> None:
        h = self._handles.pop(fh, None)
        if h is None:
            return
        try:
            if isinstance(h, WriteHandle):
                v = h.version
                if self.writes.released(v):
                    try:
                        await self.writes.seal(v, final=True, put=self._put, published=self._published)
                    finally:
                        if v.node.version is v:  # ended without being published: it shows nothing now
                            self._published(v, None, True)
            else:
                self.reads.release(h)
        finally:
            self.inodes.closed(h.node)

    def _published(self, v: Version, st: BlockStat | None, final: bool) -> None:
        """A seal of *v* ended (before anyone waiting on it runs): give the name's inodes
        the new version. *st*: the block published, or None (nothing was)."""
        node = v.node
        if st is not None:
            bound = self.inodes.bound(st.name)
            if final and not v.shares_inode and node.version is v and (bound is node or node.name is None):
                # the writer's own inode becomes the block's: the kernel's pages of it came
                # from these writes, so they are the sealed bytes and later opens keep them
                node.version = None
                node.checksum, node.size = st.checksum, st.size
                node.cache_ok = True
                if bound is not node:
                    self.inodes.bind(node, st.name)
                    self.notices.entry(st.name)
                if v.edges:  # the pages its writes covered in part: the kernel did not keep them
                    self.notices.store(node.ino, v.buffer.pages(sorted(v.edges), st.size))
                return
            if bound is not None:
                self.inodes.detach(st.name)  # the old version's inode (or the writer's): a new one at the next lookup
            self.notices.entry(st.name)
        if final and node.version is v:
            node.version = None  # shows nothing now: detached, it serves no one
            node.checksum = None
            if node.name is not None and self.inodes.bound(node.name) is node:
                name = node.name
                self.inodes.detach(name)
                self.notices.entry(name)
            self.notices.attrs(node.ino)

    # -- filesystem ------------------------------------------------------------------

    @handler
    async def statfs(self, ctx: Requester) -> pyfuse3.StatvfsData:
        return self.attrs.statfs(await self._meta(self.store.statistics), namemax=_NAME_MAX)

    @handler
    async def access(self, inode: int, mode: int, ctx: Requester) -> bool:
        return True

    # -- access ----------------------------------------------------------------------

    def _allow(self, name: str, ctx: Requester | None, op: Operation) -> None:
        """The one access decision (``Store.check_access``, the client socket's too),
        asked for operations that change or reveal state: the kernel has checked the
        attributes it was given (the same rule), and this keeps the decision kvfs's own
        for requests it does not check and for a transport without ``default_permissions``."""
        if ctx is None:
            return
        rule = self.attrs.rule(name)
        if ctx.uid in (0, rule.uid) or ctx.gid == rule.gid:  # the class is known: no groups needed
            peer = Peer(ctx.uid, ctx.gid, pid=ctx.pid)
        else:
            peer = Peer.of_process(ctx.pid, ctx.uid, ctx.gid)
        self.store.check_access(peer, name, op)

    # -- extended attributes ---------------------------------------------------------

    async def _block_stat(self, node: Inode) -> BlockStat:
        if node.is_dir:
            raise FUSEError(pyfuse3.ENOATTR)
        if node.name is None:
            # detached: the name now holds another version (or nothing). A path call came
            # through a dentry the kernel has not dropped yet; ESTALE makes it look the
            # name up again and retry (retry_estale), answering for what the name holds now.
            raise FUSEError(errno.ESTALE)
        return await self._meta(self.store.stat, node.name)

    async def _settled_node(self, inode: int) -> Inode:
        """*inode*, once a seal of its file in progress (or about to start) is done."""
        node = self.inodes.get(inode)
        if node.version is not None and node.name is not None:
            await self._settle(node.name)
        return node

    @handler
    async def getxattr(self, inode: int, name: bytes, ctx: Requester) -> bytes:
        if name not in XATTRS and name != XATTR_PARENT:
            # not a kvfs attribute (the kernel's security.capability check before a write,
            # an ACL): there is none, whatever the file's seal does, so it waits for nothing
            self.inodes.get(inode)
            raise FUSEError(pyfuse3.ENOATTR)
        node = await self._settled_node(inode)
        if node.version is not None:  # being written: only what the writer set
            if name == XATTR_PARENT and node.version.parent:
                return node.version.parent.encode()
            raise FUSEError(pyfuse3.ENOATTR)
        return value_of(await self._block_stat(node), name)

    @handler
    async def listxattr(self, inode: int, ctx: Requester) -> list[bytes]:
        node = await self._settled_node(inode)
        if node.is_dir or node.version is not None:
            return []
        await self._block_stat(node)
        return list(XATTRS)

    @handler
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Requester) -> None:
        node = self.inodes.get(inode)
        if name == XATTR_PARENT:  # only while the file is being written: a sealed block is immutable
            v = node.version
            if v is None:
                raise FUSEError(errno.EPERM)
            try:
                v.parent = normalize(value.decode()) or None
            except (UnicodeDecodeError, KvfsError):
                raise FUSEError(errno.EINVAL) from None
            return
        if node.version is not None:
            node = await self._settled_node(inode)
        if node.version is not None:
            raise FUSEError(errno.ENOTSUP if name not in XATTRS else errno.EPERM)
        st = await self._block_stat(node)
        if name == XATTR_PINNED:
            self._allow(st.name, ctx, Operation.PIN)
            pinned, ttl = pin_request(value)  # ttl: a soft pin (line 41)
            await self._meta(functools.partial(self.store.pin, ttl=ttl), st.name, pinned)
            return
        if name in XATTRS:
            raise FUSEError(errno.EPERM)  # read-only kvfs state
        raise FUSEError(errno.ENOTSUP)  # no arbitrary user attributes

    @handler
    async def removexattr(self, inode: int, name: bytes, ctx: Requester) -> None:
        st = await self._block_stat(await self._settled_node(inode))
        if name == XATTR_PINNED:
            self._allow(st.name, ctx, Operation.PIN)
            await self._meta(self.store.pin, st.name, False)
            return
        if name in XATTRS:
            raise FUSEError(errno.EPERM)
        raise FUSEError(pyfuse3.ENOATTR)

    # -- lifecycle -------------------------------------------------------------------

    def close_handles(self) -> None:
        """Release every read handle's BlockRef (after the loop stopped, before store.close).
        Files still open for writing are dropped unsealed: they never became visible."""
        for h in self._handles.values():
            if isinstance(h, ReadHandle) and h.ref is not None:
                h.ref.release()
        for v in self.writes.live():
            log.warning("%s was still open for writing at unmount; it is not sealed", v.name)
            self.writes.end(v)
        self.reserved.close()
        self._handles.clear()
