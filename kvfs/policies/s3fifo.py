"""S3-FIFO (Yang et al., SOSP'23): a small probation FIFO, a main FIFO and a ghost FIFO."""

from __future__ import annotations

from collections import OrderedDict

from .base import EvictionPolicy

__all__ = ["S3FIFO"]

_SMALL, _MAIN = 0, 1


class S3FIFO(EvictionPolicy):
    """Quick demotion of blocks used once; blocks hit while on probation are kept longer.

    New blocks enter the small FIFO (a tenth of the tier), or the main FIFO when their key
    is in the ghost FIFO (evicted from small recently). Each hit adds one to a counter
    capped at 3. ``victim`` takes from the small FIFO while it holds at least its share:
    its oldest block moves to main if it was hit, else it is the victim; otherwise from
    main, where a hit block goes back to the new end with its counter decreased. A block
    evicted from small is remembered in the ghost FIFO (as many keys as main holds).

    The policy is not told the tier's capacity: it takes the most blocks it has held at
    once (the tier is full when the store asks for a victim). ``victim`` only reorders; it
    is stable until the ``remove``. Amortized O(1) per operation.
    """

    name = "s3fifo"
    small_share = 0.1
    max_freq = 3

    def __init__(self) -> None:
        self._queues = (OrderedDict(), OrderedDict())  # key -> None, oldest first
        self._where: dict = {}  # key -> _SMALL | _MAIN
        self._freq: dict = {}
        self._ghost: OrderedDict = OrderedDict()
        self._high = 0  # most blocks held at once: the capacity estimate
        self._pending = None  # (key, queue) last returned by victim()

    def insert(self, key, size: int = 0, parent=None) -> None:
        if key in self._where:
            self.touch(key)
            return
        q = _MAIN if self._ghost.pop(key, None) is not None else _SMALL
        self._queues[q][key] = None
        self._where[key] = q
        self._freq[key] = 0
        n = len(self)
        self._high = max(self._high, n)

    def touch(self, key) -> None:
        f = self._freq.get(key)
        if f is not None and f < self.max_freq:
            self._freq[key] = f + 1

    def remove(self, key) -> None:
        q = self._where.pop(key, None)
        if q is None:
            return
        del self._queues[q][key]
        del self._freq[key]
        if self._pending is not None and self._pending[0] == key:
            if self._pending[1] == _SMALL:
                self._ghost[key] = None
                limit = max(self._size(_MAIN), 1)
                while len(self._ghost) > limit:
                    self._ghost.popitem(last=False)
            self._pending = None

    def _size(self, queue: int) -> int:
        """Blocks counted against *queue*'s share (subclasses hold some outside the queues)."""
        return len(self._queues[queue])

    def victim(self):
        small, main = self._queues
        freq = self._freq
        while small or main:
            if small and (self._size(_SMALL) >= self.small_share * self._high or not main):
                key = next(iter(small))
                if freq[key] > 0:
                    del small[key]
                    main[key] = None
                    self._where[key] = _MAIN
                    freq[key] = 0  # promotion consumes the hit
                    continue
                self._pending = (key, _SMALL)
                return key
            key = next(iter(main))
            if freq[key] > 0:
                main.move_to_end(key)
                freq[key] -= 1
                continue
            self._pending = (key, _MAIN)
            return key
        return None

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key) -> bool:
        return key in self._where
