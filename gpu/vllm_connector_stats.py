"""What :class:`kvfs.gpu.vllm_connector.KvfsConnector` counts, in vLLM's own metrics.

vLLM collects a connector's ``get_kv_connector_stats()`` from every worker after each
step, aggregates them (:meth:`KvfsConnectorStats.aggregate`), prints them in its periodic
"KV Transfer metrics:" log line (:meth:`KvfsConnectorStats.reduce`) and, on a server,
records them as Prometheus counters (:class:`KvfsPromMetrics`, one per engine):
``vllm:kvfs_loaded_blocks``, ``vllm:kvfs_load_failed_blocks``, ``vllm:kvfs_saved_blocks``,
``vllm:kvfs_save_failed_blocks``, ``vllm:kvfs_load_seconds``, ``vllm:kvfs_save_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.v1.metrics.utils import create_metric_per_engine

__all__ = ["COUNTERS", "KvfsConnectorStats", "KvfsPromMetrics"]

#: stat -> its Prometheus counter's name and help
COUNTERS: dict[str, tuple[str, str]] = {
    "loaded": ("vllm:kvfs_loaded_blocks", "Blocks KvfsConnector loaded from kvfs."),
    "load_failed": (
        "vllm:kvfs_load_failed_blocks",
        "Blocks KvfsConnector could not load (gone, damaged, daemon down): vLLM recomputed them.",
    ),
    "saved": ("vllm:kvfs_saved_blocks", "Blocks KvfsConnector saved to kvfs."),
    "save_failed": ("vllm:kvfs_save_failed_blocks", "Blocks KvfsConnector could not save (later misses)."),
    "load_s": ("vllm:kvfs_load_seconds", "Seconds KvfsConnector spent loading (layer-wise: until the last layer)."),
    "save_s": ("vllm:kvfs_save_seconds", "Seconds KvfsConnector spent saving (layer-wise: until the commit)."),
}


@dataclass
class KvfsConnectorStats(KVConnectorStats):
    """Counters since the last collection (``data``: stat -> number; see :data:`COUNTERS`)."""

    def __post_init__(self) -> None:
        for k in COUNTERS:
            self.data.setdefault(k, 0)

    def add(self, key: str, value: float) -> None:
        self.data[key] = self.data.get(key, 0) + value

    def reset(self) -> None:
        self.data: dict[str, int | float] = dict.fromkeys(COUNTERS, 0)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return {f"kvfs_{k}": round(v, 6) if isinstance(v, float) else v for k, v in self.data.items()}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvfsPromMetrics(KVConnectorPromMetrics):
    """The counters of :data:`COUNTERS`, per engine."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters: dict[str, dict[int, Any]] = {}
        for key, (name, doc) in COUNTERS.items():
            counter = self._counter_cls(name=name, documentation=doc, labelnames=labelnames)
            self.counters[key] = create_metric_per_engine(counter, self.per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in transfer_stats_data.items():
            per_engine = self.counters.get(key)
            if per_engine is not None and value:
                per_engine[engine_idx].inc(value)
