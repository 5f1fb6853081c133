"""The kvfs error hierarchy.

Every error kvfs raises on purpose is a :class:`KvfsError`. Vendor errors (``OSError``
from a filesystem, botocore's, kvikio's) are translated at the tier boundary with
``raise ... from exc`` so the cause is kept. Only ``kvfs.mount`` maps these to errno.
"""

from __future__ import annotations

__all__ = [
    "BlockCorrupt",
    "BlockExists",
    "BlockNotFound",
    "ConfigError",
    "DirectoryNotEmpty",
    "InvalidName",
    "IsADirectory",
    "KvfsError",
    "NoSpace",
    "NotADirectory",
    "ReadOnlyBlock",
    "TierFull",
    "TierUnavailable",
]


class KvfsError(Exception):
    """Base class of every error kvfs raises on purpose."""


class ConfigError(KvfsError, ValueError):
    """Raised when a config file or flag is invalid.

    ``field`` names the offending key (dotted, e.g. ``tiers[1].capacity``) and the
    message says why and what to do.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"config error in {field}: {reason}")


class InvalidName(KvfsError, ValueError):
    """Raised when a block or directory name is not a valid kvfs path."""


class BlockNotFound(KvfsError, LookupError):
    """Raised when a block does not exist, or no tier holds a readable copy of it.

    An evicted block, a deleted block and a block whose every copy failed its checksum
    all raise this: a reader sees a miss, never wrong bytes.
    """


class BlockExists(KvfsError):
    """Raised when a name is taken and the operation does not replace."""


class BlockCorrupt(KvfsError):
    """Raised by a tier when a stored copy fails its header or checksum check.

    The store catches it, drops the copy, counts it and falls back to another copy.
    """


class NoSpace(KvfsError):
    """Raised when a block cannot be placed in any tier: every tier that could take it
    is full of pinned blocks, or the block is larger than every tier."""


class TierFull(KvfsError):
    """Raised by a tier when it cannot take a block right now (no contiguous space).

    The store reacts by evicting from that tier and trying again.
    """


class TierUnavailable(KvfsError):
    """Raised by a tier that failed or timed out (S3 down, NFS stalled).

    The store marks the tier unhealthy and keeps serving from the other tiers.
    """


class NotADirectory(KvfsError):
    """Raised when a path component that must be a directory is a block."""


class IsADirectory(KvfsError):
    """Raised when a block operation names a directory."""


class DirectoryNotEmpty(KvfsError):
    """Raised when removing a directory that still holds entries."""


class ReadOnlyBlock(KvfsError):
    """Raised when a sealed (immutable) block is opened for writing without truncation."""
