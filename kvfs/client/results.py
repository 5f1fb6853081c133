"""What the batch client's calls return: per-block results, holds and views on leased
copies, reservations to write into, event streams, and the batch error.

Holds and views end through the :class:`~kvfs.client.Client` that made them; a view's
bytes are read-only and valid only while its lease is (see docs/client.md, "Leases").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, Self

from kvfs.errors import KvfsError
from kvfs.events import Event
from kvfs.protocol import EventItem, Events, Grant, LeaseEnded, Slot, Subscribed

from . import buffers
from .connection import Connection

__all__ = [
    "BatchError",
    "BufferTooSmall",
    "EventStream",
    "Hold",
    "LookupResult",
    "Presence",
    "PutBuffer",
    "Read",
    "Releaser",
    "View",
]


class Releaser(Protocol):
    """What a :class:`Hold` ends through: the :class:`~kvfs.client.Client` that made it."""

    def release(self, holds: Sequence[Hold]) -> None: ...


class BufferTooSmall(KvfsError, ValueError):
    """A block is larger than the buffers given for it (nothing was copied)."""


class BatchError(KvfsError):
    """Raised by a batch call when some names failed; the others were done. ``results``
    holds, per name in order, the call's result or the :class:`KvfsError` it met;
    ``errors`` maps the failed positions to theirs; ``kinds`` counts the failures per
    error class. The message says all three in short::

        get_into: 2 of 3 blocks failed (BlockNotFound: 1, BlockCorrupt: 1); first, #0: BlockNotFound: m/ab/abcd
    """

    def __init__(self, what: str, results: list[Any]) -> None:
        self.results = results
        self.errors: dict[int, KvfsError] = {i: r for i, r in enumerate(results) if isinstance(r, KvfsError)}
        self.kinds: dict[str, int] = {}
        for e in self.errors.values():
            self.kinds[_kind(e)] = self.kinds.get(_kind(e), 0) + 1
        at, first = next(iter(self.errors.items()))
        counts = ", ".join(f"{k}: {n}" for k, n in sorted(self.kinds.items(), key=lambda kv: (-kv[1], kv[0])))
        super().__init__(
            f"{what}: {len(self.errors)} of {len(results)} blocks failed ({counts}); "
            f"first, #{at}: {_kind(first)}: {first}"
        )


def _kind(exc: KvfsError) -> str:
    """The error's class name, as the daemon named it when it crossed the socket."""
    remote = getattr(exc, "type", "")
    return remote if isinstance(remote, str) and remote else type(exc).__name__


class Read(NamedTuple):
    """One block :meth:`Client.read_into` read: *size* bytes from *tier*, out of the
    arena or a block file (*kind*), *verified* against its checksum or not (arena copies
    only with ``verify=True``; files always)."""

    size: int
    tier: str
    kind: str
    verified: bool


@dataclass(frozen=True, slots=True)
class Presence:
    """A present block: *size* bytes, the *tiers* holding a copy (hottest first), *pinned*."""

    name: str
    size: int
    tiers: tuple[str, ...]
    pinned: bool


class LookupResult(Sequence[Presence | None]):
    """Per name, in order: its :class:`Presence` or None; ``prefix`` is how many leading
    names are all present (the cached length of a chain). Built lazily from the reply."""

    def __init__(
        self,
        names: Sequence[str],
        sizes: list[int],
        masks: list[int],
        pinned: list[bool],
        tiers: list[str],
        prefix: int,
    ) -> None:
        self.names = list(names)
        self.sizes = sizes
        self._masks = masks
        self._pinned = pinned
        self._tiers = tiers
        self.prefix = prefix

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if self.sizes[i] < 0:
            return None
        mask = self._masks[i]
        tiers = tuple(t for b, t in enumerate(self._tiers) if mask >> b & 1)
        return Presence(name=self.names[i], size=self.sizes[i], tiers=tiers, pinned=self._pinned[i])

    def present(self, i: int) -> bool:
        return self.sizes[i] >= 0


class Hold:
    """One leased copy of block *name*: *length* payload bytes at *offset* of the arena
    (``kind`` ``"arena"``) or of the block file *path* (``"file"``; a 4 KiB-aligned
    offset, for direct I/O and GDS), with the block's xxh3-64 *checksum*. While it is
    held the extent is not reused and the file not removed, replaced or renamed; it ends
    with :meth:`release`, the client closing, or its deadline ``expires``
    (``time.monotonic()``; :meth:`Client.renew` extends it)."""

    __slots__ = ("_client", "checksum", "expires", "kind", "lease", "length", "name", "offset", "path", "tier")

    def __init__(self, client: Releaser | None, name: str, grant: Grant | None, expires: float) -> None:
        self._client = client
        self.name = name
        self.lease = grant.id if grant is not None and client is not None else None
        self.tier = grant.tier if grant is not None else "client"
        self.kind = grant.kind if grant is not None else "copy"
        self.path = grant.path if grant is not None else ""
        self.offset = grant.offset if grant is not None else 0
        self.length = grant.length if grant is not None else 0
        self.checksum = grant.checksum if grant is not None else 0
        self.expires = expires

    @property
    def released(self) -> bool:
        return self._client is None

    @property
    def valid(self) -> bool:
        """Held, and before its deadline."""
        return self._client is not None and time.monotonic() < self.expires

    def _end(self) -> None:
        self._client = None

    def release(self) -> None:
        client = self._client
        if client is not None:
            client.release([self])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class View(Hold):
    """One block's bytes in the arena, read-only, without a copy (:meth:`Client.get`);
    valid while its lease is (see :class:`Hold`). After that the memory may hold another
    block: :attr:`data` then raises :class:`LeaseEnded`. Keep no slice of it past
    :meth:`release`."""

    __slots__ = ("_data", "size")

    def __init__(
        self, client: Releaser | None, name: str, data: memoryview, grant: Grant | None, expires: float
    ) -> None:
        super().__init__(client, name, grant, expires)
        self._data: memoryview | None = data
        self.size = len(data)
        if grant is None:  # a private copy (no DRAM tier): nothing to hold
            self.length = self.size
            self.checksum = buffers.checksum([data])

    @property
    def data(self) -> memoryview:
        if self._data is None:
            raise LeaseEnded(f"the view of {self.name!r} was released")
        if self.lease is not None and time.monotonic() >= self.expires:
            raise LeaseEnded(f"the lease on {self.name!r} passed its deadline; its memory may hold another block now")
        return self._data

    @property
    def released(self) -> bool:
        return self._data is None

    def _end(self) -> None:
        self._client = None
        self._data = None

    def release(self) -> None:
        client = self._client
        self._data = None
        if client is not None:
            client.release([self])
        self._client = None

    def __len__(self) -> int:
        return self.size


class PutBuffer:
    """A reserved extent of the arena to write one block into (:meth:`Client.reserve`):
    fill :attr:`data` (writable, exactly the block's size), then :meth:`Client.commit`."""

    __slots__ = ("data", "expires", "name", "slot")

    def __init__(self, name: str, slot: Slot, data: memoryview, expires: float) -> None:
        self.name = name
        self.slot = slot
        self.data = data
        self.expires = expires


class EventStream:
    """The block events of one subscription (:meth:`Client.events`), in order."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._items = iter(conn.stream(Events()))
        try:
            first = next(self._items)
        except BaseException:
            conn.close()
            raise
        if not isinstance(first, Subscribed):
            conn.close()
            raise KvfsError(f"the daemon answered an events subscription with {first.kind!r}")

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Event:
        for item in self._items:
            if isinstance(item, EventItem):
                return item.event
        raise StopIteration

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
