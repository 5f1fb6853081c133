"""Namespaces' settings at run time and their figures: :meth:`Store.set_quota`,
:meth:`Store.set_retention`, :meth:`Store.enforce_quotas`, :meth:`Store.namespace_statistics`.

:class:`Tenancy` is the store's collaborator for them; the quotas themselves are kept by
the placement (:class:`~kvfs.placement.Placement`) on every put and move, and the
lifetimes by :class:`~kvfs.lifetimes.Lifetimes` (docs/tenants.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from .catalog import Catalog
from .lifetimes import Lifetimes
from .moves import Flow
from .names import normalize
from .namespaces import Namespaces, NamespaceState, NamespaceStatistics, NamespaceTierUse
from .placement import Placement
from .slot import index_of

__all__ = ["Tenancy"]


class Tenancy:
    """Quotas, retention and statistics of *namespaces* (see the module doc), whose
    blocks *placement* keeps; *lifetimes* runs their retention."""

    def __init__(self, placement: Placement, catalog: Catalog, namespaces: Namespaces, lifetimes: Lifetimes) -> None:
        self.placement = placement
        self.catalog = catalog
        self.slots = placement.slots
        self.namespaces = namespaces
        self.lifetimes = lifetimes

    def set_quota(self, path: str, tier: str, quota: int | None) -> NamespaceStatistics:
        """Give namespace *path* (made now if the config has none there) a quota of
        *quota* bytes in *tier* (None: none). Lowering it below the namespace's use
        evicts its blocks there by policy now (demoting as usual); blocks that cannot go
        (pinned, busy) stay, and new ones are refused until it is under. Not kept across
        a restart: put quotas to keep in the config."""
        k = index_of(self.slots, tier)
        if quota is not None and quota < 0:
            raise ValueError(f"a quota is a size in bytes, not {quota}")
        p = self.placement
        with p.locked():
            ns = self.namespaces.ensure(path)
            p.set_quota(ns, self.slots[k], quota)
            if ns.path not in self.catalog.blocks:
                self.catalog.ensure_dir(ns.path)
        self.enforce_quotas([ns])
        return self.namespace_statistics(ns.path)[0]

    def set_retention(self, path: str, seconds: float | None) -> NamespaceStatistics:
        """Give namespace *path* a retention of *seconds* since last access (None: keep
        blocks); the next :meth:`sweep` applies it. Not kept across a restart."""
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a retention is longer than 0 seconds (got {seconds})")
        with self.placement.locked():
            ns = self.namespaces.ensure(path)
            ns.retention = seconds
            self.lifetimes.reschedule()
        return self.namespace_statistics(ns.path)[0]

    def enforce_quotas(self, spaces: Sequence[NamespaceState] | None = None) -> None:
        """Evict until every namespace (of *spaces*, default all) is within its quotas,
        as far as unpinned, idle blocks allow (after a restart, or a lowered quota)."""
        self.placement.drive(self._enforce(spaces))

    def _enforce(self, spaces: Sequence[NamespaceState] | None) -> Flow[None]:
        p = self.placement
        for slot in self.slots:
            p.absorb_held(slot)
        for ns in list(self.namespaces) if spaces is None else spaces:
            for slot in self.slots:
                if p.ns_over(ns, slot, 0):
                    yield from p.make_room(slot, 0, ns=ns)

    def namespace_statistics(self, path: str | None = None) -> list[NamespaceStatistics]:
        """A snapshot of every namespace (or of the one at *path*: KeyError if none)."""
        p = self.placement
        with p.locked():
            if path is not None:
                one = self.namespaces.get(normalize(path))
                if one is None:
                    raise KeyError(f"no namespace at {path!r}")
                spaces = [one]
            else:
                spaces = list(self.namespaces)
            for slot in self.slots:
                p.absorb_held(slot)
            out = []
            for ns in spaces:
                t = self.catalog.totals.get(ns.path)
                out.append(
                    NamespaceStatistics(
                        path=ns.path,
                        tiers=tuple(
                            NamespaceTierUse(
                                name=s.name,
                                used=(t.used[s.index] if t else 0) + ns.held[s.index],
                                quota=ns.quota[s.index],
                                blocks=t.copies[s.index] if t else 0,
                                evictions=ns.evictions[s.index],
                            )
                            for s in self.slots
                        ),
                        blocks=t.blocks if t else 0,
                        size=t.size if t else 0,
                        refused=ns.refused,
                        expired=ns.expired,
                        retention=ns.retention,
                        retired=ns.retired,
                        access=ns.access,
                        configured=ns.configured,
                        model=ns.model,
                    )
                )
            return out
