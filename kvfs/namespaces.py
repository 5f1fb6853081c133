"""Namespaces: the subtrees of tenants and models, with their quotas, access and lifetimes.

A namespace is a directory of the mount (a top-level one, or a configured subtree; they
do not nest) with, each optional: a quota per tier in bytes, an access rule
(:class:`~kvfs.access.AccessRule`), a retention time and a retired flag. The table
(:class:`Namespaces`) maps any block name to its namespace in O(depth) dictionary
lookups, and holds per namespace what the store needs to keep its quotas at all times:

- **usage** is not counted twice: it is the catalog's running total of the namespace's
  directory (:class:`~kvfs.catalog.DirTotals`), a dictionary lookup;
- **reservations**: bytes of copies being written into a tier for the namespace right
  now (outside the store's lock) and promised to blocks about to be sealed, so ``used +
  held + reserved <= quota`` holds throughout a two-phase move, as it does against the
  capacity for the tier;
- **held bytes**: dropped copies of its blocks (old versions, deleted or evicted blocks)
  whose memory readers still hold: they take the tier's room until released, so they
  count against its quota (``NamespaceState.held``, kept by the placement from what the
  tier reports, ``Tier.held_changes``);
- **its own eviction order per tier with a quota**: a policy instance holding only the
  namespace's blocks in that tier. The tier's policy is wrapped in a
  :class:`PartitionedPolicy` that tells both (insert, touch, remove), so a namespace over
  its quota evicts its own blocks, by policy, and never another's
  (:meth:`kvfs.placement.Placement.make_room`).

Mutated only under the store's lock; :meth:`Namespaces.of` may be called without it
(the mount asks it for attributes on its loop: dictionary reads).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .access import AccessRule
from .config import NamespaceConfig, namespace_path
from .errors import KvfsError
from .hashing import Namespace, differ_only_by_weights
from .policies import EvictionPolicy, Hint

__all__ = [
    "DEFAULT_MODE",
    "NamespaceState",
    "NamespaceStatistics",
    "Namespaces",
    "PartitionedPolicy",
    "fingerprint_warnings",
]


DEFAULT_MODE = 0o755
"""The mode of everything outside the namespaces with an access rule (directories
``drwxr-xr-x``, blocks ``-rw-r--r--``)."""


@dataclass(eq=False)
class NamespaceState:
    """One namespace as the store keeps it; per-tier lists are indexed by tier index."""

    path: str
    quota: list[int | None]
    """Bytes the namespace may use in each tier (None: only the tier's capacity)."""
    reserved: list[int]
    """Bytes of copies being written into each tier for it now (two-phase moves)."""
    parts: list[EvictionPolicy | None]
    """Its own eviction order of its blocks in each tier that has a quota."""
    access: AccessRule | None = None
    retention: float | None = None
    retired: bool = False
    model: Namespace | None = None
    configured: bool = True
    """From the config (False: created by ``kvfs quota set``, gone at the next start)."""
    evictions: list[int] = field(default_factory=list)
    """Copies evicted from each tier to keep the namespace within its quota there."""
    held: list[int] = field(default_factory=list)
    """Bytes of its blocks' dropped copies that readers still hold in each tier (old
    versions held open): their room is taken, so they count against its quota."""
    refused: int = 0
    """Writes refused (ENOSPC) because every tier that could take them is at its quota."""
    expired: int = 0
    """Blocks removed by the retention sweep (or dropped because it is retired)."""

    def quota_in(self, tier: int) -> int | None:
        return self.quota[tier]


@dataclass(frozen=True, kw_only=True, slots=True)
class NamespaceTierUse:
    """A namespace in one tier: bytes *used* against its *quota* (None: none there; used
    counts its copies and its dropped copies readers still hold), the *blocks* it holds
    there and the *evictions* its quota caused. Unpacks as a tuple in that order."""

    name: str
    used: int
    quota: int | None
    blocks: int
    evictions: int

    def __iter__(self) -> Iterator[Any]:
        return iter((self.name, self.used, self.quota, self.blocks, self.evictions))


@dataclass(frozen=True, kw_only=True, slots=True)
class NamespaceStatistics:
    """A snapshot of one namespace: its use per tier (:class:`NamespaceTierUse`), its
    blocks and payload bytes, and its rules."""

    path: str
    tiers: tuple[NamespaceTierUse, ...]
    blocks: int
    size: int
    refused: int
    expired: int
    retention: float | None
    retired: bool
    access: AccessRule | None
    configured: bool
    model: Namespace | None = None

    def to_json(self) -> dict[str, Any]:
        a = self.access
        return {
            "path": self.path,
            "tiers": {
                t: {"used": used, "quota": quota, "blocks": n, "evictions": ev} for t, used, quota, n, ev in self.tiers
            },
            "blocks": self.blocks,
            "size": self.size,
            "refused": self.refused,
            "expired": self.expired,
            "retention": self.retention,
            "retired": self.retired,
            "owner": None if a is None else a.uid,
            "group": None if a is None else a.gid,
            "mode": None if a is None else f"{a.mode:04o}",
            "configured": self.configured,
            "model": None if self.model is None else self.model.model,
            "weights": None if self.model is None else self.model.weights or None,
        }


class Namespaces:
    """The namespaces of one store over the tiers named *tier_names* (hottest first).

    *policy_factory* builds the per-namespace eviction orders (the store's, so they use
    its policy and clock); *uid*/*gid* fill an access rule's owner or group when the
    config leaves one out (the mounting user), and own everything outside the namespaces
    with rules (:attr:`default`).
    """

    def __init__(
        self,
        configs: Iterable[NamespaceConfig] = (),
        tier_names: Sequence[str] = (),
        *,
        policy_factory: Callable[[], EvictionPolicy] | None = None,
        uid: int = 0,
        gid: int = 0,
    ) -> None:
        self.tier_names = list(tier_names)
        self.policy_factory = policy_factory
        self.default = AccessRule(uid=uid, gid=gid, mode=DEFAULT_MODE)
        """The rule of every name outside the namespaces with an access rule: the mounting
        user's, ``0755`` (everyone reads, the owner writes, pins and evicts)."""
        self._by_path: dict[str, NamespaceState] = {}
        self._depth = 0
        for c in configs:
            quota: list[int | None] = [c.quota.get(t) for t in self.tier_names]
            self._add(
                NamespaceState(
                    path=c.path,
                    quota=quota,
                    reserved=[0] * len(self.tier_names),
                    parts=[None] * len(self.tier_names),
                    access=c.access(uid, gid),
                    retention=c.retention,
                    retired=c.retired,
                    model=c.model,
                    evictions=[0] * len(self.tier_names),
                    held=[0] * len(self.tier_names),
                )
            )

    def _add(self, ns: NamespaceState) -> None:
        self._by_path[ns.path] = ns
        self._depth = max(self._depth, ns.path.count("/") + 1)

    def __bool__(self) -> bool:
        return bool(self._by_path)

    def __len__(self) -> int:
        return len(self._by_path)

    def __iter__(self) -> Iterator[NamespaceState]:
        return iter(list(self._by_path.values()))

    def get(self, path: str) -> NamespaceState | None:
        return self._by_path.get(path)

    def of(self, name: str) -> NamespaceState | None:
        """The namespace holding *name* (a block or directory name; itself included), or None."""
        by_path = self._by_path
        if not by_path:
            return None
        if self._depth == 1:
            return by_path.get(name.partition("/")[0])
        i = -1
        for _ in range(self._depth):
            i = name.find("/", i + 1)
            ns = by_path.get(name if i < 0 else name[:i])
            if ns is not None or i < 0:
                return ns
        return None

    def rule(self, name: str | None) -> AccessRule:
        """The access rule that decides for *name* (a block or directory; None: no name):
        its namespace's, or :attr:`default` outside every namespace with one. The mount's
        attributes and every access check (mount and client socket) ask this."""
        if name and self._by_path:
            ns = self.of(name)
            if ns is not None and ns.access is not None:
                return ns.access
        return self.default

    def rules(self) -> list[AccessRule]:
        """Every access rule (for :func:`kvfs.access.may_map_arena`)."""
        return [ns.access for ns in self._by_path.values() if ns.access is not None]

    def ensure(self, path: str) -> NamespaceState:
        """The namespace at *path*, created (with no quota and no rules) when there is none.
        Raises :class:`~kvfs.errors.ConfigError` when *path* lies inside or around another."""
        path = namespace_path("namespace", path, self._by_path)
        ns = self._by_path.get(path)
        if ns is not None:
            return ns
        n = len(self.tier_names)
        ns = NamespaceState(
            path=path,
            quota=[None] * n,
            reserved=[0] * n,
            parts=[None] * n,
            evictions=[0] * n,
            held=[0] * n,
            configured=False,
        )
        self._add(ns)
        return ns

    def new_part(self) -> EvictionPolicy:
        if self.policy_factory is None:
            raise KvfsError("this namespace table has no policy factory for quotas")
        return self.policy_factory()


class PartitionedPolicy(EvictionPolicy):
    """A tier's eviction policy that also keeps, for each namespace with a quota in the
    tier, that namespace's own order (see the module doc). Victims of the tier as a whole
    come from *inner*; :meth:`part` gives a namespace's. Every call stays O(1) plus one
    namespace lookup."""

    name = "partitioned"

    def __init__(self, inner: EvictionPolicy, namespaces: Namespaces, tier: int) -> None:
        self.inner = inner
        self.namespaces = namespaces
        self.tier = tier

    def _part(self, key: Hashable) -> EvictionPolicy | None:
        if not isinstance(key, str):
            return None
        ns = self.namespaces.of(key)
        return None if ns is None else ns.parts[self.tier]

    def part(self, ns: NamespaceState) -> EvictionPolicy | None:
        return ns.parts[self.tier]

    def insert(self, key: Hashable, size: int = 0, parent: Hashable = None) -> None:
        self.inner.insert(key, size, parent)
        part = self._part(key)
        if part is not None:
            part.insert(key, size, parent)

    def touch(self, key: Hashable) -> None:
        self.inner.touch(key)
        part = self._part(key)
        if part is not None:
            part.touch(key)

    def remove(self, key: Hashable) -> None:
        self.inner.remove(key)
        part = self._part(key)
        if part is not None:
            part.remove(key)

    def victim(self):  # type: ignore[no-untyped-def]  # as the interface's: any key, or None
        return self.inner.victim()

    def admit(self, key: Hashable, parent: Hashable = None, *, hits: int = 0, idle: float | None = None) -> bool:
        return self.inner.admit(key, parent, hits=hits, idle=idle)

    def hint(self, keys: Iterable[Hashable], when: Hint) -> None:
        keys = list(keys)
        self.inner.hint(keys, when)
        by_part: dict[int, tuple[EvictionPolicy, list[Hashable]]] = {}
        for k in keys:
            part = self._part(k)
            if part is not None:
                by_part.setdefault(id(part), (part, []))[1].append(k)
        for part, ks in by_part.values():
            part.hint(ks, when)

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, key: object) -> bool:
        return key in self.inner


def fingerprint_warnings(configs: Sequence[NamespaceConfig]) -> list[str]:
    """One sentence per pair of live namespaces whose models differ only by the weights
    fingerprint: the older one holds KV computed with weights no longer served."""
    out = []
    live = [(i, c) for i, c in enumerate(configs) if c.model is not None and not c.retired]
    for k, (i, a) in enumerate(live):
        for j, b in live[k + 1 :]:
            assert a.model is not None and b.model is not None
            if differ_only_by_weights(a.model, b.model):
                out.append(
                    f"namespaces[{i}] ({a.path}) and namespaces[{j}] ({b.path}) hold model {a.model.model!r} "
                    f"with the same KV layout and different weights ({a.model.weights or 'none given'} vs "
                    f"{b.model.weights or 'none given'}): the one no longer served holds stale KV; mark it "
                    "retired = true and run kvfs gc"
                )
    return out
