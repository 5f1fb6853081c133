"""A client session's private copy buffer: how a peer that may not map the DRAM arena
(a namespace's access rule keeps it from reading every block the arena holds,
``Store.may_map_arena``) still moves blocks without their bytes crossing the socket.

At ``hello`` the daemon makes one anonymous shared-memory file per such session
(``memfd_create``, sized by ``[client] copy_buffer``), maps it, and hands the client a
read-write descriptor of it instead of the arena's. Extents of it are slots:

- a lease copies the block out of its DRAM extent (or block file) into a slot and checks
  the copy against the block's checksum before the grant (kind ``"copy"``) points there;
- a reservation pairs an arena extent, which only the daemon can reach, with a slot the
  client writes; at commit the daemon copies the slot into the extent and the store
  verifies the extent's bytes, so bytes the client changes after the check never land;
- a slot is free again when its lease is released (or found ended) or its reservation
  committed or aborted, and the whole buffer goes when the session ends, however it ends.

The file is sealed against shrinking and growing (``F_SEAL_SHRINK``, ``F_SEAL_GROW``): a
client that truncated it would make the daemon's next copy fault (``SIGBUS``).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading

from kvfs.allocator import ExtentAllocator

__all__ = ["CopyBuffer"]

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class CopyBuffer:
    """*size* bytes of shared memory for one session (see the module doc). Thread-safe:
    slots are taken and given back from worker threads and the loop."""

    def __init__(self, size: int) -> None:
        self._alloc = ExtentAllocator(size)
        self.size = self._alloc.size
        if self.size <= 0:
            raise ValueError(f"a copy buffer needs at least 4 KiB (got {size} bytes)")
        self._fd = os.memfd_create("kvfs-copy", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self._fd, self.size)
            fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, _SEALS)
            self._mm = mmap.mmap(self._fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self._fd)
            raise
        self._view = memoryview(self._mm)
        self._lock = threading.Lock()
        self._slots: dict[int, int] = {}  # offset -> rounded length

    def share(self) -> int:
        """A new read-write descriptor of the buffer, for the client (SCM_RIGHTS)."""
        return os.dup(self._fd)

    @property
    def used(self) -> int:
        """Bytes held by slots (rounded to 4 KiB each)."""
        return self._alloc.allocated

    def take(self, n: int) -> int | None:
        """A slot of *n* bytes: its offset, or None when the buffer has no room for it."""
        with self._lock:
            off = self._alloc.alloc(n)
            if off is not None:
                self._slots[off] = self._alloc.round(n)
            return off

    def give_back(self, off: int) -> None:
        """Free the slot at *off* (a slot given back twice is ignored)."""
        with self._lock:
            length = self._slots.pop(off, None)
            if length is not None:
                self._alloc.free(off, length)

    def view(self, off: int, n: int) -> memoryview:
        """The *n* bytes at *off* (the client may write them at any moment)."""
        return self._view[off : off + n]

    def close(self) -> None:
        """Unmap and close it; the memory goes when the client's mapping goes too."""
        with self._lock:
            self._slots.clear()
            self._view.release()
            try:
                self._mm.close()
            except BufferError:  # a copy still holds a slice: unmapped when it goes
                pass
            os.close(self._fd)
