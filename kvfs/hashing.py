"""The block hash chain and the paths it produces.

A block's hash covers its parent's hash, its token ids and its extra keys (LoRA name,
multimodal ids, cache salt). The chain is rooted at the namespace's digest, which fixes the
model and the KV layout, so two layouts never share a block. The hash function is passed
in (xxh3-128 by default); nothing depends on Python's ``hash`` or a random seed, so the
result is the same in every process on every machine. The format is specified in
``docs/naming.md``; tests pin known values.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import xxhash

from .errors import InvalidName
from .names import BlockName

__all__ = [
    "HashFn",
    "Namespace",
    "block_hash",
    "block_hash_of",
    "block_path",
    "chain_hashes",
    "differ_only_by_weights",
    "xxh3_128",
]

HashFn = Callable[[bytes], bytes]
"""A hash function from bytes to a digest (16 bytes for the default)."""


def xxh3_128(data: bytes) -> bytes:
    """xxh3-128 with seed 0, big-endian digest (the default block hash)."""
    return xxhash.xxh3_128_digest(data)


_TAG_INT, _TAG_STR, _TAG_BYTES = b"i", b"s", b"b"


def _encode_extra(keys: Iterable[int | str | bytes]) -> bytes:
    """Length-prefixed, type-tagged encoding so ``("ab", "c")`` and ``("a", "bc")`` differ."""
    out = bytearray()
    for key in keys:
        if isinstance(key, bool) or not isinstance(key, (int, str, bytes)):
            raise TypeError(f"extra keys must be int, str or bytes, not {type(key).__name__}")
        if isinstance(key, int):
            raw, tag = str(key).encode(), _TAG_INT
        elif isinstance(key, str):
            raw, tag = key.encode(), _TAG_STR
        else:
            raw, tag = key, _TAG_BYTES
        out += tag + struct.pack("<I", len(raw)) + raw
    return bytes(out)


def _encode_tokens(tokens: Sequence[int]) -> bytes:
    arr = array("I", tokens)  # raises OverflowError for ids outside uint32
    if arr.itemsize != 4:  # pragma: no cover - every supported platform has 4-byte 'I'
        arr = array("L", tokens)
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return arr.tobytes()


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, kw_only=True, slots=True)
class Namespace:
    """What a block's bytes depend on besides its tokens: the model and the KV layout.

    Blocks of two namespaces never share a hash. ``dirname`` is the top-level directory
    the namespace's blocks live under: the model name made path-safe plus a digest prefix.

    ``weights`` is the model's fingerprint: the weights' revision or digest (a hub commit,
    ``sha256:…`` of the files). With it, a model whose weights change under the same
    ``model`` name gets another chain root and another directory, so stale KV is never
    served for it; with it empty (the default) the chain is the v1 chain, unchanged
    (docs/naming.md, "Model identity"). The rest of the fingerprint (dtype, layout, TP
    rank) was always part of the namespace.
    """

    model: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_size: int
    tokens_per_block: int
    tp_rank: int = 0
    tp_size: int = 1
    extra: str = ""
    weights: str = ""

    def encode(self) -> bytes:
        """The namespace's encoding: v1 without ``weights`` (existing chains keep their
        values), v2 with it (the v1 fields, then the fingerprint)."""
        fields: tuple[str | int, ...] = (
            "kvfs-namespace-v1" if not self.weights else "kvfs-namespace-v2",
            self.model,
            self.dtype,
            self.num_layers,
            self.num_kv_heads,
            self.head_size,
            self.tokens_per_block,
            self.tp_rank,
            self.tp_size,
            self.extra,
        )
        if self.weights:
            fields += (self.weights,)
        return _encode_extra(fields)

    def digest(self, hash_fn: HashFn = xxh3_128) -> bytes:
        """The chain's root: the parent hash of a sequence's first block."""
        return hash_fn(self.encode())

    def dirname(self, hash_fn: HashFn = xxh3_128) -> str:
        model = _SAFE.sub("-", self.model).strip("-.") or "model"
        return f"{model[:64]}-{self.digest(hash_fn).hex()[:12]}"


def differ_only_by_weights(a: Namespace, b: Namespace) -> bool:
    """True when *a* and *b* are the same model name and KV layout with different weights
    fingerprints: one of them holds KV of weights that are no longer served under that
    name (kvfs warns about such a pair; retire the stale one)."""
    return a.weights != b.weights and dataclasses.replace(a, weights=b.weights) == b


def block_hash(
    parent: bytes,
    tokens: Sequence[int],
    extra_keys: Sequence[int | str | bytes] = (),
    hash_fn: HashFn = xxh3_128,
) -> bytes:
    """The hash of one block: ``hash_fn(len(parent) | parent | n | tokens(u32 LE) | extra)``."""
    if not tokens:
        raise InvalidName("a block must cover at least one token")
    tok = _encode_tokens(tokens)
    head = struct.pack("<I", len(parent)) + parent + struct.pack("<I", len(tokens))
    return hash_fn(head + tok + _encode_extra(extra_keys))


def chain_hashes(
    namespace: Namespace,
    tokens: Sequence[int],
    *,
    extra_keys: Sequence[int | str | bytes] = (),
    hash_fn: HashFn = xxh3_128,
    partial: bool = False,
) -> list[bytes]:
    """Hashes of every block of *tokens*, in order.

    Blocks are ``namespace.tokens_per_block`` tokens long; a trailing partial block is
    hashed only when *partial* is true. *extra_keys* apply to every block.
    """
    n = namespace.tokens_per_block
    parent = namespace.digest(hash_fn)
    out: list[bytes] = []
    end = len(tokens) if partial else len(tokens) - len(tokens) % n
    for start in range(0, end, n):
        parent = block_hash(parent, tokens[start : start + n], extra_keys, hash_fn)
        out.append(parent)
    return out


def block_path(namespace: Namespace, digest: bytes, hash_fn: HashFn = xxh3_128) -> BlockName:
    """``<namespace dirname>/<first two hex digits>/<hex digest>``: 256 shards per namespace."""
    h = digest.hex()
    return BlockName(f"{namespace.dirname(hash_fn)}/{h[:2]}/{h}")


_HASHED = re.compile(r"(?:^|/)([0-9a-f]{2})/(\1[0-9a-f]{6,126})$")


def block_hash_of(name: str) -> bytes | None:
    """The block hash a name carries (``.../<ab>/<abcdef...>``, an even number of hex
    digits, as :func:`block_path` writes it), as KV events and the peer tier carry it;
    None for a name that is not a hash."""
    m = _HASHED.search(name)
    if m is None or len(m.group(2)) % 2:
        return None
    return bytes.fromhex(m.group(2))
