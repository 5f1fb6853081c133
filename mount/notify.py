"""Telling the kernel to drop what it cached: a name's entry, an inode's attributes.

A name whose block changed (a seal here, a new version seen from another node, a
removal) is detached from its inode (docs/mount-internals.md); the kernel is told to
forget its entry so that the next path walk looks the name up again. The notifications
run in threads started from the daemon's nursery, never inside a handler: the kernel may
make them wait for a request on the same directory that is in flight.
"""

from __future__ import annotations

import logging

import pyfuse3
import trio

from .inodes import InodeTable

__all__ = ["KernelNotices"]

log = logging.getLogger("kvfs.mount.notify")


class KernelNotices:
    """Kernel cache invalidations, in the background of the nursery :meth:`attach` gives."""

    def __init__(self, inodes: InodeTable) -> None:
        self.inodes = inodes
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def entry(self, name: str) -> None:
        """Make the kernel drop its dentry of *name*."""
        parent, _, base = name.rpartition("/")
        pnode = self.inodes.bound(parent)
        if pnode is None or self._nursery is None:
            return
        pino = pnode.ino

        def notify() -> None:
            try:
                pyfuse3.invalidate_entry(pino, base.encode())
            except OSError as exc:  # the kernel may have dropped it already
                log.debug("invalidate_entry(%s) failed: %s", name, exc)

        self._nursery.start_soon(trio.to_thread.run_sync, notify)

    def shed(self, cap: int) -> None:
        """When the inode table holds more than *cap* inodes, ask the kernel to drop the
        names of the idlest files, down to 7/8 of *cap* (their inodes go when it forgets them)."""
        if len(self.inodes) > cap:
            self.entries([n.name for n in self.inodes.idle_over(cap * 7 // 8) if n.name is not None])

    def entries(self, names: list[str]) -> None:
        """Make the kernel drop its dentries of *names*, in one background thread."""
        todo = []
        for name in names:
            parent, _, base = name.rpartition("/")
            pnode = self.inodes.bound(parent)
            if pnode is not None:
                todo.append((pnode.ino, base.encode(), name))
        if not todo or self._nursery is None:
            return

        def notify() -> None:
            for pino, base, name in todo:
                try:
                    pyfuse3.invalidate_entry(pino, base)
                except OSError as exc:  # the kernel may have dropped it already
                    log.debug("invalidate_entry(%s) failed: %s", name, exc)

        self._nursery.start_soon(trio.to_thread.run_sync, notify)

    async def entries_now(self, names: list[str]) -> None:
        """Make the kernel drop its dentries of *names* and of the directories leading to
        them (a miss it cached — of the block, or of a directory the change created — or
        an older version's inode) and return once it has: for changes made outside the
        mount, whose maker answers only after this. Components under a directory the
        kernel never looked up have nothing to drop and cost nothing."""
        todo = []
        seen: set[str] = set()
        for name in names:
            path = ""
            for base in name.split("/"):
                parent, path = path, f"{path}/{base}" if path else base
                if path in seen:
                    continue
                seen.add(path)
                pnode = self.inodes.bound(parent)
                if pnode is None:
                    break  # the kernel knows nothing below an unknown directory
                if self.inodes.bound(path) is None or path == name:
                    todo.append((pnode.ino, base.encode(), path))
        if not todo:
            return

        def notify() -> None:
            for pino, base, name in todo:
                try:
                    pyfuse3.invalidate_entry(pino, base)
                except OSError as exc:  # the kernel may have dropped it already
                    log.debug("invalidate_entry(%s) failed: %s", name, exc)

        await trio.to_thread.run_sync(notify)

    def attrs(self, ino: int) -> None:
        """Make the kernel ask for *ino*'s attributes again."""
        if self._nursery is None:
            return

        def notify() -> None:
            try:
                pyfuse3.invalidate_inode(ino, attr_only=True)
            except OSError as exc:
                log.debug("invalidate_inode(%d) failed: %s", ino, exc)

        self._nursery.start_soon(trio.to_thread.run_sync, notify)
