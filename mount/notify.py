"""Telling the kernel to drop what it cached: a name's entry, an inode's attributes.

A name whose block changed (a seal here, a new version seen from another node, a
removal) is detached from its inode (docs/mount-internals.md); the kernel is told to
forget its entry so that the next path walk looks the name up again. The notifications
run in threads (:meth:`kvfs.mount.workers.Workers.kernel`, the kind it is handed) started
from the daemon's nursery, never inside a handler: the kernel may make them wait for a
request on the same directory that is in flight.
"""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from .inodes import InodeTable
from .workers import Offload

__all__ = ["KernelNotices", "Notifier"]

log = logging.getLogger("kvfs.mount.notify")


class Notifier(Protocol):
    """Where the notifications go: the mount's transport (:mod:`kvfs.mount.transport`)."""

    def invalidate_entry(self, parent: int, name: bytes) -> None: ...

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None: ...

    def notify_store(self, ino: int, offset: int, data: bytes) -> None: ...


class KernelNotices:
    """Kernel cache invalidations, in the background of the nursery :meth:`attach` gives,
    sent through the transport it gives, each in a thread *run* gives (``Workers.kernel``)."""

    def __init__(self, inodes: InodeTable, run: Offload) -> None:
        self.inodes = inodes
        self._run = run
        self._nursery: trio.Nursery | None = None
        self._notifier: Notifier | None = None

    def attach(self, nursery: trio.Nursery, notifier: Notifier) -> None:
        self._nursery = nursery
        self._notifier = notifier

    def entry(self, name: str) -> None:
        """Make the kernel drop its dentry of *name*."""
        self.entries([name])

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
        if todo and self._nursery is not None and self._notifier is not None:
            self._nursery.start_soon(self._run, _invalidate, self._notifier, todo)

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
        if todo and self._notifier is not None:
            await self._run(_invalidate, self._notifier, todo)

    def attrs(self, ino: int) -> None:
        """Make the kernel ask for *ino*'s attributes again."""
        if self._nursery is None or self._notifier is None:
            return
        notifier = self._notifier

        def notify() -> None:
            try:
                notifier.invalidate_inode(ino, attr_only=True)
            except OSError as exc:
                log.debug("invalidate_inode(%d) failed: %s", ino, exc)

        self._nursery.start_soon(self._run, notify)

    def store(self, ino: int, pages: list[tuple[int, bytes]]) -> None:
        """Put *pages* (offset, bytes) of *ino* in the kernel's page cache: the pages a
        writer covered only in part, once its inode shows the sealed block, so that the
        first reads of it are page-cache hits too (the kernel keeps only pages a write
        covered whole)."""
        if self._nursery is None or self._notifier is None or not pages:
            return
        notifier = self._notifier

        def notify() -> None:
            for off, data in pages:
                try:
                    notifier.notify_store(ino, off, data)
                except OSError as exc:  # the kernel dropped the inode: nothing to fill
                    log.debug("notify_store(%d, %d) failed: %s", ino, off, exc)
                    return

        self._nursery.start_soon(self._run, notify)


def _invalidate(notifier: Notifier, todo: list[tuple[int, bytes, str]]) -> None:
    """Tell the kernel to drop each ``(parent inode, base name, name)`` entry of *todo*
    (in a worker thread: the kernel may make a notification wait for a request)."""
    for pino, base, name in todo:
        try:
            notifier.invalidate_entry(pino, base)
        except OSError as exc:  # the kernel may have dropped it already
            log.debug("invalidate_entry(%s) failed: %s", name, exc)
