"""What ``stat`` says: the attributes the mount replies with, per inode.

Sealed blocks are ``-rw-r--r--`` with their true size and a fixed mtime (the version's
creation: a changing mtime would make the kernel drop the pages it cached from the
writes); their attributes may be cached long (``attr_timeout``), since a new version is a
new inode. Files being written show the size written so far, and directories and files
being written are cached only for ``entry_timeout``. Owner, group and mode come from the
rule that decides for the name (:meth:`kvfs.namespaces.Namespaces.rule`): under a
namespace with an access rule its directories show the rule's owner, group and mode, its
blocks the same owner and group and the mode's read and write bits
(:func:`kvfs.access.mode_of`); everywhere else the mount's default rule, the mounting
user's ``0755`` (blocks ``0644``). So with ``default_permissions`` the kernel's checks
are the rule's, the same the client socket asks. docs/SEMANTICS.md, lines 1 and 38.
"""

from __future__ import annotations

import time

import pyfuse3

from kvfs.access import AccessRule, mode_of
from kvfs.namespaces import Namespaces
from kvfs.stats import StoreStatistics

from .inodes import Inode
from .options import FsOptions

__all__ = ["Attributes"]


class Attributes:
    """Builds the replies; *negative_timeout*: how long the kernel may cache a miss;
    *sealed_entry_timeout*: the name of a sealed block (default ``entry_timeout``);
    *namespaces*: the store's, whose access rules set owners and modes under them."""

    def __init__(
        self,
        options: FsOptions,
        *,
        negative_timeout: float,
        sealed_entry_timeout: float | None = None,
        namespaces: Namespaces | None = None,
    ) -> None:
        self.options = options
        self.negative_timeout = negative_timeout
        self.sealed_entry_timeout = options.entry_timeout if sealed_entry_timeout is None else sealed_entry_timeout
        self.namespaces = namespaces if namespaces is not None else Namespaces()
        self.started = time.time()

    def rule(self, name: str | None) -> AccessRule:
        """The access rule that decides for *name* (:meth:`Namespaces.rule`: its
        namespace's, else the mount's default, the mounting user's ``0755``)."""
        return self.namespaces.rule(name)

    def owner(self, name: str | None) -> tuple[int, int]:
        """``(uid, gid)`` the mount reports for *name*."""
        rule = self.rule(name)
        return rule.uid, rule.gid

    def of(self, node: Inode, atime: float | None = None) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        if node.is_dir:
            a.st_nlink = 1  # "unknown": find(1) must not assume leaf directories
            a.st_size = 0
            mtime = self.started
            a.entry_timeout = self.options.entry_timeout
            a.attr_timeout = self.options.entry_timeout
        else:
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
                if node.name is not None:  # its name: until the daemon says it changed
                    a.entry_timeout = self.sealed_entry_timeout
        rule = self.rule(node.name if node.name is not None else node.was)
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

    @staticmethod
    def statfs(s: StoreStatistics, *, namemax: int) -> pyfuse3.StatvfsData:
        """What ``statfs`` (``df``) says: the bounded tiers' capacity and the part not used
        (their ``used`` counts dropped copies readers still hold: that room is not free),
        in 4 KiB units."""
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
        st.f_namemax = namemax
        return st

    def negative(self) -> pyfuse3.EntryAttributes:
        """A miss the kernel may cache (``st_ino`` 0) for the negative timeout."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = 0
        a.entry_timeout = self.negative_timeout
        return a
