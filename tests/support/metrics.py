"""A daemon's Prometheus endpoint, read by a real HTTP GET."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from support.deadlines import DEADLINE


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` from a real HTTP GET of /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=DEADLINE) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def tier(m, name: str, t: str, kind: str | None = None) -> float:
    """The sample *name* of tier *t* (and *kind*, where the series carries it) in *m*."""
    labels = [("tier", t)] if kind is None else [("kind", kind), ("tier", t)]
    return m[(name, tuple(sorted(labels)))]
