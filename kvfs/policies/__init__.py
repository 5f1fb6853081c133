"""Eviction policies, found by name through one registry.

``make_policy("lru")`` builds a fresh instance; ``POLICIES`` lists the names. Adding a
policy: a module with one :class:`EvictionPolicy` subclass and a line in ``_REGISTRY``.
"""

from __future__ import annotations

import importlib

from .base import EvictionPolicy

__all__ = ["DEFAULT_POLICY", "POLICIES", "EvictionPolicy", "make_policy"]

# name -> "module:Class", imported on first use.
_REGISTRY: dict[str, str] = {
    "lru": "kvfs.policies.lru:LRU",
    "lfu": "kvfs.policies.lfu:LFU",
    "fifo": "kvfs.policies.fifo:FIFO",
    "sieve": "kvfs.policies.sieve:SIEVE",
    "s3fifo": "kvfs.policies.s3fifo:S3FIFO",
    "arc": "kvfs.policies.arc:ARC",
    "prefix-lru": "kvfs.policies.prefix_lru:PrefixLRU",
    "prefix-s3fifo": "kvfs.policies.prefix_s3fifo:PrefixS3FIFO",
    "prefix-arc": "kvfs.policies.prefix_arc:PrefixARC",
}

POLICIES: tuple[str, ...] = tuple(_REGISTRY)
# Chosen by replaying the Mooncake trace and five generated workloads at four capacities
# (``kvfs bench policy``): best geometric-mean hit ratio. Figures in docs/policies.md.
DEFAULT_POLICY = "prefix-arc"


def make_policy(name: str) -> EvictionPolicy:
    """A new policy instance by registry name; ``KeyError`` names the known ones."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown eviction policy {name!r}; known: {', '.join(POLICIES)}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()
