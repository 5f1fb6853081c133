"""Identities: block names, directory names and tier names.

A block's name is its path inside the kvfs namespace: a relative, ``/``-separated path
with no empty, ``.`` or ``..`` components, e.g. ``llama-1a2b3c4d5e6f/ab/ab12…``. The root
directory is the empty string.

**Reserved names.** A component that starts with :data:`RESERVED_PREFIX` (``.kvfs-``)
is kvfs's own: the posix tier writes each block to a hidden temporary ``.kvfs-tmp.*``
next to its final name (and ``kvfs gc`` renames expired blocks aside as
``.kvfs-tmp.gc.*``), which other nodes' listings skip and gc removes. A block or
directory under such a name would be hidden from other nodes and deleted by gc, so no
block or directory may be created under one (:func:`check_creatable`, asked by every way
of creating a name; ``EINVAL`` on the mount), and one never exists (:func:`is_reserved`).
The disk tier's temporaries and lock file live outside its ``blocks/`` tree and s3 keeps
no temporary keys (an unfinished multipart upload has no key until it completes), so
nothing else can collide.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NewType

from .errors import InvalidName

__all__ = [
    "RESERVED_PREFIX",
    "ROOT",
    "BlockName",
    "TierName",
    "basename",
    "check_creatable",
    "is_reserved",
    "is_under",
    "normalize",
    "normalize_valid",
    "parent_of",
    "split",
]

BlockName = NewType("BlockName", str)
"""A normalized path inside the namespace (a block or a directory)."""

TierName = NewType("TierName", str)
"""The configured name of a tier (``dram``, ``nvme0``, ``lustre``, …)."""

ROOT = BlockName("")

RESERVED_PREFIX = ".kvfs-"
"""Components starting with this are kvfs's own (tier temporaries; see the module doc)."""

_MAX_COMPONENT = 255
_MAX_PATH = 3800  # leaves room for the block file header (4 KiB) and the tier's own prefix


def normalize(path: str) -> BlockName:
    """Return *path* as a normalized name; leading and repeated slashes are dropped.

    Raises :class:`InvalidName` for ``.``/``..`` components, NUL bytes, components longer
    than 255 bytes or paths longer than 3800 bytes.
    """
    if (
        len(path) <= _MAX_COMPONENT
        and path.isascii()
        and path[:1] not in ("/", ".", "")
        and path[-1:] != "/"
        and "//" not in path
        and "/." not in path
        and "\0" not in path
    ):
        return BlockName(path)  # already normalized (the common case: names a program computed)
    if "\0" in path:
        raise InvalidName(f"{path!r}: names cannot contain NUL bytes")
    parts = [p for p in path.split("/") if p]
    for part in parts:
        if part in (".", ".."):
            raise InvalidName(f"{path!r}: '.' and '..' are not allowed in kvfs names")
        if len(part.encode()) > _MAX_COMPONENT:
            raise InvalidName(f"{path!r}: a path component is longer than {_MAX_COMPONENT} bytes")
    name = "/".join(parts)
    if len(name.encode()) > _MAX_PATH:
        raise InvalidName(f"{path[:60]!r}…: the path is longer than {_MAX_PATH} bytes")
    return BlockName(name)


def normalize_valid(paths: Iterable[str]) -> list[BlockName]:
    """Each of *paths* that is a valid name, normalized; the invalid ones are skipped."""
    out = []
    for p in paths:
        try:
            out.append(normalize(p))
        except InvalidName:
            continue
    return out


def parent_of(name: str) -> BlockName:
    """The directory holding *name* (``ROOT`` for a top-level entry)."""
    i = name.rfind("/")
    return BlockName(name[:i] if i >= 0 else "")


def basename(name: str) -> str:
    """The last component of *name*."""
    return name[name.rfind("/") + 1 :]


def split(name: str) -> tuple[BlockName, str]:
    """``(parent, basename)`` of *name*."""
    return parent_of(name), basename(name)


def is_under(name: str, directory: str) -> bool:
    """True when *name* is *directory* itself or lies below it (``ROOT`` holds everything)."""
    return not directory or name == directory or name.startswith(directory + "/")


def is_reserved(name: str) -> bool:
    """True when a component of the normalized *name* starts with :data:`RESERVED_PREFIX`."""
    return name.startswith(RESERVED_PREFIX) or f"/{RESERVED_PREFIX}" in name


def check_creatable(name: str) -> None:
    """Raise :class:`InvalidName` when the normalized *name* may not be created as a block
    or directory: a component of it is reserved for kvfs's own files."""
    if is_reserved(name):
        raise InvalidName(
            f"{name!r}: names with a component starting with {RESERVED_PREFIX!r} are reserved for kvfs's own "
            "temporary files (other nodes would not list it and kvfs gc would delete it); choose another name"
        )
