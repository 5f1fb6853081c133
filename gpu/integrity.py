"""Checking a block the GPU agent landed, where it landed.

Every block counts as loaded only once its bytes match the block's checksum, on every
path. Host memory (``device="cpu"``, the arena, pinned staging) is checked with kvfs's
own xxh3-64. Device memory is checked on the device with :func:`device_checksum` when the
block's header records one (block format 2, :mod:`kvfs.blockfile`), otherwise by copying
the block back to pinned host memory and hashing it (correct, and one more PCIe pass).
"""

from __future__ import annotations

import torch

from kvfs.blockfile import devsum_words
from kvfs.client.buffers import checksum as xxh3

from .host_io import host_bytes

__all__ = ["device_checksum", "matches"]

_MASK32 = 0xFFFFFFFF
_weights: dict[tuple[torch.device, int], torch.Tensor] = {}


def _positions(device: torch.device, n: int) -> torch.Tensor:
    """1, 2, ..., n as int64 on *device* (cached per size: blocks come in few sizes)."""
    key = (device, n)
    w = _weights.get(key)
    if w is None:
        if len(_weights) > 16:
            _weights.clear()
        w = _weights[key] = torch.arange(1, n + 1, dtype=torch.int64, device=device)
    return w


def device_checksum(t: torch.Tensor, length: int) -> int:
    """The device checksum of the first *length* bytes of the uint8 tensor *t*, computed
    with torch ops where *t* is: over the bytes as little-endian uint32 words (the tail
    zero-padded), ``(sum w_i, sum i*w_i)`` with int64 wrap-around, folded to 64 bits.
    The same function as :func:`kvfs.blockfile.devsum` (numpy, at seal time)."""
    n4 = length // 4
    words = t[: n4 * 4].view(torch.int32).to(torch.int64) & _MASK32
    tail = length - n4 * 4
    s1 = words.sum()
    s2 = (words * _positions(t.device, n4)).sum()
    if tail:
        last = t[n4 * 4 : length].to(torch.int64)
        shifts = torch.tensor([0, 8, 16][:tail], dtype=torch.int64, device=t.device)
        w = (last << shifts).sum()
        s1 = s1 + w
        s2 = s2 + w * (n4 + 1)
    a, b = int(s1.item()), int(s2.item())
    return devsum_words(a, b)


def matches(t: torch.Tensor, length: int, checksum: int, device_sum: int | None = None) -> bool:
    """Whether the first *length* bytes of *t* are the block: xxh3-64 for host memory;
    on a device the device checksum when known, else xxh3-64 of a copy back to the host."""
    if t.device.type == "cpu":
        return xxh3([host_bytes(t[:length])]) == checksum
    if device_sum is not None:
        return device_checksum(t, length) == device_sum
    host = torch.empty(length, dtype=torch.uint8, pin_memory=True)
    host.copy_(t[:length])
    return xxh3([host_bytes(host)]) == checksum
