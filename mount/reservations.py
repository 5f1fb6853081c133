"""Inodes set aside for the retry of an open the mount answered ``ESTALE``.

When an ``open`` reaches an inode that no longer shows what its name holds (a new version
was sealed, here or on another node), or an open for writing reaches a sealed block's
inode (a writer must not share the old readers' inode: docs/mount-internals.md), the
mount answers ``ESTALE`` and the kernel looks the name up again and retries the open —
once, in the same call, from the same thread. A :class:`Reservation` makes that one retry
enough: the retried lookup by that thread (``pid`` in the request) gets an inode set aside
for it, and the retried open gets what was set aside with it — for a reader, the block it
was about to read (a held :class:`~kvfs.tier.BlockRef`, so a version sealed in between
cannot bounce it again); for a writer, an inode of its own for the new version.

A reservation answers the lookups of its name from its thread until the open claims it,
or for ``hold`` seconds (its inode and block are then let go), or until an open by its
thread that is not its retry reaches it (the retry never came: the kernel refused it, say):
then it is given up at once, so the thread's next lookup finds the name's own inode.

The reserved inode has no name (nobody else is to reach it by one), but it reports the
attributes of the name it is for (``Inode.was``): under a namespace its owner, group and
mode, so that the kernel's permission check of the retry is the check the first open
passed (an inode reporting the mounting user's ``0644`` made a tenant's replace of its own
block ``EACCES``, and the reservation then answered its lookups with ``ESTALE``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvfs.tier import BlockRef

from .inodes import Inode, InodeTable

__all__ = ["Reservation", "Reservations"]


@dataclass(slots=True, eq=False)
class Reservation:
    name: str
    pid: int
    node: Inode
    expires: float
    ref: BlockRef | None = None
    """A reader's: the block the retried open reads. None: a writer's."""


class Reservations:
    """Reservations by ``(name, pid)`` until looked up, and by inode until opened."""

    def __init__(self, inodes: InodeTable, hold: float = 5.0) -> None:
        self.inodes = inodes
        self.hold = hold
        self._by_key: dict[tuple[str, int], Reservation] = {}
        self._by_ino: dict[int, Reservation] = {}

    def __bool__(self) -> bool:
        return bool(self._by_ino)

    def reserve(self, name: str, pid: int, *, ref: BlockRef | None = None, size: int = 0) -> Reservation:
        """Set a fresh inode aside for *pid*'s retry of an open of *name*: showing *ref*'s
        version (a reader's), or a file of *size* bytes about to be written (a writer's)."""
        self.expire()
        old = self._by_key.pop((name, pid), None)
        if old is not None:
            self._drop(old)
        node = self.inodes.new(None, False)
        node.was = name  # unbound, but the name's: its owner, group and mode are the name's rule's
        if ref is not None:
            node.checksum, node.size = ref.checksum, len(ref.data)
        else:
            node.size = size
        node.mtime = time.time()
        self.inodes.opened(node)  # held by the reservation until it is claimed or expires
        r = Reservation(name, pid, node, time.monotonic() + self.hold, ref)
        self._by_key[(name, pid)] = r
        self._by_ino[node.ino] = r
        return r

    def take(self, name: str, pid: int) -> Reservation | None:
        """The reservation for this lookup (the retry's: the kernel may look the name up
        twice on its way, revalidating its cached entry and then looking it up afresh)."""
        r = self._by_key.get((name, pid))
        if r is not None and r.expires <= time.monotonic():
            self.release(r)
            return None
        return r

    def for_inode(self, ino: int) -> Reservation | None:
        return self._by_ino.get(ino)

    def claim(self, r: Reservation) -> None:
        """The retried open takes *r*: nobody finds it any more. The caller opens its
        handle on the inode (taking ``ref`` if it wants it), then calls :meth:`done`."""
        self._by_key.pop((r.name, r.pid), None)
        self._by_ino.pop(r.node.ino, None)

    def done(self, r: Reservation) -> None:
        """End a claimed reservation's hold (and its block, unless the caller took it)."""
        if r.ref is not None:
            r.ref.release()
            r.ref = None
        self.inodes.closed(r.node)

    def release(self, r: Reservation) -> None:
        """Give *r* up (the open that came was not its retry)."""
        self._by_key.pop((r.name, r.pid), None)
        if self._by_ino.pop(r.node.ino, None) is not None:
            self._drop(r)

    def expire(self) -> None:
        now = time.monotonic()
        for r in [r for r in self._by_ino.values() if r.expires <= now]:
            self.release(r)

    def close(self) -> None:
        for r in list(self._by_ino.values()):
            self.release(r)

    def _drop(self, r: Reservation) -> None:
        self._by_ino.pop(r.node.ino, None)
        self.done(r)
