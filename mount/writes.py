"""The write lifecycle: files being written (versions), their handles, bounds and seals.

A :class:`Version` is one file being written: a sparse :class:`~kvfs.mount.buffer.WriteBuffer`,
the name it will be published under (it follows renames; None once unlinked), the write
handles open on it, and whether a write or ``ftruncate`` failed. :class:`Writes` keeps
every live version by name and by directory (O(1) to find), bounds their memory, and
runs the seal. The rules (docs/SEMANTICS.md, "Writing"; reasons in
docs/mount-internals.md):

- **A version is sealed when its last handle is released** (the kernel's RELEASE, sent
  once per open file after its last descriptor is closed, ``dup``s and forks included)
  and by ``fsync``. FLUSH (every ``close`` of any descriptor) seals nothing: it cannot
  tell the last close from a duplicate's. It reports the version's error and marks it
  *closing* until the next write.
- **Close-to-open.** The kernel queues RELEASE before ``close`` returns, but the daemon
  may see a later request first. So any operation on a name waits (:meth:`Writes.settle`)
  while a version of that name is sealing, and up to ``release_wait`` seconds while one
  is closing (a FLUSH came and no write since): the RELEASE that follows a last close
  arrives within that; a duplicate's close is followed by more writes, which end the wait.
- **A failed write or ftruncate poisons the version**: it is never published (the name
  keeps its older block), and every later write, flush and fsync on it fails with the
  same errno, so ``close`` reports it.
- **Room is promised at every close** (FLUSH, which ``close`` waits for): the tier that
  will take the version's bytes holds room for them (``Store.promise``,
  :mod:`kvfs.promises`) until the seal at the last release uses it. No room in any tier
  (every tier full of pinned blocks, the block larger than DRAM with the disk full, the
  namespace at its quotas) fails that ``close`` with ``ENOSPC`` and poisons the version:
  nothing is accepted that a seal would later drop.
- **A writer killed by a signal publishes nothing**: a FLUSH sent while the task that
  opened that handle (or, where the transport knows it, the closing task) is dying of a
  signal (:mod:`kvfs.mount.dying`) poisons the version with ``ECANCELED``.
- **Bounded memory**: the chunks of every live version, plus the old blocks that
  versions opened without ``O_TRUNC`` start from, are charged against ``cap``; a write
  that would go past it waits for seals to free memory, then fails with ``ENOSPC``. A
  file may not grow past ``max_block`` (``EFBIG``).
- **Seals of one name run one at a time, in order**, so the last version released is
  the one the name ends with. A seal takes a snapshot of the buffer; writes that arrive
  while it runs (after an ``fsync``) make the version dirty again, and the final release
  seals them.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from pyfuse3 import FUSEError

from kvfs.errors import KvfsError
from kvfs.pieces import Pieces
from kvfs.store import BlockStat
from kvfs.tier import BlockRef

from .buffer import WriteBuffer
from .dying import closing_writer, killed_by
from .errnos import errno_of
from .inodes import Inode
from .opstats import OpStats

if TYPE_CHECKING:
    from kvfs.promises import Promise

__all__ = ["Version", "WriteHandle", "Writes", "default_write_buffer"]

log = logging.getLogger("kvfs.mount.writes")

MEMORY_WAIT = 5.0  # seconds a write waits for seals to free write-buffer memory before ENOSPC
PAGE = 4096
MAX_EDGES = 64  # partly written pages a version remembers (two per write at most)


def default_write_buffer() -> int:
    """``[mount] write_buffer = "auto"``: a quarter of physical memory, at least 64 MiB."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - every Linux has these
        mem = 8 << 30
    return max(mem // 4, 64 << 20)


@dataclass(slots=True, eq=False)
class Version:
    """One file being written. ``node`` is the inode its writes go through."""

    name: str | None
    node: Inode
    buffer: WriteBuffer
    base: BlockRef | None = None
    """The old block a version opened without O_TRUNC starts from (held until it ends)."""
    shares_inode: bool = False
    """Old readers or another version use ``node`` too: the seal must not take it over."""
    handles: int = 0
    changes: int = 1
    sealed_changes: int = 0
    error: int | None = None
    closing: bool = False
    sealing: bool = False
    ended: bool = False
    parent: str | None = None
    charged: int = 0
    settled: trio.Event | None = None
    """Made by a waiter; set (and dropped) when the version stops closing or sealing."""
    promise: Promise | None = None
    """The room held for its seal, promised at its last close (``Store.promise``)."""
    killed: int | None = None
    """The signal that killed a writer of it (its error is then ECANCELED)."""
    edges: set[int] | None = None
    """Pages a write covered only in part (the kernel does not keep those as read), to
    store in the kernel's page cache when the version's inode becomes the block's; None
    past :data:`MAX_EDGES` (then the kernel reads them through the daemon)."""

    def wrote(self, off: int, n: int) -> None:
        """Remember the pages the write of *n* bytes at *off* covered only in part."""
        edges = self.edges
        if edges is None or n <= 0:
            return
        first, last = off // PAGE, (off + n - 1) // PAGE
        if off % PAGE:
            edges.add(first)
        if (off + n) % PAGE:
            edges.add(last)
        if len(edges) > MAX_EDGES:
            self.edges = None

    @property
    def dirty(self) -> bool:
        return self.changes != self.sealed_changes

    @property
    def size(self) -> int:
        return self.buffer.size

    async def wait_settled(self) -> None:
        if self.settled is None:
            self.settled = trio.Event()
        await self.settled.wait()

    def _wake(self) -> None:
        if self.settled is not None:
            self.settled.set()
            self.settled = None


@dataclass(slots=True, eq=False)
class WriteHandle:
    """An open file handle (fh) on a version; *pid*: the task that opened it (the
    request's ``ctx.pid``), asked at each FLUSH whether it is dying of a signal."""

    node: Inode
    version: Version
    pid: int | None = None


Promiser = Callable[[str, int], Awaitable["Promise"]]
"""Room for *size* bytes of block *name* (``Store.promise``, off the loop as needed)."""


class Writes:
    """Every live version by name and directory; writes, bounds and seals (module doc).
    *promise* holds room for a version's seal (:data:`Promiser`) and *give_up* gives a
    promise back unused (``Store.give_up_promise``: never waits); without them no room is
    promised (a seal may then fail at the last release, logged)."""

    def __init__(
        self,
        *,
        cap: int,
        max_block: int,
        release_wait: float,
        opstats: OpStats | None = None,
        promise: Promiser | None = None,
        give_up: Callable[[Promise], None] | None = None,
    ) -> None:
        self.opstats = opstats if opstats is not None else OpStats()
        self._promise = promise
        self._give_up = give_up
        self.cap = cap
        self.max_block = max_block
        self.release_wait = release_wait
        self.used = 0
        self._by_name: dict[str, list[Version]] = {}
        self._by_dir: dict[str, dict[str, int]] = {}
        self._sealing: dict[str, deque[trio.Event]] = {}  # name -> seals waiting their turn
        self._freed: trio.Event | None = None

    # -- the registry --------------------------------------------------------------

    def start(self, name: str, node: Inode, *, base: BlockRef | None = None, shares_inode: bool = False) -> Version:
        """A new version of *name* written through *node* (from *base*'s bytes, if given)."""
        v = Version(name, node, WriteBuffer(base.data if base is not None else None), base, shares_inode, edges=set())
        if base is not None:
            v.charged = len(base.data)
            self.used += v.charged
        self._add(name, v)
        return v

    def _add(self, name: str, v: Version) -> None:
        self._by_name.setdefault(name, []).append(v)
        parent, _, base = name.rpartition("/")
        d = self._by_dir.setdefault(parent, {})
        d[base] = d.get(base, 0) + 1

    def _remove(self, name: str, v: Version) -> None:
        vs = self._by_name.get(name)
        if vs is None or v not in vs:
            return
        vs.remove(v)
        if not vs:
            del self._by_name[name]
        parent, _, base = name.rpartition("/")
        d = self._by_dir[parent]
        d[base] -= 1
        if not d[base]:
            del d[base]
            if not d:
                del self._by_dir[parent]

    def has(self, name: str) -> bool:
        return name in self._by_name

    @property
    def writing(self) -> bool:
        """Whether any file is being written (a batch of names has nothing to wait for when none is)."""
        return bool(self._by_name)

    def newest(self, name: str) -> Version | None:
        """The most recently started live version of *name*."""
        vs = self._by_name.get(name)
        return vs[-1] if vs else None

    def names_in(self, directory: str) -> list[str]:
        """Base names in *directory* that have a live version."""
        return list(self._by_dir.get(directory, ()))

    def rename(self, old: str, new: str) -> None:
        """Versions of *old* will be published as *new*; those of *new* lose their name
        (the rename unlinked the file they belong to)."""
        self.unlink(new)
        for v in self._by_name.get(old, [])[:]:
            self._remove(old, v)
            v.name = new
            self._add(new, v)

    def unlink(self, name: str) -> None:
        """Versions of *name* lose their name: writes still work, nothing is published."""
        for v in self._by_name.get(name, [])[:]:
            self._remove(name, v)
            v.name = None

    async def settle(self, name: str) -> None:
        """Wait while a version of *name* is sealing, or (at most ``release_wait`` seconds)
        closing: an operation on a name sees the seal of a file closed before it."""
        deadline = trio.current_time() + self.release_wait
        while True:
            vs = self._by_name.get(name)
            if not vs:
                return
            sealing = next((v for v in vs if v.sealing), None)
            if sealing is not None:
                await sealing.wait_settled()  # a seal always ends
                continue
            closing = next((v for v in vs if v.closing), None)
            if closing is None:
                return
            with trio.move_on_at(deadline) as scope:
                await closing.wait_settled()
            if scope.cancelled_caught:
                return

    # -- writing -------------------------------------------------------------------

    def _fail(self, v: Version, code: int) -> FUSEError:
        if v.error is None:
            v.error = code
            log.info("%s: a write failed (%s): the file will not be published", v.name, errno.errorcode.get(code))
        return FUSEError(code)

    async def write(self, v: Version, off: int, data: bytes) -> int:
        if v.error is not None:
            raise FUSEError(v.error)
        end = off + len(data)
        if end > self.max_block:
            raise self._fail(v, errno.EFBIG)
        await self._reserve(v, WriteBuffer.growth_bound(len(data)))
        v.buffer.write(off, data)
        v.wrote(off, len(data))
        self._recharge(v)
        v.changes += 1
        self._reopen(v)
        return len(data)

    async def truncate(self, v: Version, n: int) -> None:
        if v.error is not None:
            raise FUSEError(v.error)
        if n > self.max_block:
            raise self._fail(v, errno.EFBIG)
        v.buffer.truncate(n)
        self._recharge(v)
        v.changes += 1
        self._reopen(v)

    def _reopen(self, v: Version) -> None:
        if v.closing:  # a write after a flush: the close was a duplicate's, the file goes on
            v.closing = False
            v._wake()

    async def _reserve(self, v: Version, need: int) -> None:
        if self.used + need <= self.cap:
            return
        with trio.move_on_after(MEMORY_WAIT):
            while self.used + need > self.cap:
                if self._freed is None:
                    self._freed = trio.Event()
                await self._freed.wait()
        if self.used + need > self.cap:
            log.warning(
                "write buffers are full (%d of %d bytes in files being written); raise [mount] write_buffer",
                self.used,
                self.cap,
            )
            raise self._fail(v, errno.ENOSPC)

    def _recharge(self, v: Version) -> None:
        charge = v.buffer.allocated + (len(v.base.data) if v.base is not None else 0)
        self.used += charge - v.charged
        if charge < v.charged:
            self._wake_memory()
        v.charged = charge

    def _wake_memory(self) -> None:
        if self._freed is not None:
            self._freed.set()
            self._freed = None

    async def flush(self, h: WriteHandle, pid: int | None = None) -> None:
        """A descriptor of handle *h* was closed (by task *pid*, when the transport knows
        it; else by a holder of the handle *h.pid* opened): it may be the last close.
        Report the version's error; poison it if the closing writer is dying of a signal;
        else promise room for its seal, or fail with ``ENOSPC`` (module doc)."""
        v = h.version
        if v.error is not None:
            raise FUSEError(v.error)
        task = closing_writer(pid, h.pid)
        signal = killed_by(task) if task is not None else None
        if signal is not None:
            v.killed = signal
            log.info(
                "%s: its writer (task %d) was killed by signal %s; the file will not be published",
                v.name,
                task,
                signal or "?",
            )
            self._fail(v, errno.ECANCELED)
            self._forget_promise(v)
            return  # the dying task is not told: nobody reads its close's answer
        v.closing = True
        if self._promise is None or v.name is None or not v.dirty:
            return  # nothing will be published (unlinked), or it was published (fsync) as it is
        promised = v.promise
        if promised is not None and promised.state == "held" and promised.name == v.name and promised.size >= v.size:
            return
        name, size = v.name, v.size
        try:
            promised = await self._promise(name, size)
        except (KvfsError, OSError) as exc:
            if v.error is None:
                log.warning(
                    "%s (%d bytes): no room for its seal; its close fails, nothing is published: %s", name, size, exc
                )
            raise self._fail(v, errno_of(exc)) from None
        self._forget_promise(v)
        if v.ended:
            self._give_up_promise(promised)
            return
        v.promise = promised

    def _forget_promise(self, v: Version) -> None:
        if v.promise is not None:
            self._give_up_promise(v.promise)
            v.promise = None

    def _give_up_promise(self, promise: Promise) -> None:
        if self._give_up is not None:
            self._give_up(promise)

    # -- handles and the seal ------------------------------------------------------

    def opened(self, v: Version) -> None:
        v.handles += 1

    def released(self, v: Version) -> bool:
        """A handle of *v* was released; True when it was the last (seal, then end it)."""
        v.handles -= 1
        return v.handles == 0

    async def seal(
        self,
        v: Version,
        *,
        final: bool,
        put: Callable[[str, Pieces, str | None, Promise | None], Awaitable[BlockStat]],
        published: Callable[[Version, BlockStat, bool], None],
    ) -> BlockStat | None:
        """Publish *v*'s bytes with *put* if it changed since its last seal (``fsync``:
        *final* False; the last release: True, in the room promised at its last close,
        and the version ends). *published* runs before any waiter wakes. Returns the
        block's stat, or None when nothing was published (unchanged, unlinked, or failed:
        its error is raised for an fsync, logged and counted for the last release, where
        no caller is left to tell)."""
        if v.error is not None:
            if final:
                self.end(v)
                return None
            raise FUSEError(v.error)
        v.sealing = True
        v._wake()  # waiters on a closing version now wait for the seal itself
        key = v.name
        try:
            if key is not None:
                await self._take_turn(key)
            try:
                name = v.name  # a rename or unlink waits for this seal: the name cannot move now
                if name is None or not v.dirty:
                    return None
                changes = v.changes
                t0 = time.perf_counter()
                data = v.buffer.snapshot(final=final)
                try:
                    st = await put(name, data, v.parent, v.promise if final else None)
                except (KvfsError, OSError, FUSEError) as exc:
                    self.opstats.observe("seal", time.perf_counter() - t0, True)
                    if final:
                        log.error("%s: sealing at the last close failed; nothing was published: %s", name, exc)
                        return None
                    raise
                self.opstats.observe("seal", time.perf_counter() - t0, False)
                v.sealed_changes = changes
                published(v, st, final)
                return st
            finally:
                if key is not None:
                    self._pass_turn(key)
        finally:
            v.sealing = False
            if final:
                self.end(v)
            v._wake()

    async def _take_turn(self, name: str) -> None:
        """Wait until no other seal of *name* runs (first come, first served)."""
        queue = self._sealing.get(name)
        if queue is None:
            self._sealing[name] = deque()
            return
        turn = trio.Event()
        queue.append(turn)
        try:
            await turn.wait()
        except BaseException:
            if turn in queue:
                queue.remove(turn)
            elif turn.is_set():
                self._pass_turn(name)  # we were handed the turn as we were cancelled
            raise

    def _pass_turn(self, name: str) -> None:
        queue = self._sealing[name]
        if queue:
            queue.popleft().set()
        else:
            del self._sealing[name]

    def end(self, v: Version) -> None:
        """Forget *v*: its memory and base are released (after the last release, or at
        unmount for versions still open)."""
        if v.ended:
            return
        v.ended = True
        if v.name is not None:
            self._remove(v.name, v)
        v.buffer.release()
        self._forget_promise(v)  # kept by its seal, or given back unused
        if v.base is not None:
            v.base.release()
            v.base = None
        self.used -= v.charged
        v.charged = 0
        self._wake_memory()
        v._wake()

    def live(self) -> list[Version]:
        """Every live version (for unmount)."""
        return [v for vs in self._by_name.values() for v in vs]
