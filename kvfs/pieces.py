"""A block's bytes as a sequence of buffers, sealed without joining them.

A file written through the mount is kept in 1 MiB chunks (and views of the block it was
opened over, and zeros for holes); joining them into one ``bytes`` before sealing was a
full copy of the block on the FUSE loop. :class:`Pieces` carries them as they are: the
store checksums them in one streaming pass (:func:`kvfs.blockfile.checksum`: the same
xxh3-64 as of the joined bytes) and each tier's ``put`` copies or writes them piece by
piece (the DRAM tier into its extent), joining once only where a tier needs one buffer
(the disk tier, for its device checksum, in its worker thread; posix and S3). Every ``put`` also takes a single buffer, as before:
:meth:`Pieces.of` makes the one-piece sequence of it.

The pieces are read, never kept: a tier copies them before its ``put`` returns, so the
caller may reuse them afterwards (and must not change them before).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["Pieces"]


class Pieces:
    """The bytes of one block: the concatenation of ``views`` (byte memoryviews, none
    empty), ``size`` bytes in all. Built from any buffers (``bytes``, ``bytearray``,
    ``memoryview``, ``mmap``…); raises ``TypeError`` for an object that is not a buffer."""

    __slots__ = ("size", "views")

    def __init__(self, parts: Iterable[Any]) -> None:
        views = (memoryview(p).cast("B") for p in parts)
        self.views: tuple[memoryview, ...] = tuple(v for v in views if len(v))
        self.size: int = sum(len(v) for v in self.views)

    @classmethod
    def of(cls, data: Any) -> Pieces:
        """*data* itself when it is a :class:`Pieces`, else the one-piece block of the buffer *data*."""
        return data if isinstance(data, Pieces) else cls((data,))

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[memoryview]:
        return iter(self.views)

    def __bytes__(self) -> bytes:
        return bytes(self.joined())

    def copy_to(self, out: memoryview) -> None:
        """Copy the bytes into the writable byte view *out* of exactly ``size`` bytes."""
        if len(out) != self.size:
            raise ValueError(f"a block of {self.size} bytes does not fill a view of {len(out)}")
        pos = 0
        for v in self.views:
            out[pos : pos + len(v)] = v
            pos += len(v)

    def joined(self) -> memoryview | bytes:
        """The bytes as one buffer: the only piece itself (no copy), else one copy of all."""
        if len(self.views) == 1:
            return self.views[0]
        return b"".join(self.views)
