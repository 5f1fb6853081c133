"""Inodes: which inode number the kernel knows a name by, and its exact lookup count.

The rules (docs/mount-internals.md states them with the reasons):

- **One inode, one content.** A file inode shows exactly one thing for its whole life:
  either one sealed version of a block (its *identity*: checksum and size) or one file
  being written (its :class:`~kvfs.mount.writes.Version`, which may seal into the same
  inode). A name whose block changes — written here, renamed over, replaced on another
  node, removed — is *detached* from its inode and gets a fresh one at the next lookup.
  A detached inode keeps serving the handles open on it (old readers keep their bytes)
  and answers ``open`` by name with ``ESTALE``, which makes the kernel look the name up
  again. So the kernel's page cache and attributes of an inode are never another
  version's.
- **Lookup counts are exact.** Every reply that hands the kernel an inode (lookup,
  create, mkdir, each readdirplus entry) counts one lookup; ``forget`` subtracts what the
  kernel says. An inode is dropped when its count is zero and no handle is open on it.
- **Bounded.** The kernel forgets an inode only when it drops its dentry, which it may
  never do for a name it caches (one of millions, without memory pressure). So the table
  keeps file inodes with no open handle in least-recently-looked-up order
  (:meth:`InodeTable.idle_over`): past ``max_inodes`` the mount asks the kernel to drop
  the oldest names, and their inodes go with the kernel's ``forget``.
"""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyfuse3
from pyfuse3 import FUSEError

if TYPE_CHECKING:
    from .writes import Version

__all__ = ["ROOT_INODE", "Inode", "InodeTable"]

log = logging.getLogger("kvfs.mount.inodes")

ROOT_INODE = pyfuse3.ROOT_INODE


@dataclass(slots=True, eq=False)
class Inode:
    ino: int
    name: str | None
    """The name the kernel reaches this inode by; None once detached."""
    is_dir: bool
    was: str | None = None
    """The name it had before it was detached (a stale open by it is retried there)."""
    nlookup: int = 0
    handles: int = 0
    size: int = 0
    """A sealed inode's block size (fixed); a pending inode reads it from its version."""
    checksum: int | None = None
    """A sealed inode's identity (with ``size``); None while it shows a file being written."""
    version: Version | None = None
    """The file being written that this inode shows (None once it is sealed)."""
    mtime: float = 0.0
    """Fixed for the inode's life: a changing mtime would make the kernel drop the pages
    it cached from the writes (auto_inval_data)."""
    cache_ok: bool = False
    """The kernel's page cache of this inode may hold only this inode's bytes, so opens
    may keep it (``keep_cache``). False until an open without keep_cache has cleared it,
    or when a seal takes over the inode its own writes filled."""
    cached: int = 0
    """Read handles open through the kernel's page cache (:mod:`kvfs.mount.reads`)."""
    passthrough: int = 0
    """Read handles the kernel serves from ``backing`` (passthrough)."""
    backing: int = 0
    """The backing id the kernel reads this inode from while ``passthrough`` > 0."""

    def shows(self, checksum: int, size: int) -> bool:
        """True when this inode is the sealed version (*checksum*, *size*)."""
        return self.version is None and self.checksum == checksum and self.size == size


class InodeTable:
    """name <-> inode, with the kernel's lookup count per inode (see the module doc)."""

    def __init__(self) -> None:
        root = Inode(ROOT_INODE, "", True, nlookup=1)
        self.by_ino: dict[int, Inode] = {ROOT_INODE: root}
        self.by_name: dict[str, Inode] = {"": root}
        self._next = ROOT_INODE + 1
        self._idle: OrderedDict[int, None] = OrderedDict()  # file inodes with no handle: least recently looked up first

    def __len__(self) -> int:
        return len(self.by_ino)

    def idle_over(self, cap: int) -> list[Inode]:
        """The least recently looked-up file inodes with a name and no open handle, as
        many as the table holds past *cap*: the kernel is to be asked to drop their names
        (they leave the idle order; a lookup brings one back)."""
        out: list[Inode] = []
        while len(self.by_ino) - len(out) > cap and self._idle:
            ino, _ = self._idle.popitem(last=False)
            node = self.by_ino.get(ino)
            if node is not None and node.name is not None and node.handles == 0:
                out.append(node)
        return out

    def get(self, ino: int) -> Inode:
        node = self.by_ino.get(ino)
        if node is None:
            raise FUSEError(errno.ENOENT)
        return node

    def bound(self, name: str) -> Inode | None:
        """The inode *name* resolves to now, if any."""
        return self.by_name.get(name)

    def new(self, name: str | None, is_dir: bool) -> Inode:
        """A fresh inode, bound to *name* (detaching what it was bound to) unless None."""
        node = Inode(self._next, None, is_dir)
        self._next += 1
        self.by_ino[node.ino] = node
        if name is not None:
            self.bind(node, name)
        return node

    def bind(self, node: Inode, name: str) -> None:
        """Make *name* resolve to *node* (detaching the inode it resolved to)."""
        old = self.by_name.get(name)
        if old is node:
            return
        if old is not None:
            self.detach(name)
        if node.name is not None and self.by_name.get(node.name) is node:
            del self.by_name[node.name]
        node.name = name
        self.by_name[name] = node

    def directory(self, name: str) -> Inode:
        """The inode of directory *name* (a name that held a file gets a new one)."""
        node = self.by_name.get(name)
        if node is not None and node.is_dir:
            return node
        return self.new(name, True)

    def sealed(self, name: str, checksum: int, size: int, created: float) -> Inode:
        """The inode of the sealed version (*checksum*, *size*) of *name*: the bound one
        when it shows that version, else a fresh one (the old is detached)."""
        node = self.by_name.get(name)
        if node is not None and node.shows(checksum, size):
            return node
        node = self.new(name, False)
        node.checksum, node.size, node.mtime = checksum, size, created
        return node

    def detach(self, name: str) -> Inode | None:
        """Unbind *name* from its inode (its block was replaced or removed)."""
        node = self.by_name.pop(name, None)
        if node is None:
            return None
        node.name = None
        node.was = name
        self._collect(node)
        return node

    def move(self, old: str, new: str) -> None:
        """*old*'s inode now answers to *new* (a rename); *new*'s inode is detached."""
        node = self.by_name.get(old)
        self.detach(new)
        if node is not None:
            del self.by_name[old]
            node.name = new
            self.by_name[new] = node

    def looked_up(self, node: Inode) -> None:
        node.nlookup += 1
        if not node.is_dir and node.handles == 0:
            self._idle[node.ino] = None
            self._idle.move_to_end(node.ino)

    def forget(self, ino: int, n: int) -> None:
        node = self.by_ino.get(ino)
        if node is None or ino == ROOT_INODE:
            return
        node.nlookup -= n
        if node.nlookup < 0:  # pragma: no cover - would be a kernel or bookkeeping bug
            log.error("inode %d forgotten more often than looked up", ino)
            node.nlookup = 0
        self._collect(node)

    def opened(self, node: Inode) -> None:
        node.handles += 1
        self._idle.pop(node.ino, None)

    def closed(self, node: Inode) -> None:
        node.handles -= 1
        self._collect(node)
        if node.handles == 0 and node.nlookup and not node.is_dir and node.ino in self.by_ino:
            self._idle[node.ino] = None

    def _collect(self, node: Inode) -> None:
        if node.nlookup == 0 and node.handles == 0 and node.ino != ROOT_INODE:
            self.by_ino.pop(node.ino, None)
            self._idle.pop(node.ino, None)
            if node.name is not None and self.by_name.get(node.name) is node:
                del self.by_name[node.name]
