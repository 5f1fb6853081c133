"""S3-FIFO over the leaves of prefix chains."""

from __future__ import annotations

from .chains import ChainIndex
from .s3fifo import _MAIN, S3FIFO

__all__ = ["PrefixS3FIFO"]


class PrefixS3FIFO(S3FIFO):
    """S3-FIFO whose victims are always leaves of prefix chains.

    A block with a resident child is held outside the FIFOs and keeps its hit counter; it
    counts against the main FIFO's share whichever FIFO it came from, because its children
    use it (counting it against the small FIFO drains a new chain through the small FIFO
    at once: the replays lost a third of LRU's hits that way). When its last child leaves
    it goes back to the old end of the FIFO it came from, so it is the next candidate
    there and its counter decides, as usual, whether it is kept. Frequency filtering of
    S3-FIFO (blocks used once leave through the small FIFO) and leaf-first order together.
    Amortized O(1).
    """

    name = "prefix-s3fifo"

    def __init__(self) -> None:
        super().__init__()
        self._chains = ChainIndex()
        self._held: dict = {}  # inner block -> the queue it came from

    def _hold(self, key) -> None:
        q = self._where.pop(key)
        del self._queues[q][key]
        self._held[key] = q

    def _size(self, queue: int) -> int:
        if queue == _MAIN:
            return len(self._queues[_MAIN]) + len(self._held)
        return len(self._queues[queue])

    def insert(self, key, size: int = 0, parent=None) -> None:
        if key in self._where or key in self._held:
            self.touch(key)
            return
        super().insert(key, size, parent)
        p = self._chains.add(key, parent)
        if p is not None and p in self._where:
            self._hold(p)
        if not self._chains.is_leaf(key):
            self._hold(key)

    def remove(self, key) -> None:
        if self._held.pop(key, None) is not None:
            del self._freq[key]
        elif key in self._where:
            super().remove(key)
        else:
            return
        p = self._chains.drop(key)
        if p is not None and p in self._held:
            q = self._held.pop(p)
            self._queues[q][p] = None
            self._queues[q].move_to_end(p, last=False)
            self._where[p] = q

    def victim(self):
        key = super().victim()
        if key is None and self._held:
            # Only a cycle of parents (never from a hash chain) leaves no leaf: fall back.
            return next(iter(self._held))
        return key

    def __len__(self) -> int:
        return len(self._where) + len(self._held)

    def __contains__(self, key) -> bool:
        return key in self._where or key in self._held
