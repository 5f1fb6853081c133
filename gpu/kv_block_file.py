"""The file format of one KV block written by the transformers prefix cache.

This is the *payload* format the engine side writes into a directory (a kvfs mount or a
plain directory); kvfs stores each such file as an opaque block. It is self-describing so a
reader can reject a file that is short, damaged, of another layout or under the wrong
name before a byte of it reaches a model's cache::

    offset  size  field
    0       8     magic  b"KVFSHKV\\x01"
    8       2     format version (1)
    10      2     dtype code (1 float32, 2 float16, 3 bfloat16)
    12      4     header length H (4096)
    16      4     num_layers L
    20      4     num_kv_heads Hk
    24      4     head_size D
    28      4     tokens T in the block
    32      8     payload length (L * 2 * T * Hk * D * itemsize)
    40      8     payload checksum: xxh3-64 of the payload
    48      16    the block's chain hash (kvfs.hashing), so a file under the wrong name fails
    64      8     header checksum: xxh3-64 of bytes 0 .. 64
    72            zeros up to H
    H             payload: for each layer, K then V, each ``[T, Hk, D]`` row-major

All integers are little-endian; tensors are in the host's (little-endian) byte order. The
payload starts at 4 KiB so direct-I/O and GDS readers can land it in aligned buffers, and
each layer's K and V are one contiguous run so a reader fills its per-layer buffers with a
single ``readv``. Nothing here imports torch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

from kvfs.errors import BlockCorrupt

__all__ = [
    "DTYPE_CODES",
    "HEADER_LENGTH",
    "ITEMSIZE",
    "MAGIC",
    "VERSION",
    "KVBlockHeader",
    "decode_header",
    "encode_header",
]

MAGIC = b"KVFSHKV\x01"
VERSION = 1
HEADER_LENGTH = 4096
_FIXED = struct.Struct("<8sHHIIIIIQQ16s")  # 64 bytes
_HCSUM = struct.Struct("<Q")

DTYPE_CODES: dict[str, int] = {"float32": 1, "float16": 2, "bfloat16": 3}
ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
_DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class KVBlockHeader:
    """What a block file says about itself."""

    dtype: str
    num_layers: int
    num_kv_heads: int
    head_size: int
    tokens: int
    payload_length: int
    checksum: int
    digest: bytes

    @staticmethod
    def payload_length_of(dtype: str, num_layers: int, num_kv_heads: int, head_size: int, tokens: int) -> int:
        return num_layers * 2 * tokens * num_kv_heads * head_size * ITEMSIZE[dtype]


def encode_header(h: KVBlockHeader) -> bytes:
    """The 4096 header bytes of a block file."""
    if h.dtype not in DTYPE_CODES:
        raise ValueError(f"unsupported KV dtype {h.dtype!r}; expected one of {sorted(DTYPE_CODES)}")
    if len(h.digest) > 16:
        raise ValueError("block digest is longer than 16 bytes")
    head = _FIXED.pack(
        MAGIC,
        VERSION,
        DTYPE_CODES[h.dtype],
        HEADER_LENGTH,
        h.num_layers,
        h.num_kv_heads,
        h.head_size,
        h.tokens,
        h.payload_length,
        h.checksum,
        h.digest.ljust(16, b"\0"),
    )
    head += _HCSUM.pack(xxhash.xxh3_64_intdigest(head))
    return head + bytes(HEADER_LENGTH - len(head))


def decode_header(buf: bytes | bytearray | memoryview) -> KVBlockHeader:
    """Parse and check the header at the start of *buf*.

    Raises :class:`~kvfs.errors.BlockCorrupt` for a wrong magic, version, header length,
    dtype code or header checksum, or a payload length that does not match the shape.
    """
    mv = memoryview(buf)
    if len(mv) < _FIXED.size + _HCSUM.size:
        raise BlockCorrupt("KV block file is shorter than its header")
    magic, version, code, hlen, layers, heads, dim, tokens, plen, csum, digest = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        raise BlockCorrupt("not a kvfs KV block file (bad magic)")
    (hcsum,) = _HCSUM.unpack_from(mv, _FIXED.size)
    if xxhash.xxh3_64_intdigest(mv[: _FIXED.size]) != hcsum:
        raise BlockCorrupt("KV block header checksum mismatch")
    if version != VERSION:
        raise BlockCorrupt(f"unsupported KV block format version {version}")
    if hlen != HEADER_LENGTH:
        raise BlockCorrupt(f"KV block header length {hlen} is not {HEADER_LENGTH}")
    dtype = _DTYPE_NAMES.get(code)
    if dtype is None:
        raise BlockCorrupt(f"unknown KV dtype code {code}")
    if plen != KVBlockHeader.payload_length_of(dtype, layers, heads, dim, tokens):
        raise BlockCorrupt("KV block payload length does not match its shape")
    return KVBlockHeader(
        dtype=dtype,
        num_layers=layers,
        num_kv_heads=heads,
        head_size=dim,
        tokens=tokens,
        payload_length=plen,
        checksum=csum,
        digest=digest,
    )
