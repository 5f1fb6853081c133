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
    "StoreBusy",
    "TierFull",
    "TierInUse",
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


class DescriptorsExhausted(TierUnavailable):
    """Raised when a tier's call failed because the daemon is out of file descriptors
    (``EMFILE``, ``ENFILE``): the daemon's limit, not the tier's fault. The tier stays
    healthy (the health breaker ignores it) and the call fails alone (``EMFILE`` on the
    mount); the daemon keeps descriptors in reserve for its tiers (docs/SEMANTICS.md,
    "Limits")."""


class LimitReached(KvfsError):
    """Raised when a request would take a bounded resource of the daemon past its limit:
    connections (per user, in all), bytes of frames in flight, memory for copies of blocks
    held open. The message names the limit, its value and what to do; nothing of the
    request was done."""


class OutOfMemory(LimitReached):
    """Raised when opening a block would take the daemon's memory for open copies of
    blocks read from persistent tiers past ``[mount] open_copies`` (``ENOMEM`` on the
    mount): close some, or raise the limit."""


class NotADirectory(KvfsError):
    """Raised when a path component that must be a directory is a block."""


class IsADirectory(KvfsError):
    """Raised when a block operation names a directory."""


class DirectoryNotEmpty(KvfsError):
    """Raised when removing a directory that still holds entries."""


class ReadOnlyBlock(KvfsError):
    """Raised when a sealed (immutable) block is opened for writing without truncation."""


class StoreBusy(KvfsError):
    """Raised by ``Store.nowait`` when the call cannot finish at memory speed right now:
    the store's lock is held by another thread, or the call needs tier I/O (a disk file
    to delete, a shared tier to ask). The caller makes the same call from a worker thread.

    ``tier`` is the index of the tier whose I/O the call needs (run it under that tier's
    limiter), or ``None`` when only the lock was busy.
    """

    def __init__(self, message: str, tier: int | None = None) -> None:
        super().__init__(message)
        self.tier = tier


class TierInUse(KvfsError):
    """Raised when a tier's arena or directory is held by another kvfs daemon (or is a
    file kvfs did not create); the message names the holder and what to do."""
