"""Garbage collection of shared tiers: what crashed writers and retired namespaces left.

A shared tier (a posix directory, a bucket) is written by every node and owned by none,
so nothing in one daemon cleans it. ``kvfs gc`` does, from any node, with
:func:`collect` over one tier's :meth:`~kvfs.tier.Tier.inventory`:

- **leftovers** of writes that never finished (temporary files of a writer that died,
  unfinished multipart uploads) older than ``tmp_age``: a younger one may belong to a
  writer still at it;
- **blocks of retired namespaces** (:class:`~kvfs.config.NamespaceConfig` ``retired``,
  or named on the command line) written before ``now - min_age`` (the namespace's
  retention when it has one, else ``min_age``);
- with ``expired``, **blocks past their namespace's retention** by the time they were
  written (a shared tier records no reads: the write time is all it knows).

It never removes a block written within its window: each removal is
:meth:`~kvfs.tier.Tier.expire` with the cutoff, which keeps a copy another node
published since the listing. ``dry_run`` lists and removes nothing. Progress goes to a
callback as the listing advances.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .config import NamespaceConfig, namespace_path
from .errors import KvfsError
from .namespaces import Namespaces
from .tier import StoredObject, Tier
from .units import format_duration

__all__ = ["GcPlan", "GcRemoval", "GcReport", "collect", "with_retired"]


@dataclass(frozen=True, kw_only=True)
class GcPlan:
    """What :func:`collect` removes: see the module doc. Ages are seconds."""

    namespaces: tuple[NamespaceConfig, ...] = ()
    """The config's namespaces (their ``retired`` flags and retentions) and any named retired."""
    tmp_age: float = 3600.0
    min_age: float = 3600.0
    expired: bool = False


@dataclass(frozen=True, slots=True)
class GcRemoval:
    """One thing removed (or, in a dry run, to be removed)."""

    name: str
    why: str
    size: int
    mtime: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "why": self.why, "size": self.size, "mtime": self.mtime}


@dataclass(kw_only=True)
class GcReport:
    """What :func:`collect` found in one tier."""

    tier: str
    dry_run: bool
    scanned: int = 0
    removed: list[GcRemoval] = field(default_factory=list)
    young: int = 0
    """Leftovers and blocks that would go but were written within their window."""
    failed: list[tuple[str, str]] = field(default_factory=list)
    """``(name, error)`` of removals that failed (the tier did not answer, ...)."""

    @property
    def bytes(self) -> int:
        return sum(r.size for r in self.removed)

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "dry_run": self.dry_run,
            "scanned": self.scanned,
            "removed": [r.to_json() for r in self.removed],
            "bytes": self.bytes,
            "young": self.young,
            "failed": [{"name": n, "error": e} for n, e in self.failed],
        }


def collect(
    tier: Tier,
    plan: GcPlan,
    *,
    now: float,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> GcReport:
    """Remove from the shared *tier* what *plan* says (see the module doc), as of *now*
    (seconds since the epoch, the storage's clock). *progress(scanned, removable)* is
    called as the listing goes. Raises :class:`~kvfs.errors.TierUnavailable` if the
    tier cannot be listed; a removal that fails is recorded in the report."""
    table = Namespaces(plan.namespaces)
    report = GcReport(tier=tier.name, dry_run=dry_run)
    for obj in tier.inventory():
        report.scanned += 1
        verdict = _verdict(obj, table, plan, now)
        if verdict is not None:
            cutoff, why = verdict
            if obj.mtime >= cutoff:
                report.young += 1
            elif dry_run:
                report.removed.append(GcRemoval(obj.name, why, obj.size, obj.mtime))
            else:
                _remove(tier, obj, cutoff, why, report)
        if progress is not None:
            progress(report.scanned, len(report.removed))
    return report


def _verdict(obj: StoredObject, table: Namespaces, plan: GcPlan, now: float) -> tuple[float, str] | None:
    """``(cutoff, why)`` when *obj* is garbage if written before the cutoff; else None."""
    if obj.leftover:
        return now - plan.tmp_age, f"leftover of an unfinished write (older than {format_duration(plan.tmp_age)})"
    ns = table.of(obj.name)
    if ns is None:
        return None
    if ns.retired:
        age = ns.retention if ns.retention is not None else plan.min_age
        return now - age, f"namespace {ns.path} is retired (written more than {format_duration(age)} ago)"
    if plan.expired and ns.retention is not None:
        return now - ns.retention, f"written more than {format_duration(ns.retention)} ago (retention of {ns.path})"
    return None


def _remove(tier: Tier, obj: StoredObject, cutoff: float, why: str, report: GcReport) -> None:
    try:
        done = tier.remove_leftover(obj, cutoff) if obj.leftover else tier.expire(obj.name, cutoff)
    except KvfsError as exc:
        report.failed.append((obj.name, str(exc)))
        return
    if done:
        report.removed.append(GcRemoval(obj.name, why, obj.size, obj.mtime))
    else:
        report.young += 1  # published again (or finished) since it was listed


def with_retired(configs: Iterable[NamespaceConfig], paths: Iterable[str]) -> tuple[NamespaceConfig, ...]:
    """*configs* with the namespaces at *paths* (the command line's) marked retired.
    Raises :class:`~kvfs.errors.ConfigError` for a path that is not a usable namespace."""
    out = {c.path: c for c in configs}
    for raw in paths:
        path = namespace_path("--retired", raw, out)
        out[path] = (
            dataclasses.replace(out[path], retired=True) if path in out else NamespaceConfig(path=path, retired=True)
        )
    return tuple(out.values())
