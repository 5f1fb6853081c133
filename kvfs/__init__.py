"""kvfs: a tiered, content-addressed block filesystem for LLM KV caches.

The core package: names and the hash chain (:mod:`kvfs.hashing`), configuration
(:mod:`kvfs.config`), the catalog, eviction policies and the store that moves bytes
between tiers (:mod:`kvfs.store`). It imports nothing heavy: tiers (``kvfs.tiers``), the
FUSE mount (``kvfs.mount``), engine-side code (``kvfs.gpu``) and the ``kvfs`` command
(``kvfs.tools``) build on it.
"""

__version__ = "0.1.0"
