"""The self-describing block file format of the persistent tiers (see docs/block-format.md).

Two layouts. **Header beside the payload** (version 3, the disk tier's where the
filesystem keeps user extended attributes): the file holds exactly the payload, from
offset 0, and the header is the file's extended attribute ``user.kvfs.block`` — so the
file can back a FUSE file at identical offsets (passthrough) and be read whole with direct
I/O or GDS. **Header before the payload** (versions 1 and 2; the posix and s3 tiers, long
names, filesystems without user xattrs): a 4 KiB-aligned header followed by the payload,
padded with zeros to a multiple of 4 KiB. Version 2 and 3 record a device checksum
(:func:`devsum`) next to the host checksum; version 1 files (without it) are still read.
:func:`read_header` reads either layout's header from an open file::

    offset  size  field
    0       8     magic  b"KVFSBLK\\x01"
    8       2     format version (2; 1 in older files)
    10      2     flags: bit 0 = the device checksum is recorded (version 2 only)
    12      4     header length H (a multiple of 4096; 4096 unless the name is long)
    16      8     payload length
    24      8     payload checksum: xxh3-64 of the payload
    32      8     device checksum (version 2 only; 0 unless flag bit 0)
    40      4     name length N                      (at 32 in version 1)
    44      N     name (UTF-8, the block's path)     (at 36 in version 1)
    44+N    8     header checksum: xxh3-64 of bytes 0 .. 44+N (36+N in version 1)
    ...           zeros up to H
    H             payload
    H+len         zeros up to a multiple of 4096

Version 3's attribute holds the same fields as version 2's header (its header length is
0: the payload starts at offset 0) without the padding. All integers are little-endian. A
header that fails its own checksum, or a payload that fails the payload checksum, is
corrupt: the tier raises BlockCorrupt and the store drops it.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from .errors import BlockCorrupt
from .pieces import Pieces

__all__ = [
    "ALIGN",
    "BESIDE_MAX",
    "FLAG_DEVSUM",
    "MAGIC",
    "VERSION",
    "VERSION_BESIDE",
    "XATTR",
    "BlockHeader",
    "align_up",
    "beside_fits",
    "checksum",
    "decode_header",
    "devsum",
    "devsum_words",
    "encode_beside",
    "encode_header",
    "file_length",
    "header_length",
    "read_header",
    "verify",
]

ALIGN = 4096
MAGIC = b"KVFSBLK\x01"
VERSION = 2
VERSION_BESIDE = 3
XATTR = "user.kvfs.block"
"""The extended attribute that holds a version-3 block file's header."""
BESIDE_MAX = 4000
"""The largest version-3 header (bytes): ext4 keeps one attribute value in one 4 KiB
block; a block whose name makes its header longer is written with the header before."""
FLAG_DEVSUM = 1  # the header records the payload's device checksum
_FIXED_V1 = struct.Struct("<8sHHIQQI")  # magic, version, flags, header len, payload len, checksum, name len
_FIXED = struct.Struct("<8sHHIQQQI")  # version 2: ..., checksum, device checksum, name len
_PREFIX = struct.Struct("<8sH")  # magic, version: enough to choose the layout


def checksum(data: Any) -> int:
    """The payload checksum: xxh3-64 of the bytes (any buffer, or a block's
    :class:`~kvfs.pieces.Pieces`, hashed in one streaming pass: the same value as of the
    joined bytes)."""
    if isinstance(data, Pieces) and len(data.views) != 1:
        h = xxhash.xxh3_64()
        for v in data.views:
            h.update(v)
        streamed: int = h.intdigest()
        return streamed
    digest: int = xxhash.xxh3_64_intdigest(data.views[0] if isinstance(data, Pieces) else data)
    return digest


_M64 = (1 << 64) - 1


def devsum_words(s1: int, s2: int) -> int:
    """Fold the device checksum's two sums (each taken mod 2**64) into 64 bits."""
    s1, s2 = s1 & _M64, s2 & _M64
    return (s1 ^ ((s2 << 29) | (s2 >> 35))) & _M64


_CHUNK = 1 << 16  # words per pass: the position weights stay in the cache
_weights: list[Any] = []


def devsum(data: Any) -> int:
    """The device checksum of *data* (any buffer): over its bytes as little-endian uint32
    words ``w_1 .. w_n`` (the tail zero-padded), ``sum w_i`` and ``sum i * w_i`` mod 2**64,
    folded. Computable with torch ops on a GPU (:func:`kvfs.gpu.integrity.device_checksum`)
    where xxh3 is not; weaker than xxh3 (linear: it catches any change of one word, of a
    run of zeros or a torn tail, and swapped words, not crafted collisions)."""
    b = np.frombuffer(data, dtype=np.uint8)
    n4 = len(b) // 4
    words = b[: n4 * 4].view("<u4")
    if not _weights:
        _weights.append(np.arange(1, _CHUNK + 1, dtype=np.int64))
    ar = _weights[0]
    s1 = s2 = 0
    with np.errstate(over="ignore"):
        for a in range(0, n4, _CHUNK):
            w = words[a : a + _CHUNK].astype(np.int64)
            t = int(w.sum(dtype=np.int64))
            s1 += t
            s2 += int(np.dot(w, ar[: len(w)])) + a * t
    if len(b) > n4 * 4:
        last = int.from_bytes(b[n4 * 4 :].tobytes(), "little")
        s1 += last
        s2 += (n4 + 1) * last
    return devsum_words(s1, s2)


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def header_length(name: str) -> int:
    """Bytes the header of *name* takes on disk (a multiple of 4096)."""
    return align_up(_FIXED_V1.size + len(name.encode()) + 8)  # the same in both versions (see encode_header)


