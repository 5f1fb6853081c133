"""Eviction policies, found by name through one registry.

``make_policy("lru")`` builds a fresh instance; ``POLICIES`` lists the names. Adding a
policy: a module with one :class:`EvictionPolicy` subclass and a line in ``_REGISTRY``.
"""

from __future__ import annotations

import importlib

from .base import EvictionPolicy, Hint, PolicyContext, namespace_of_name

__all__ = ["DEFAULT_POLICY", "POLICIES", "EvictionPolicy", "Hint", "PolicyContext", "make_policy", "namespace_of_name"]

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
    "session-arc": "kvfs.policies.session_arc:SessionARC",
}

POLICIES: tuple[str, ...] = tuple(_REGISTRY)
# Chosen by replaying the Mooncake trace and the generated workloads at 1, 2, 5 and 10 %
# of their blocks, alone and as DRAM over disk (``kvfs bench policy``): the hit ratio of
# ``prefix-arc`` or better, fewer SSD writes per hit, 1.7x its speed. docs/policies.md.
DEFAULT_POLICY = "session-arc"


def make_policy(name: str, *, context: PolicyContext | None = None) -> EvictionPolicy:
    """A new policy instance by registry name; ``KeyError`` names the known ones.

    *context* (a clock, the tuning; :class:`PolicyContext` defaults when ``None``) goes
    to the policies that use it (``takes_context``); the others ignore it.
    """
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown eviction policy {name!r}; known: {', '.join(POLICIES)}") from None
    module, _, cls_name = target.partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    return cls(context or PolicyContext()) if cls.takes_context else cls()
