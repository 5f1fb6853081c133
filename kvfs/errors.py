"""The kvfs error hierarchy.

Every error kvfs raises on purpose is a :class:`KvfsError`. Vendor errors (``OSError``
from a filesystem, botocore's, kvikio's) are translated at the tier boundary with
``raise ... from exc`` so the cause is kept. Only ``kvfs.mount`` maps these to errno.
"""

from __future__ import annotations

__all__ = [
    "AccessDenied",
    "BlockCorrupt",
    "BlockExists",
    "BlockNotFound",
    "ConfigError",
    "CrossNamespace",
    "DescriptorsExhausted",
    "DirectoryNotEmpty",
    "InvalidName",
    "IsADirectory",
    "KvfsError",
    "LandingBusy",
    "LastCopy",
    "LimitReached",
    "NamespaceRetired",
    "NixlUnavailable",
    "NoSpace",
    "NotADirectory",
    "OutOfMemory",
    "Pinned",
    "ReadOnlyBlock",
    "ReservationEnded",
    "RuntimeDirError",
    "StoreBusy",
    "TierFull",
    "TierInUse",
    "TierUnavailable",
    "TransferFailed",
    "TransferStuck",
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


# -- raised by the store's collaborators ----------------------------------------------


class LastCopy(KvfsError):
    """Raised by ``Store.evict`` (:meth:`kvfs.steering.OperatorCommands.evict`) when dropping
    the copy would lose the block and no colder tier can take it; pass ``force=True`` to drop
    it anyway."""


class Pinned(KvfsError):
    """Raised by ``Store.evict`` (:meth:`kvfs.steering.OperatorCommands.evict`) for a pinned
    block (pinned blocks are never evicted, by policy or by request); unpin it first, or pass
    ``force=True``."""


class CrossNamespace(KvfsError):
    """Raised by ``Store.rename`` when it would move a block from one namespace into another
    (quotas and owners differ): copy it and remove the original instead (``mv`` does)."""


class NamespaceRetired(KvfsError):
    """Raised when a block is written into a retired namespace (its model's KV is stale):
    by every way of writing (``Store.put``, ``Store.reserve``, ``Store.rename``); write to
    its successor."""


class ReservationEnded(KvfsError):
    """Raised by :class:`kvfs.ingest.Ingest` when a reservation is committed or aborted after
    it ended: committed or aborted already, past its deadline, or its store closed."""


class AccessDenied(KvfsError, PermissionError):
    """Raised by :func:`kvfs.access.check` when a peer may not do an operation in a
    namespace; the message names the peer, the operation, the namespace and its rule."""


class LandingBusy(KvfsError):
    """Raised by :meth:`kvfs.peers.PeerSource.fetch` when every landing buffer for the peer
    stayed in use until the deadline: the read is a miss, the peer is not at fault."""


class RuntimeDirError(KvfsError):
    """Raised by :func:`kvfs.runtime.runtime_dir` when the runtime directory (or a file in
    it) is not safe to use: a symlink, not a directory, owned by another user, or open to
    others."""


class NixlUnavailable(KvfsError):
    """Raised by :mod:`kvfs.nixl` when NIXL cannot be loaded (no ``nixl-cu12``/``nixl-cu13``),
    or an agent or a backend of it cannot start here."""


class TransferFailed(KvfsError):
    """Raised by :meth:`kvfs.nixl.Agent.transfer` when a transfer failed or passed its
    deadline and was cancelled: nothing more will be written to its destination."""


class TransferStuck(TransferFailed):
    """Raised by :meth:`kvfs.nixl.Agent.transfer` when a transfer failed or passed its
    deadline and NIXL could not cancel it: its destination may still be written later."""
