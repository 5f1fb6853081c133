"""kvfs: a tiered, content-addressed block filesystem for LLM KV caches.

The core package: names and the hash chain (:mod:`kvfs.hashing`), configuration
(:mod:`kvfs.config`), the catalog, eviction policies and the store that moves bytes
between tiers (:mod:`kvfs.store`). It imports nothing heavy: tiers (``kvfs.tiers``), the
FUSE mount (``kvfs.mount``), engine-side code (``kvfs.gpu``) and the ``kvfs`` command
(``kvfs.tools``) build on it.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("kvfs")
    """The installed distribution's version: pyproject.toml's, the one source of truth
    (``kvfs --version``, the daemon's log line at start, ``Pong`` and ``Welcome``)."""
except _metadata.PackageNotFoundError:  # pragma: no cover - imported from a tree not installed
    __version__ = "0+unknown"
