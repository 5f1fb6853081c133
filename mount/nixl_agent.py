"""This node's NIXL agent for the peer tier: the DRAM arena and the landing buffers.

One agent per daemon (``kvfs.mount.cluster``), a :class:`kvfs.nixl.Agent` with the UCX
backend and a progress thread (over TCP the receiving side's progress thread is what
moves the bytes, so it must run; it sleeps on UCX's event descriptors, so an idle
daemon uses no CPU). Registered with it:

- the **arena**, mapped a second time here (``DramTier.share``; the tier's own mapping
  is never exported), registered only as the *source* of this node's writes to peers
  (NIXL moves bytes only from and to registered memory). Its registration is never
  described to anyone: what a peer gets (:meth:`NixlAgent.metadata_for`) names only the
  connection and that peer's own landing buffers, so no peer ever holds the arena's
  address or remote key, and this node never reads from a peer;
- the **landing buffers** (:class:`Landing`), a set of its own for each peer (a
  registration of its own: its own remote key). A peer serving a block writes it into
  the buffers the request named (in chunks when it is larger than one); the bytes are
  then copied into an extent of the arena reserved for them and checked there before
  anything is published. A late write (a transfer the peer could not cancel) lands in
  that peer's buffers at worst, where the check of the arena copy catches it.

What this does and does not protect against is in docs/cluster.md ("What a peer and the
network can do"): UCX itself takes a connected endpoint's word for the addresses it
writes and reads.

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
from collections.abc import Callable, Mapping, Sequence

from kvfs.errors import TierUnavailable, TransferFailed
from kvfs.nixl import Agent, Registration, tcp_only_modules

__all__ = ["QUARANTINE", "Landing", "NixlAgent"]

log = logging.getLogger("kvfs.peers")

_PROGRESS_WAIT = 0.1  # seconds the UCX progress thread sleeps at most when nothing happens
QUARANTINE = 30.0  # seconds a landing buffer rests after a transfer into it was abandoned


def _address_of(buf: mmap.mmap) -> tuple[ctypes.c_char, int]:
    anchor = ctypes.c_char.from_buffer(buf)  # keeps the mapping from being closed under NIXL
    return anchor, ctypes.addressof(anchor)


class Landing:
    """*count* landing buffers of *size* bytes in one mapping at *base*, for one peer
    (see the module doc). :meth:`take` one for a request (waiting for one until a
    deadline), :meth:`take_free` more without waiting, :meth:`give` them back after; a
    buffer whose request was abandoned (the peer may still write into it) rests
    ``QUARANTINE`` seconds before it is taken again. Thread-safe."""

    def __init__(self, size: int, count: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if size <= 0 or count <= 0:
            raise ValueError("landing buffers need a size and a count")
        self.size = size
        self.count = count
        self.clock = clock
        self._map = mmap.mmap(-1, size * count)
        self._anchor, self.base = _address_of(self._map)
        self.view = memoryview(self._map)
        self._free = list(range(count))
        self._resting: list[tuple[float, int]] = []
        self._cond = threading.Condition()

    def _wake(self, now: float) -> None:
        while self._resting and self._resting[0][0] <= now:
            self._free.append(self._resting.pop(0)[1])

    def take(self, deadline: float | None = None) -> int | None:
        """A free buffer's address, waiting until *deadline* (the clock's time; None: no
        wait) for one; None when every buffer stayed in use."""
        with self._cond:
            while True:
                now = self.clock()
                self._wake(now)
                if self._free:
                    return self.base + self._free.pop() * self.size
                if deadline is None or now >= deadline:
                    return None
                wait = deadline - now
                if self._resting:
                    wait = min(wait, self._resting[0][0] - now)
                self._cond.wait(max(wait, 0.0))

    def take_free(self, n: int) -> list[int]:
        """Up to *n* more free buffers, without waiting."""
        with self._cond:
            self._wake(self.clock())
            out: list[int] = []
            while self._free and len(out) < n:
                out.append(self.base + self._free.pop() * self.size)
            return out

    def _index(self, address: int) -> int:
        i, off = divmod(address - self.base, self.size)
        if off or not 0 <= i < self.count:
            raise ValueError(f"{address:#x} is not a landing buffer")
        return i

    def give(self, address: int, *, abandoned: bool = False) -> None:
        i = self._index(address)
        with self._cond:
            if abandoned:
                self._resting.append((self.clock() + QUARANTINE, i))
            else:
                self._free.append(i)
            self._cond.notify()

    def bytes(self, address: int, length: int) -> memoryview:
        """The first *length* bytes of the buffer at *address*."""
        i = self._index(address)
        if not 0 <= length <= self.size:
            raise ValueError(f"{length} bytes do not fit a landing buffer of {self.size}")
        return self.view[i * self.size : i * self.size + length]

    def close(self) -> None:
        self.view.release()
        del self._anchor
        self._map.close()


class NixlAgent:
    """This node's agent named *name* over the arena in *arena_fd* (*size* bytes, mapped
    here read-write), with a :class:`Landing` per peer in *landings*; *ucx_tls* sets
    ``UCX_TLS`` first. :class:`kvfs.errors.NixlUnavailable` when NIXL or UCX cannot start."""

    def __init__(
        self, name: str, arena_fd: int, size: int, landings: Mapping[str, Landing], *, ucx_tls: str | None = None
    ) -> None:
        if ucx_tls:
            os.environ["UCX_TLS"] = ucx_tls
            if tcp_only_modules(ucx_tls):
                os.environ.setdefault("UCX_MODULES", "^ib")
        self.name = name
        self.size = size
        self.landings = dict(landings)
        self._map = mmap.mmap(arena_fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._anchor, self.base = _address_of(self._map)
        self._view = memoryview(self._map)
        self._agent = Agent(name, progress_thread=True, progress_wait=_PROGRESS_WAIT)
        self._ucx = self._agent.backend("UCX")
        self._source = self._agent.register("DRAM", [(self.base, size, 0)], self._ucx)  # never described to a peer
        self._landing: dict[str, Registration] = {
            peer: self._agent.register("DRAM", [(lb.base, lb.size * lb.count, 0)], self._ucx)
            for peer, lb in self.landings.items()
        }
        self._metadata = {peer: self._agent.metadata_of([reg], self._ucx) for peer, reg in self._landing.items()}

    def metadata_for(self, peer: str) -> bytes:
        """What *peer* loads to write into this node: the connection and *peer*'s own
        landing buffers, nothing of the arena or of the other peers' buffers."""
        return self._metadata[peer]

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

    def write(self, remote: str, offset: int, length: int, dests: Sequence[int], room: int, timeout: float) -> None:
        """Write *length* bytes of this arena at *offset* into agent *remote*'s buffers at
        *dests*, *room* bytes into each in turn, within *timeout* seconds: returns once
        they are there (remote completion); :class:`TierUnavailable` when the transfer
        failed (cancelled or not: the asker never trusts a landing buffer's bytes before
        checking them). NIXL refuses a destination outside what *remote* described."""
        self._check(offset, length)
        if length == 0:
            return
        if room <= 0 or len(dests) * room < length:
            raise ValueError(f"{len(dests)} buffers of {room} bytes cannot hold {length} bytes")
        local, theirs = [], []
        for i, dest in enumerate(dests):
            n = min(room, length - i * room)
            if n <= 0:
                break
            local.append((self.base + offset + i * room, n, 0))
            theirs.append((dest, n, 0))
        try:
            self._agent.transfer("WRITE", local, theirs, backend=self._ucx, timeout=timeout, agent=remote)
        except TransferFailed as exc:
            raise TierUnavailable(str(exc)) from None

    def place(self, landing: Landing, address: int, length: int, offset: int) -> None:
        """Copy *length* bytes of *landing*'s buffer at *address* into this arena at *offset*."""
        self._check(offset, length)
        self._view[offset : offset + length] = landing.bytes(address, length)

    def close(self) -> None:
        """Deregister the memory; the agent itself lives until the process leaves."""
        for reg in [self._source, *self._landing.values()]:
            self._agent.deregister(reg)
