"""What ``stat`` says: the attributes the mount replies with, per inode.

Sealed blocks are ``-rw-r--r--`` with their true size and a fixed mtime (the version's
creation: a changing mtime would make the kernel drop the pages it cached from the
writes); their attributes may be cached long (``attr_timeout``), since a new version is a
new inode. Files being written show the size written so far, and directories and files
being written are cached only for ``entry_timeout``. Owners follow the mounting user,
except under a namespace with an access rule: its directories show the rule's owner,
group and mode, its blocks the same owner and group and the mode's read and write bits
(:func:`kvfs.access.mode_of`), so that with ``default_permissions`` the kernel's checks
are the rule's. docs/SEMANTICS.md, lines 1 and 38.
"""

from __future__ import annotations

import stat as stat_mod
import time

import pyfuse3

from kvfs.access import AccessRule, mode_of
from kvfs.namespaces import Namespaces

from .inodes import Inode
from .options import FsOptions

__all__ = ["Attributes"]


class Attributes:
    """Builds the replies; *negative_timeout*: how long the kernel may cache a miss;
    *namespaces*: the store's, whose access rules set owners and modes under them."""

    def __init__(self, options: FsOptions, *, negative_timeout: float, namespaces: Namespaces | None = None) -> None:
        self.options = options
        self.negative_timeout = negative_timeout
        self.namespaces = namespaces if namespaces is not None else Namespaces()
        self.started = time.time()

    def rule(self, name: str | None) -> AccessRule | None:
        """The access rule over the name *name* (None: none, or no name)."""
        if not name or not self.namespaces:
            return None
        ns = self.namespaces.of(name)
        return None if ns is None else ns.access

    def owner(self, name: str | None) -> tuple[int, int]:
        """``(uid, gid)`` the mount reports for *name*."""
        rule = self.rule(name)
        return (self.options.uid, self.options.gid) if rule is None else (rule.uid, rule.gid)

    def of(self, node: Inode, atime: float | None = None) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        if node.is_dir:
            a.st_mode = stat_mod.S_IFDIR | 0o755
            a.st_nlink = 1  # "unknown": find(1) must not assume leaf directories
            a.st_size = 0
            mtime = self.started
            a.entry_timeout = self.options.entry_timeout
            a.attr_timeout = self.options.entry_timeout
        else:
            a.st_mode = stat_mod.S_IFREG | 0o644
            a.st_nlink = 1 if node.name is not None or node.version is not None else 0
            mtime = node.mtime
            v = node.version
            a.entry_timeout = self.options.entry_timeout
            if v is not None:  # being written: the size so far
                a.st_size = v.size
                a.attr_timeout = self.options.entry_timeout
            else:  # a sealed version: its attributes never change
                a.st_size = node.size
                a.attr_timeout = self.options.attr_timeout
        rule = self.rule(node.name if node.name is not None else node.was)
        if rule is None:
            a.st_uid = self.options.uid
            a.st_gid = self.options.gid
        else:
            a.st_uid, a.st_gid = rule.uid, rule.gid
            a.st_mode = mode_of(rule, is_dir=node.is_dir)
        a.st_rdev = 0
        a.st_blksize = 1 << 20
        a.st_blocks = (a.st_size + 511) // 512
        mt = int(mtime * 1e9)
        a.st_mtime_ns = mt
        a.st_ctime_ns = mt
        a.st_atime_ns = int(atime * 1e9) if atime is not None else mt
        return a

    def negative(self) -> pyfuse3.EntryAttributes:
        """A miss the kernel may cache (``st_ino`` 0) for the negative timeout."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = 0
        a.entry_timeout = self.negative_timeout
        return a
