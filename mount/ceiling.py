"""The ceiling of a Python FUSE daemon here: a minimal in-memory pyfuse3 filesystem.

``kvfs bench fuse`` mounts it next to kvfs and tmpfs in the same run, so kvfs's figures
can be read against what any pyfuse3 + trio daemon costs on this machine and kernel
(request round trips, copies into and out of Python), not only against tmpfs. It does
the least a filesystem can: a dict of inodes, one ``bytearray`` per file, no checksums,
no tiers, no locks; the same per-file FUSE settings as kvfs (page cache with
``keep_cache``, the same entry timeout, the same read-ahead, the same mount options and
worker tasks), so the kernel sends both the same requests. Its attributes are cached for
the entry timeout only: its files change in place, where kvfs's sealed blocks never do.

Run as ``python -m kvfs.mount.ceiling MOUNTPOINT [--transport kernel] [--helper]``
(foreground; unmount with ``fusermount3 -u``): on pyfuse3 (the default), or on kvfs's own
kernel transport (read-only opens without FLUSH, as kvfs's; ``--helper`` mounts through
fusermount3 even as root). Not for data: it forgets everything when unmounted.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat as stat_mod
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyfuse3
import trio
from pyfuse3 import FUSEError

from .buffer import keep_freed_memory
from .daemon import _set_read_ahead
from .kernel.device import MountSpec
from .kernel.session import Session
from .options import FsOptions
from .transport import AttrFields, AttrValues, DirToken, FileReply, Requester, readdir_reply

__all__ = ["FSTYPE", "CeilingOperations", "main"]

FSTYPE = "fuse.kvfs-ceiling"


@dataclass(slots=True, eq=False)
class _Node:
    ino: int
    is_dir: bool
    data: bytearray = field(default_factory=bytearray)
    children: dict[bytes, int] = field(default_factory=dict)
    mtime: float = field(default_factory=time.time)


class CeilingOperations(pyfuse3.Operations):
    """Files in memory; handlers do nothing but the dictionary work."""

    enable_writeback_cache = False

    def __init__(self, options: FsOptions = FsOptions()) -> None:
        super().__init__()
        keep_freed_memory()  # as kvfs does: the comparison is of handlers, not of malloc settings
        self.options = options
        self.nodes: dict[int, _Node] = {pyfuse3.ROOT_INODE: _Node(pyfuse3.ROOT_INODE, True)}
        self._next = pyfuse3.ROOT_INODE + 1

    def _attr(self, node: _Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.st_mode = (stat_mod.S_IFDIR | 0o755) if node.is_dir else (stat_mod.S_IFREG | 0o644)
        a.st_nlink = 1
        a.st_size = len(node.data)
        a.st_uid, a.st_gid = self.options.uid, self.options.gid
        a.st_blksize = 1 << 20
        a.st_blocks = (a.st_size + 511) // 512
        a.st_mtime_ns = a.st_ctime_ns = a.st_atime_ns = int(node.mtime * 1e9)
        a.entry_timeout = a.attr_timeout = self.options.entry_timeout  # its files change
        return a

    def _get(self, ino: int) -> _Node:
        node = self.nodes.get(ino)
        if node is None:
            raise FUSEError(errno.ENOENT)
        return node

    async def lookup(self, parent_inode: int, name: bytes, ctx: Requester | None = None) -> pyfuse3.EntryAttributes:
        ino = self._get(parent_inode).children.get(name)
        if ino is None:
            raise FUSEError(errno.ENOENT)
        return self._attr(self.nodes[ino])

    async def getattr(self, inode: int, ctx: Requester | None = None) -> pyfuse3.EntryAttributes:
        return self._attr(self._get(inode))

    async def setattr(
        self, inode: int, attr: AttrValues, fields: AttrFields, fh: int | None, ctx: Requester
    ) -> pyfuse3.EntryAttributes:
        node = self._get(inode)
        if fields.update_size:
            n = attr.st_size
            if n < len(node.data):
                del node.data[n:]
            else:
                node.data.extend(bytes(n - len(node.data)))
        return self._attr(node)

    def _add(self, parent_inode: int, name: bytes, is_dir: bool) -> _Node:
        parent = self._get(parent_inode)
        if name in parent.children:
            raise FUSEError(errno.EEXIST)
        node = _Node(self._next, is_dir)
        self._next += 1
        self.nodes[node.ino] = node
        parent.children[name] = node.ino
        return node

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Requester) -> pyfuse3.EntryAttributes:
        return self._attr(self._add(parent_inode, name, True))

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Requester
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        node = self._add(parent_inode, name, False)
        return pyfuse3.FileInfo(fh=node.ino, keep_cache=False), self._attr(node)

    async def unlink(self, parent_inode: int, name: bytes, ctx: Requester) -> None:
        ino = self._get(parent_inode).children.pop(name, None)
        if ino is None:
            raise FUSEError(errno.ENOENT)
        self.nodes.pop(ino, None)

    rmdir = unlink

    async def rename(
        self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes, flags: int, ctx: Requester
    ) -> None:
        ino = self._get(parent_inode_old).children.pop(name_old, None)
        if ino is None:
            raise FUSEError(errno.ENOENT)
        self._get(parent_inode_new).children[name_new] = ino

    async def open(self, inode: int, flags: int, ctx: Requester) -> pyfuse3.FileInfo:
        node = self._get(inode)
        if flags & os.O_TRUNC:
            node.data.clear()
        reading = flags & os.O_ACCMODE == os.O_RDONLY
        return FileReply(fh=inode, keep_cache=self.options.keep_cache, noflush=reading and self.options.noflush)

    # pyfuse3 declares bytes; both transports copy any buffer into the reply
    async def read(self, fh: int, off: int, size: int) -> memoryview:  # type: ignore[override]
        return memoryview(self.nodes[fh].data)[off : off + size]

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        data = self.nodes[fh].data
        if off == len(data):
            data += buf
        else:
            if off > len(data):
                data.extend(bytes(off - len(data)))
            data[off : off + len(buf)] = buf
        return len(buf)

    async def flush(self, fh: int, pid: int | None = None) -> None:
        return None

    async def release(self, fh: int) -> None:
        return None

    async def fsync(self, fh: int, datasync: bool) -> None:
        return None

    async def opendir(self, inode: int, ctx: Requester) -> int:
        self._get(inode)
        return inode

    async def readdir(self, fh: int, start_id: int, token: DirToken) -> None:
        entries = sorted(self._get(fh).children.items())
        for i in range(start_id, len(entries)):
            name, ino = entries[i]
            if not readdir_reply(token, name, self._attr(self.nodes[ino]), i + 1):
                return

    async def releasedir(self, fh: int) -> None:
        return None

    async def statfs(self, ctx: Requester) -> pyfuse3.StatvfsData:
        st = pyfuse3.StatvfsData()
        st.f_bsize = st.f_frsize = 4096
        st.f_namemax = 255
        return st

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvfs.mount.ceiling")
    parser.add_argument("mountpoint")
    parser.add_argument("--transport", choices=["pyfuse3", "kernel"], default="pyfuse3")
    parser.add_argument("--helper", action="store_true", help="kernel transport: mount through fusermount3")
    args = parser.parse_args(argv)
    mountpoint = os.path.realpath(args.mountpoint)  # before mounting: afterwards it would ask ourselves
    options = FsOptions()
    ops = CeilingOperations(options)
    if args.transport == "kernel":
        session = Session(ops, MountSpec(fsname=FSTYPE.split(".", 1)[1], subtype=FSTYPE.split(".", 1)[1]))
        session.mount(mountpoint, helper=args.helper)
        _set_read_ahead(mountpoint, options.read_ahead_kb)
        try:
            trio.run(session.serve)
        finally:
            session.close(unmount=False)
        return 0
    pyfuse3.init(ops, mountpoint, {"fsname=kvfs-ceiling", "subtype=kvfs-ceiling", "default_permissions", "noatime"})
    _set_read_ahead(mountpoint, options.read_ahead_kb)
    try:
        trio.run(pyfuse3.main, 4, 64)
    finally:
        pyfuse3.close(unmount=False)
    return 0


if __name__ == "__main__":  # pragma: no cover - run by kvfs bench fuse
    sys.exit(main(sys.argv[1:]))
