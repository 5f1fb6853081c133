"""The kvfs extended attributes: their names, what each reads on a block, and what a
write of ``user.kvfs.pinned`` asks for (docs/SEMANTICS.md, lines 26 to 31 and 41). The
handlers that find the block and check access are ``KvfsOperations``'s; this module only
translates values, so it raises nothing but ``FUSEError``.
"""

from __future__ import annotations

import errno

import pyfuse3
from pyfuse3 import FUSEError

from kvfs.store import BlockStat
from kvfs.units import parse_duration

__all__ = ["XATTRS", "XATTR_PARENT", "XATTR_PINNED", "pin_request", "value_of"]

XATTR_TIERS = b"user.kvfs.tiers"
XATTR_PINNED = b"user.kvfs.pinned"
XATTR_HITS = b"user.kvfs.hits"
XATTR_CHECKSUM = b"user.kvfs.checksum"
XATTR_PARENT = b"user.kvfs.parent"
XATTRS = (XATTR_TIERS, XATTR_PINNED, XATTR_HITS, XATTR_CHECKSUM)
"""What ``listxattr`` of a block lists (``user.kvfs.parent`` only when it has one)."""


def value_of(st: BlockStat, name: bytes) -> bytes:
    """The value of attribute *name* of the block *st*; ``ENOATTR`` for any other."""
    if name == XATTR_TIERS:
        return ",".join(st.tiers).encode()
    if name == XATTR_PINNED:
        return b"1" if st.pinned else b"0"
    if name == XATTR_HITS:
        return str(st.hits).encode()
    if name == XATTR_CHECKSUM:
        return st.checksum_hex.encode()
    if name == XATTR_PARENT and st.parent:
        return st.parent.encode()
    raise FUSEError(pyfuse3.ENOATTR)


def pin_request(value: bytes) -> tuple[bool, float | None]:
    """What a write of *value* to ``user.kvfs.pinned`` asks: ``(pinned, ttl)`` — ``1`` a
    pin, ``0`` an unpin, a duration (``"10m"``) a soft pin for that long. ``EINVAL`` for
    anything else."""
    v = value.strip()
    if v in (b"0", b"1"):
        return v == b"1", None
    try:
        ttl = parse_duration(v.decode())
    except (UnicodeDecodeError, ValueError):
        raise FUSEError(errno.EINVAL) from None
    if not ttl > 0:
        raise FUSEError(errno.EINVAL)
    return True, ttl
