"""This node's NIXL agent for the peer tier: the DRAM arena and the landing buffers.

One agent per daemon (``kvfs.mount.cluster``), a :class:`kvfs.nixl.Agent` with the UCX
backend and a progress thread (over TCP the serving side's progress thread is what
moves the bytes, so it must run; it sleeps on UCX's event descriptors, so an idle
daemon uses no CPU). Registered with it:

- the **arena**, mapped a second time here (``DramTier.share``; the tier's own mapping
  is never exported): peers read blocks from it (a one-sided NIXL read at the address an
  offer names), and this node's blocks are served from it;
- the **landing buffers** (:class:`Landing`): one per peer connection at a time, each
  ``[cluster] landing`` bytes. A peer writes a block it serves straight into the
  buffer the request named (one round trip instead of an offer and a read); the bytes
  are then copied into an extent of the arena reserved for them and checked there. A
  peer never writes into the arena: a late write (a transfer the peer could not cancel)
  lands in a landing buffer at worst, where the check of the arena copy catches it.

UCX's own settings come from the environment; ``ucx_tls`` sets ``UCX_TLS``, and when it
names no RDMA transport UCX's InfiniBand module is not loaded (``UCX_MODULES=^ib``, unless
set), so the daemon exits as any process (:func:`kvfs.nixl.leave`).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable

from kvfs.errors import TierUnavailable
from kvfs.nixl import Agent, TransferFailed, TransferStuck, tcp_only_modules
from kvfs.peers import PeerReadAbandoned

__all__ = ["QUARANTINE", "Landing", "NixlAgent"]

log = logging.getLogger("kvfs.peers")

_PROGRESS_WAIT = 0.1  # seconds the UCX progress thread sleeps at most when nothing happens
QUARANTINE = 30.0  # seconds a landing buffer rests after a transfer into it was abandoned


def _address_of(buf: mmap.mmap) -> tuple[ctypes.c_char, int]:
    anchor = ctypes.c_char.from_buffer(buf)  # keeps the mapping from being closed under NIXL
    return anchor, ctypes.addressof(anchor)


class Landing:
    """*count* landing buffers of *size* bytes in one mapping at *base* (see the module
    doc). :meth:`take` one for a request, :meth:`give` it back after; a buffer whose
    request was abandoned (the peer may still write into it) rests ``QUARANTINE``
    seconds before it is taken again. Thread-safe."""

    def __init__(self, size: int, count: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.count = count
        self.clock = clock
        self._map = mmap.mmap(-1, max(size * count, mmap.PAGESIZE))
        self._anchor, self.base = _address_of(self._map)
        self.view = memoryview(self._map)
        self._free = list(range(count))
        self._resting: list[tuple[float, int]] = []
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """A free buffer's address, or None when every buffer is in use."""
        now = self.clock()
        with self._lock:
            while self._resting and self._resting[0][0] <= now:
                self._free.append(self._resting.pop(0)[1])
            if not self._free or not self.size:
                return None
            return self.base + self._free.pop() * self.size

    def _index(self, address: int) -> int:
        i, off = divmod(address - self.base, self.size)
        if off or not 0 <= i < self.count:
            raise ValueError(f"{address:#x} is not a landing buffer")
        return i

    def give(self, address: int, *, abandoned: bool = False) -> None:
        i = self._index(address)
        with self._lock:
            if abandoned:
                self._resting.append((self.clock() + QUARANTINE, i))
            else:
                self._free.append(i)

    def bytes(self, address: int, length: int) -> memoryview:
        """The first *length* bytes of the buffer at *address*."""
        i = self._index(address)
        return self.view[i * self.size : i * self.size + length]

    def close(self) -> None:
        self.view.release()
        del self._anchor
        self._map.close()


class NixlAgent:
    """This node's agent named *name* over the arena in *arena_fd* (*size* bytes, mapped
    here read-write), with *landing* buffers of ``landing.size`` bytes; *ucx_tls* sets
    ``UCX_TLS`` first. :class:`kvfs.nixl.NixlUnavailable` when NIXL or UCX cannot start."""

    def __init__(self, name: str, arena_fd: int, size: int, landing: Landing, *, ucx_tls: str | None = None) -> None:
        if ucx_tls:
            os.environ["UCX_TLS"] = ucx_tls
            if tcp_only_modules(ucx_tls):
                os.environ.setdefault("UCX_MODULES", "^ib")
        self.name = name
        self.size = size
        self.landing = landing
        self._map = mmap.mmap(arena_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._anchor, self.base = _address_of(self._map)
        self._view = memoryview(self._map)
        self._agent = Agent(name, progress_thread=True, progress_wait=_PROGRESS_WAIT)
        self._ucx = self._agent.backend("UCX")
        self._regs = [self._agent.register("DRAM", [(self.base, size, 0)], self._ucx)]
        if landing.size:
            self._regs.append(
                self._agent.register("DRAM", [(landing.base, landing.size * landing.count, 0)], self._ucx)
            )
        self.metadata = self._agent.metadata

    def connect(self, metadata: bytes) -> str:
        """Load a peer's metadata; returns its agent name. :class:`TierUnavailable` on failure."""
        try:
            return self._agent.connect(metadata)
        except TransferFailed as exc:
            raise TierUnavailable(str(exc)) from None

    def forget(self, remote: str) -> None:
        self._agent.forget(remote)

    def _check(self, offset: int, length: int) -> None:
        if not 0 <= offset <= self.size - length:
            raise ValueError(f"extent {offset}+{length} is outside the arena of {self.size} bytes")

    def read(self, remote: str, offset: int, address: int, length: int, timeout: float) -> None:
        """Read *length* bytes at *address* of agent *remote* into this arena at *offset*,
        within *timeout* seconds: :class:`TierUnavailable` when it failed or timed out and
        was cancelled, :class:`PeerReadAbandoned` when it could not be cancelled."""
        self._check(offset, length)
        if length == 0:
            return
        try:
            self._agent.transfer(
                "READ",
                [(self.base + offset, length, 0)],
                [(address, length, 0)],
                backend=self._ucx,
                timeout=timeout,
                agent=remote,
            )
        except TransferStuck as exc:
            raise PeerReadAbandoned(str(exc)) from None
        except TransferFailed as exc:
            raise TierUnavailable(str(exc)) from None

    def write(self, remote: str, offset: int, address: int, length: int, timeout: float) -> None:
        """Write *length* bytes of this arena at *offset* to *address* of agent *remote*
        (a landing buffer of the asking node) within *timeout* seconds: returns once they
        are there; :class:`TierUnavailable` when the transfer failed (cancelled or not:
        the asker never trusts a landing buffer's bytes before checking them)."""
        self._check(offset, length)
        if length == 0:
            return
        try:
            self._agent.transfer(
                "WRITE",
                [(self.base + offset, length, 0)],
                [(address, length, 0)],
                backend=self._ucx,
                timeout=timeout,
                agent=remote,
            )
        except TransferFailed as exc:
            raise TierUnavailable(str(exc)) from None

    def place(self, address: int, length: int, offset: int) -> None:
        """Copy *length* bytes of the landing buffer at *address* into this arena at *offset*."""
        self._check(offset, length)
        self._view[offset : offset + length] = self.landing.bytes(address, length)

    def close(self) -> None:
        """Deregister the memory; the agent itself lives until the process leaves."""
        for reg in self._regs:
            self._agent.deregister(reg)