def file_length(name: str, size: int) -> int:
    """Bytes a block file of *size* payload bytes takes on disk: its footprint."""
    return header_length(name) + align_up(size)


@dataclass(frozen=True, slots=True)
class BlockHeader:
    name: str
    length: int
    checksum: int
    header_length: int
    device_checksum: int | None = None  # :func:`devsum` of the payload, when recorded
    version: int = VERSION


def encode_header(name: str, length: int, payload_checksum: int, device_checksum: int | None = None) -> bytes:
    """The header bytes of a block (version 2), padded to its header length;
    *device_checksum*: the payload's :func:`devsum`, recorded when given. The header
    length, and so the payload offset, is the same as version 1's for every name."""
    raw_name = name.encode()
    hlen = header_length(name)
    if _FIXED.size + len(raw_name) + 8 > hlen:
        # a name of 4045-4052 bytes: version 2 would need one more 4 KiB than version 1, and
        # a payload offset must not depend on the version, so such a block stays version 1
        head = _FIXED_V1.pack(MAGIC, 1, 0, hlen, length, payload_checksum, len(raw_name)) + raw_name
    else:
        flags, dsum = (FLAG_DEVSUM, device_checksum) if device_checksum is not None else (0, 0)
        head = _FIXED.pack(MAGIC, VERSION, flags, hlen, length, payload_checksum, dsum, len(raw_name)) + raw_name
    head += struct.pack("<Q", xxhash.xxh3_64_intdigest(head))
    return head + bytes(hlen - len(head))


def beside_fits(name: str) -> bool:
    """True when *name*'s version-3 header fits in one extended attribute."""
    return _FIXED.size + len(name.encode()) + 8 <= BESIDE_MAX


def encode_beside(name: str, length: int, payload_checksum: int, device_checksum: int | None = None) -> bytes:
    """The version-3 header of a block, the value of its file's :data:`XATTR` (the file
    holds exactly the payload). Check :func:`beside_fits` first."""
    raw_name = name.encode()
    flags, dsum = (FLAG_DEVSUM, device_checksum) if device_checksum is not None else (0, 0)
    head = _FIXED.pack(MAGIC, VERSION_BESIDE, flags, 0, length, payload_checksum, dsum, len(raw_name)) + raw_name
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))


def read_header(fd: int) -> BlockHeader:
    """The header of the open block file *fd*, either layout: the :data:`XATTR`
    attribute (version 3) when the file has one, else the header at its start.
    Raises :class:`BlockCorrupt` (and OSError from the reads)."""
    try:
        return decode_beside(os.getxattr(fd, XATTR))
    except OSError as exc:
        if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    head = os.pread(fd, ALIGN, 0)
    hdr = decode_header(head)
    if hdr.header_length > ALIGN:  # a long name
        hdr = decode_header(os.pread(fd, hdr.header_length, 0))
    return hdr


def decode_beside(value: bytes) -> BlockHeader:
    """A version-3 header (an :data:`XATTR` value); :class:`BlockCorrupt` when it is not one."""
    hdr = decode_header(value)
    if hdr.version != VERSION_BESIDE:
        raise BlockCorrupt(f"the {XATTR} attribute holds a version {hdr.version} header")
    return hdr


def decode_header(buf: Any) -> BlockHeader:
    """Parse and check a header from the start of *buf* (at least the first 4096 bytes).

    Raises :class:`BlockCorrupt` when the magic, version, lengths or header checksum are
    wrong, or when *buf* is shorter than the header says.
    """
    mv = memoryview(buf)
    if len(mv) < _FIXED_V1.size:
        raise BlockCorrupt("block file is shorter than its header")
    magic, version = _PREFIX.unpack_from(mv, 0)
    if magic != MAGIC:
        raise BlockCorrupt("not a kvfs block file (bad magic)")
    dsum: int | None = None
    if version == 1:
        fixed = _FIXED_V1
        _, _, flags, hlen, length, csum, nlen = fixed.unpack_from(mv, 0)
    elif version in (VERSION, VERSION_BESIDE):
        fixed = _FIXED
        if len(mv) < fixed.size:
            raise BlockCorrupt("block file is shorter than its header")
        _, _, flags, hlen, length, csum, dsum, nlen = fixed.unpack_from(mv, 0)
        if not flags & FLAG_DEVSUM:
            dsum = None
    else:
        raise BlockCorrupt(f"unsupported block format version {version} (this kvfs reads 1, 2 and 3)")
    end = fixed.size + nlen
    if version == VERSION_BESIDE:  # beside the payload: no padding, the payload at offset 0
        if hlen != 0 or len(mv) < end + 8:
            raise BlockCorrupt("block header lengths are inconsistent")
    elif hlen % ALIGN or end + 8 > hlen or len(mv) < end + 8:
        raise BlockCorrupt("block header lengths are inconsistent")
    (hcsum,) = struct.unpack_from("<Q", mv, end)
    if xxhash.xxh3_64_intdigest(mv[:end]) != hcsum:
        raise BlockCorrupt("block header checksum mismatch")
    try:
        name = bytes(mv[fixed.size : end]).decode()
    except UnicodeDecodeError as exc:  # pragma: no cover - the header checksum catches flips
        raise BlockCorrupt("block name is not UTF-8") from exc
    return BlockHeader(
        name=name, length=length, checksum=csum, header_length=hlen, device_checksum=dsum, version=version
    )


def verify(data: Any, expected: int, what: str) -> None:
    """Raise :class:`BlockCorrupt` unless the xxh3-64 of *data* is *expected*."""
    if xxhash.xxh3_64_intdigest(data) != expected:
        raise BlockCorrupt(f"{what}: payload checksum mismatch")
