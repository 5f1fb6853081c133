"""The GPU agent's device-memory cache: hot blocks as tensors, a capacity in bytes, a kvfs
eviction policy, pins.

:class:`DeviceCache` maps block names to device tensors (uint8, one block each) with the
block's xxh3-64 checksum (the version it holds). Room for a new block is made by evicting
the policy's victims; pinned blocks are never evicted (they leave the policy while pinned,
as the store's tiers do). A block that cannot fit (larger than the capacity, or only
pinned blocks left to evict) is not cached; the caller still has its tensor.

Eviction drops the cache's reference: a tensor a caller still holds stays valid (torch
frees it when the last reference goes), so an evicted block is never overwritten under
its reader; its memory counts against the device until then, not against the cache.

Thread-safe; nothing under the lock does I/O or a device copy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kvfs.policies import EvictionPolicy, make_policy

__all__ = ["CacheStats", "DeviceCache", "Entry"]


@dataclass(slots=True)
class Entry:
    tensor: torch.Tensor
    checksum: int
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class CacheStats:
    blocks: int
    used: int
    capacity: int
    pinned: int
    hits: int
    misses: int
    evictions: int
    refused: int


class DeviceCache:
    """At most *capacity* bytes of blocks, evicted in the order of *policy* (a name from
    :data:`kvfs.policies.POLICIES` or an instance)."""

    def __init__(self, capacity: int, policy: str | EvictionPolicy = "lru") -> None:
        if capacity < 0:
            raise ValueError(f"the device cache's capacity must be >= 0 bytes (got {capacity})")
        self.capacity = capacity
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._entries: dict[str, Entry] = {}
        self._used = 0
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = self._refused = 0
        self._pins: set[str] = set()  # names pinned before (or while not) cached

    def get(self, name: str) -> Entry | None:
        """The cached block (counted as a hit and touched) or None (a miss)."""
        with self._lock:
            e = self._entries.get(name)
            if e is None:
                self._misses += 1
                return None
            self._hits += 1
            if not e.pinned:
                self.policy.touch(name)
            return e

    def peek(self, name: str) -> Entry | None:
        with self._lock:
            return self._entries.get(name)

    def put(self, name: str, tensor: torch.Tensor, checksum: int, parent: str | None = None) -> bool:
        """Cache *tensor* as block *name* (replacing an older copy), evicting to make room;
        False when it cannot fit (nothing evicted then)."""
        size = tensor.numel() * tensor.element_size()
        with self._lock:
            old = self._entries.get(name)
            freed = old.tensor.numel() * old.tensor.element_size() if old is not None else 0
            need = self._used - freed + size - self.capacity
            victims = self._victims(need, skip=name) if need > 0 else []
            if victims is None:
                self._refused += 1
                return False
            for v in victims:
                self._drop(v)
                self._evictions += 1
            if old is not None:
                self._drop(name)
            pinned = name in self._pins
            self._entries[name] = Entry(tensor, checksum, pinned)
            self._used += size
            if not pinned:
                self.policy.insert(name, size, parent)
            return True

    def _victims(self, need: int, skip: str) -> list[str] | None:
        """Names whose eviction frees at least *need* bytes, in the policy's order, or
        None if even evicting every unpinned block would not. Evicts nothing: the policy
        is told to forget them only once they are dropped."""
        evictable = sum(
            e.tensor.numel() * e.tensor.element_size() for n, e in self._entries.items() if not e.pinned and n != skip
        )
        if evictable < need:
            return None
        out: list[str] = []
        freed = 0
        removed: list[tuple[str, int]] = []
        while freed < need:
            v = self.policy.victim()
            if v is None:  # pragma: no cover - the sum above says there is enough
                break
            self.policy.remove(v)
            e = self._entries.get(v)
            if e is None or v == skip:
                if v == skip and e is not None:
                    removed.append((v, e.tensor.numel() * e.tensor.element_size()))
                continue
            out.append(v)
            freed += e.tensor.numel() * e.tensor.element_size()
        for v, size in removed:  # the block being replaced goes back in its place
            self.policy.insert(v, size)
        return out

    def _drop(self, name: str) -> None:
        e = self._entries.pop(name, None)
        if e is not None:
            self._used -= e.tensor.numel() * e.tensor.element_size()
            self.policy.remove(name)

    def remove(self, name: str) -> bool:
        """Forget *name* (a new version, a deletion); its pin stays."""
        with self._lock:
            present = name in self._entries
            self._drop(name)
            return present

    def pin(self, name: str) -> None:
        """Never evict *name* (now, or once it is cached) until :meth:`unpin`."""
        with self._lock:
            self._pins.add(name)
            e = self._entries.get(name)
            if e is not None and not e.pinned:
                e.pinned = True
                self.policy.remove(name)

    def unpin(self, name: str) -> None:
        with self._lock:
            self._pins.discard(name)
            e = self._entries.get(name)
            if e is not None and e.pinned:
                e.pinned = False
                self.policy.insert(name, e.tensor.numel() * e.tensor.element_size())

    def clear(self) -> None:
        with self._lock:
            for name in list(self._entries):
                self._drop(name)

    @property
    def used(self) -> int:
        return self._used

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._entries))

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                blocks=len(self._entries),
                used=self._used,
                capacity=self.capacity,
                pinned=sum(e.pinned for e in self._entries.values()),
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                refused=self._refused,
            )
