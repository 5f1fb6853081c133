"""Plain file I/O on a mount, as the semantic tests do it: seeded bytes, the errno of a
call that must fail, a whole-file write, and renameat2(2)."""

from __future__ import annotations

import ctypes
import os
import random
from pathlib import Path

import pytest


def blob(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def err(fn, *args, **kw) -> int:
    with pytest.raises(OSError) as info:
        fn(*args, **kw)
    return info.value.errno


def write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old: Path, new: Path, flags: int) -> None:
    """renameat2(2) with *flags* (``RENAME_NOREPLACE`` 1, ``RENAME_EXCHANGE`` 2), which os lacks."""
    AT_FDCWD = -100
    if _libc.renameat2(AT_FDCWD, str(old).encode(), AT_FDCWD, str(new).encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
