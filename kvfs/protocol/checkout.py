"""The batch client's read in one round trip: :class:`Checkout` leases many names and
:class:`CheckedOut` answers in columns.

A :class:`~kvfs.protocol.Lease` answers with one :class:`~kvfs.protocol.Grant` object per
name, which both sides build and check field by field: for a batch of a few dozen small
blocks that costs more than copying their bytes. A checkout holds exactly the same leases
(the same store call, the same access checks, promotion and hit counting) and answers with
one list per field, which the JSON codec checks in one pass per list. Added in protocol
version 3; ``Lease`` stays for callers that want grant objects. A checkout also ends the
leases it names in ``release`` first, so a client reading batch after batch sends one
message per batch (its previous batch's release folded into the next checkout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .codec import Message
from .messages import _BATCH, _MSG, _TTL, Promote, Request, WireError

__all__ = ["CheckedOut", "Checkout"]


@dataclass(**_MSG)
class CheckedOut(Message):
    """Per name, in order, one entry of each column: ``ids`` (the lease; 0 where the name
    failed, its error then in ``errors``), ``tiers`` (index into the Welcome's tier list),
    ``kinds`` (``"arena"``, ``"file"``, ``"copy"``; ``""`` where it failed), ``paths``
    (the block file for ``"file"``, else ``""``), ``offsets``, ``lengths``, ``checksums``
    (xxh3-64). Every lease of one checkout has the same ``ttl`` (seconds from the reply).
    ``errors`` is empty when no name failed."""

    kind: ClassVar[str] = "checked_out"
    ids: list[int]
    tiers: list[int]
    kinds: list[str]
    paths: list[str]
    offsets: list[int]
    lengths: list[int]
    checksums: list[int]
    ttl: float
    errors: list[WireError | None] = field(default_factory=list)


@dataclass(**_MSG)
class Checkout(Request):
    """:class:`~kvfs.protocol.Lease` of every name, answered in columns (:class:`CheckedOut`),
    after ending the leases in *release*."""

    kind: ClassVar[str] = "checkout"
    reply: ClassVar[type[Message]] = CheckedOut
    names: list[str] = field(metadata=_BATCH)
    ttl: float = field(default=0.0, metadata=_TTL)  # 0: the session's default
    promote: str = Promote.POLICY
    count_hits: bool = True
    release: list[int] = field(default_factory=list, metadata=_BATCH)
    """Leases of this session to end first (the previous read's: folded into this request
    instead of a :class:`~kvfs.protocol.Release` of their own)."""
