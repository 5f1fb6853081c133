"""A kvfs secondary tier for vLLM's tiered offloading (``vllm.v1.kv_offload.tiering``).

vLLM's ``OffloadingConnector`` with ``TieringOffloadingSpec`` keeps KV chunks in a CPU
(primary) tier and cascades them to secondary tiers; this is one, loaded by module path
(no fork, no registration)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 10737418240,
        "secondary_tiers": [{"type": "KvfsTier", "module_path": "kvfs.gpu.vllm_tier",
                             "kvfs_path": "/mnt/kvfs"}]}}'

- **Names.** One kvfs block per chunk of the primary tier (one row of its memoryview),
  named ``<kvfs_namespace>/<model>_<digest>_r<rank>_g<group>/<ab>/<chunk hash hex>``. The
  digest is vLLM's own (``FileMapper`` with ``parallel_agnostic``, as its ``fs`` tier):
  model, dtype, tokens per hash, chunk size, KV groups and the canonical layout; TP/PP
  sizes and the rank drop out when vLLM certifies the chunk's bytes as independent of the
  parallel layout, so the same prefix stored from any node or TP layout is one block. A
  block is the chunk's bytes, then a 68-byte trailer (magic, the digest, the key) that
  must match on load, so bytes under another name are never loaded.
- **Lookups** never block the scheduler: ``lookup`` answers ``RETRY`` for a key it has
  not seen, and every request's new keys go to the daemon in one ``Client.lookup`` per
  request from a worker thread at the end of the step (``on_schedule_end``); a key not
  answered within ``kvfs_timeout_s`` is a ``MISS``, and while the daemon is down every
  lookup is a ``MISS`` at once.
- **Loads** (``submit_load``): one ``Client.read_into`` per job, straight from the arena
  (or a disk tier's verified block file) into the primary tier's rows; a block that is
  gone, short, of another layout or fails its checksum fails only its key
  (``JobResult.successful_keys`` keeps the others) and is a miss from then on.
- **Stores** (``submit_store``): one ``lookup`` of the job's keys, then one ``Client.put``
  of those kvfs does not hold, gathered from the primary rows into the arena (each
  block's parent in its request's chain given for prefix-aware eviction).
- **Never a hang.** Every daemon call runs in one of two worker threads (reads: lookups
  and loads; writes: stores) and waits at most ``kvfs_timeout_s``; a daemon that stops
  answering fails the job in flight, every queued job and lookup fails at once after
  that, and the tier reconnects at most every ``kvfs_reconnect_s`` seconds
  (:class:`kvfs.client.link.Link`).
- **Medium and locality** as the mount is: ``STORAGE`` when it has a persistent tier
  (``CPU`` for a DRAM-only mount), ``LOCAL`` unless it has a shared tier (``REMOTE``:
  what this tier stores other nodes can read); ``locality`` in the config overrides.
- **Stats**: blocks loaded, failed, stored, skipped and lookups answered reach vLLM's own
  metrics (``get_stats``: ``vllm:kv_offload_kvfs_*`` counters, labelled by tier).

Settings (the tier's config dict, beside ``type`` and ``module_path``): ``kvfs_path``
(required), ``kvfs_namespace`` (``vllm-tier``), ``kvfs_timeout_s`` (5),
``kvfs_reconnect_s`` (5), ``kvfs_verify`` (check DRAM copies' checksums too; false),
``kvfs_copy`` (read and write through a private copy buffer; false), ``locality``,
``enable_kv_events`` (``BlockStored`` events for what this tier stored, as the ``fs``
tier's). See docs/engine-vllm-tier.md.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import queue
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    get_offload_block_hash,
    get_offload_group_idx,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvfs.client import BatchError, Client
from kvfs.client.link import Link
from kvfs.errors import KvfsError

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = ["KvfsTier", "TierNames", "TierSettings"]

logger = logging.getLogger("vllm.kvfs_tier")

MAGIC = b"KVFSTIER"
#: magic, format version, key length, the namespace digest (16 bytes), the key (up to 36): 68 bytes
TRAILER = struct.Struct("<8sII16s36s")
VERSION = 1


class Metrics:
    """The tier's counters in vLLM's metrics (labelled by tier type)."""

    LOADED = "vllm:kv_offload_kvfs_loaded_blocks"
    LOAD_FAILED = "vllm:kv_offload_kvfs_load_failed_blocks"
    STORED = "vllm:kv_offload_kvfs_stored_blocks"
    STORE_FAILED = "vllm:kv_offload_kvfs_store_failed_blocks"
    STORE_SKIPPED = "vllm:kv_offload_kvfs_store_skipped_blocks"
    LOOKUP_HITS = "vllm:kv_offload_kvfs_lookup_hits"
    LOOKUP_MISSES = "vllm:kv_offload_kvfs_lookup_misses"
    LOOKUP_TIMEOUTS = "vllm:kv_offload_kvfs_lookup_timeouts"
    DAEMON_LOST = "vllm:kv_offload_kvfs_daemon_lost"

    DOCS: ClassVar[dict[str, str]] = {
        LOADED: "Blocks the kvfs tier loaded into the primary tier.",
        LOAD_FAILED: "Blocks the kvfs tier could not load (gone, damaged, daemon down): recomputed.",
        STORED: "Blocks the kvfs tier stored.",
        STORE_FAILED: "Blocks the kvfs tier could not store (no space, daemon down).",
        STORE_SKIPPED: "Blocks kvfs held already when the tier was asked to store them.",
        LOOKUP_HITS: "Keys the kvfs tier's lookups found.",
        LOOKUP_MISSES: "Keys the kvfs tier's lookups did not find (or answered while the daemon was down).",
        LOOKUP_TIMEOUTS: "Keys the daemon did not answer within kvfs_timeout_s: misses.",
        DAEMON_LOST: "Times the kvfs tier lost its session with the daemon.",
    }


@dataclass(frozen=True, kw_only=True)
class TierSettings:
    """The kvfs keys of the tier's config dict (parsed once, at construction)."""

    path: str
    namespace: str = "vllm-tier"
    timeout_s: float = 5.0
    reconnect_s: float = 5.0
    verify: bool = False
    copy: bool = False

    @classmethod
    def parse(cls, config: dict[str, Any]) -> TierSettings:
        known = {f"kvfs_{f.name}": f for f in fields(cls)}
        unknown = sorted(k for k in config if k not in known)
        if unknown:
            raise ValueError(
                f"KvfsTier: unknown key(s) {', '.join(unknown)} in the tier's config "
                f"(known: {', '.join(sorted(known))}, locality, enable_kv_events)"
            )
        if not config.get("kvfs_path"):
            raise ValueError(
                'KvfsTier needs "kvfs_path" in its tier config: the kvfs mountpoint (or a path in it, '
                "or the daemon's control socket)"
            )
        values: dict[str, Any] = {}
        for key, f in known.items():
            if key not in config:
                continue
            v = config[key]
            if f.type in ("bool", bool):
                if not isinstance(v, bool):
                    raise ValueError(f"KvfsTier: {key} = {v!r}: expected true or false")
            elif f.type in ("float", float):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise ValueError(f"KvfsTier: {key} = {v!r}: expected a number of seconds > 0")
                v = float(v)
            elif not isinstance(v, str) or not v or (f.name == "namespace" and not _plain(v)):
                raise ValueError(f"KvfsTier: {key} = {v!r}: expected a non-empty string (a name, no '..')")
            values[f.name] = v
        return cls(**values)


def _plain(s: str) -> bool:
    return all(part not in ("", ".", "..") for part in s.split("/"))


class TierNames:
    """Chunk keys -> kvfs names, and the trailer a chunk's block must end with."""

    def __init__(self, spec: OffloadingSpec, prefix: str) -> None:
        mapper = FileMapper.from_offloading_spec(
            root_dir="", offloading_spec=spec, blocks_per_file=spec.blocks_per_chunk, parallel_agnostic=True
        )
        self.fields = mapper.get_run_config()
        self.rank = mapper.rank
        base = mapper.base_path.lstrip("/")  # <model with / as _>_<digest>
        self.base = f"{prefix}/{base}"
        self.digest = hashlib.blake2b(json.dumps(self.fields, sort_keys=True).encode(), digest_size=16).digest()
        self._prefixes: dict[int, str] = {}

    def namespace(self, group: int) -> str:
        ns = self._prefixes.get(group)
        if ns is None:
            ns = self._prefixes[group] = f"{self.base}_r{self.rank}_g{group}"
        return ns

    def of(self, key: OffloadKey) -> str:
        h = get_offload_block_hash(key).hex()
        return f"{self.namespace(get_offload_group_idx(key))}/{h[:2]}/{h}"

    def trailer(self, key: OffloadKey) -> bytes:
        return TRAILER.pack(MAGIC, VERSION, len(key), self.digest, bytes(key)[:36])

    @property
    def config_name(self) -> str:
        """Where the run's identity (vLLM's config.json fields) is kept, for operators."""
        return f"{self.base}.config.json"


@dataclass
class _Job:
    """A load or store in a worker thread; its result goes to the finished queue."""

    job: TransferJob
    names: list[str]
    rows: list[int]


class _Worker:
    """One thread running callables in order (a read or a write queue)."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], None]) -> None:
        with self._cond:
            self._pending += 1
        self._q.put(fn)

    @property
    def busy(self) -> bool:
        return self._pending > 0

    def wait_idle(self) -> None:
        with self._cond:
            while self._pending:
                self._cond.wait()

    def stop(self) -> None:
        self._q.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            fn = self._q.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:  # a bug must not stop the queue: the job's own code reports its failure
                logger.exception("kvfs tier: a worker task failed")
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()


class KvfsTier(SecondaryTierManager):
    """A secondary tier of vLLM's tiered offloading on kvfs (module docstring)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return {
            name: OffloadingCounterMetadata(documentation=doc, labelnames=("tier",))
            for name, doc in Metrics.DOCS.items()
        }

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        locality: str | None = None,
        enable_kv_events: bool = False,
        backpressure_detector: BackpressureDetector | None = None,
        **config: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.settings = TierSettings.parse(config)
        self.names = TierNames(offloading_spec, self.settings.namespace)
        self._row = self.block_size_bytes
        self._block = self._row + TRAILER.size
        self._flat = primary_kv_view.cast("B") if primary_kv_view.format != "B" else primary_kv_view
        self._label = (tier_type,)
        s = self.settings
        self.link = Link(self._connect, s.path, reconnect_s=s.reconnect_s, what=f"kvfs tier {tier_type}")
        try:
            client = self.link.open()
        except KvfsError as exc:
            raise KvfsError(f"KvfsTier: kvfs_path {s.path!r}: {exc}") from exc
        self._set_medium(client, locality)
        self.events: list[OffloadingEvent] | None = None
        if enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events:
            self.events = []
        # scheduler-thread state: per key, its lookup's verdict (None: asked, not answered)
        self._verdicts: dict[OffloadKey, bool | None] = {}
        self._asked_at: dict[OffloadKey, float] = {}
        self._askers: dict[OffloadKey, set[str]] = {}
        self._req_keys: dict[str, set[OffloadKey]] = {}
        self._batch: dict[str, list[OffloadKey]] = {}
        self._load_keys: dict[int, list[OffloadKey]] = {}
        self._stored_keys: dict[int, list[OffloadKey]] = {}
        # worker -> scheduler
        self._answers: queue.SimpleQueue[list[tuple[OffloadKey, bool]]] = queue.SimpleQueue()
        self._finished: queue.SimpleQueue[tuple[JobResult, list[OffloadKey]]] = queue.SimpleQueue()
        self._stats = OffloadingConnectorStats()
        self._stats_lock = threading.Lock()
        self._lost_seen = 0
        self._reads = _Worker(f"kvfs_tier_read_{tier_type}")
        self._writes = _Worker(f"kvfs_tier_write_{tier_type}")
        self._write_config(client)
        logger.info(
            "kvfs tier %s: chunks of %d bytes under %s on %s (medium %s, locality %s)",
            tier_type,
            self._row,
            self.names.base,
            client.mountpoint,
            self.medium.value,
            self.locality.value if self.locality else None,
        )

    # -- setup -------------------------------------------------------------------------

    def _connect(self, where: Any) -> Client:
        s = self.settings
        return Client(where, write=True, name=f"vllm tier {self.tier_type}", timeout=s.timeout_s, copy=s.copy)

    def _set_medium(self, client: Client, locality: str | None) -> None:
        tiers = client.welcome.tiers
        persistent = any(t.persistent for t in tiers)
        self.medium = Medium.STORAGE if persistent else Medium.CPU  # type: ignore[misc]
        self.cache_hit_source = CacheHitSource.DISK if persistent else CacheHitSource.HOST
        if locality is not None:
            self.locality = Locality(locality)
        else:
            self.locality = Locality.REMOTE if any(t.shared for t in tiers) else Locality.LOCAL

    def _write_config(self, client: Client) -> None:
        """The run's identity beside its blocks (as the fs tier's config.json), once."""
        name = self.names.config_name
        try:
            if not client.lookup([name]).present(0):
                client.put([name], [json.dumps(self.names.fields, indent=2, sort_keys=True).encode()])
        except KvfsError as exc:
            logger.warning("kvfs tier %s: could not write %s: %s", self.tier_type, name, exc)

    def _count(self, metric: str, n: int) -> None:
        if n:
            with self._stats_lock:
                self._stats.increase_counter(metric, n, self._label)

    # -- lookups (scheduler thread) ------------------------------------------------------

    def _drain_answers(self) -> None:
        while True:
            try:
                batch = self._answers.get_nowait()
            except queue.Empty:
                return
            for key, found in batch:
                if key in self._verdicts and self._verdicts[key] is None:
                    self._verdicts[key] = found
                    self._asked_at.pop(key, None)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._drain_answers()
        req = req_context.req_id
        self._askers.setdefault(key, set()).add(req)
        self._req_keys.setdefault(req, set()).add(key)
        verdict = self._verdicts.get(key)
        if verdict is not None:
            return LookupResult.HIT if verdict else LookupResult.MISS
        if self.link.down:
            self._count(Metrics.LOOKUP_MISSES, 1)
            return LookupResult.MISS
        asked = self._asked_at.get(key)
        now = time.monotonic()
        if asked is None:
            if key not in self._verdicts:
                self._verdicts[key] = None
                self._asked_at[key] = now
                self._batch.setdefault(req, []).append(key)
            return LookupResult.RETRY
        if now - asked > self.settings.timeout_s:
            self._count(Metrics.LOOKUP_TIMEOUTS, 1)
            return LookupResult.MISS  # the answer, when it comes, serves later lookups
        return LookupResult.RETRY

    def on_schedule_end(self, context: Any) -> None:
        """Send this step's new keys: one lookup per request, in the read thread."""
        self._drain_answers()
        batch, self._batch = self._batch, {}
        for keys in batch.values():
            self._reads.submit(functools.partial(self._run_lookup, keys))

    def _run_lookup(self, keys: list[OffloadKey]) -> None:
        names = [self.names.of(k) for k in keys]
        try:
            found = self.link.call(lambda c: c.lookup(names))
            sizes = found.sizes
        except KvfsError as exc:
            logger.warning("kvfs tier %s: lookup of %d keys failed: %s (misses)", self.tier_type, len(keys), exc)
            sizes = [-1] * len(keys)
        answers = [(k, size == self._block) for k, size in zip(keys, sizes, strict=True)]
        hits = sum(found for _, found in answers)
        self._count(Metrics.LOOKUP_HITS, hits)
        self._count(Metrics.LOOKUP_MISSES, len(keys) - hits)
        self._answers.put(answers)

    def _forget(self, keys: Iterable[OffloadKey], req: str) -> None:
        for key in keys:
            askers = self._askers.get(key)
            if askers is None:
                continue
            askers.discard(req)
            if not askers:
                del self._askers[key]
                self._verdicts.pop(key, None)
                self._asked_at.pop(key, None)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._forget(self._req_keys.pop(req_context.req_id, ()), req_context.req_id)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    # -- loads and stores ----------------------------------------------------------------

    def _row_of(self, chunk: int) -> memoryview:
        a = chunk * self._row
        return self._flat[a : a + self._row]

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        self._load_keys[job_metadata.job_id] = keys
        job = _Job(job_metadata, [self.names.of(k) for k in keys], [int(c) for c in job_metadata.chunk_ids])
        self._reads.submit(lambda: self._run_load(job, keys))

    def _run_load(self, job: _Job, keys: list[OffloadKey]) -> None:
        t0 = time.monotonic()
        n = len(keys)
        tails = np.zeros((n, TRAILER.size), np.uint8)
        dests = [[self._row_of(r), tails[i]] for i, r in enumerate(job.rows)]
        why: list[str | None] = [None] * n
        # errors as text: an exception kept here would hold this frame (and the rows'
        # views) in a cycle past the primary tier's unmapping
        try:
            sizes: Sequence[int | str] = self.link.call(
                lambda c: c.get_into(job.names, dests, verify=self.settings.verify)
            )
        except BatchError as exc:
            sizes = [r if isinstance(r, int) else f"{type(r).__name__}: {r}" for r in exc.results]
        except KvfsError as exc:
            sizes = [f"{type(exc).__name__}: {exc}"] * n
        ok = []
        for i, size in enumerate(sizes):
            if isinstance(size, str):
                why[i] = size
            elif size != self._block:
                why[i] = f"{size} bytes, not {self._block}"
            elif tails[i].tobytes() != self.names.trailer(keys[i]):
                why[i] = "its trailer names another key or layout"
            else:
                ok.append(keys[i])
        failed = [i for i in range(n) if why[i] is not None]
        if failed:
            logger.warning(
                "kvfs tier %s: %d of %d blocks not loaded (first: %s: %s): vLLM recomputes them",
                self.tier_type,
                len(failed),
                n,
                job.names[failed[0]],
                why[failed[0]],
            )
        self._count(Metrics.LOADED, len(ok))
        self._count(Metrics.LOAD_FAILED, len(failed))
        result = JobResult(
            job_id=job.job.job_id,
            success=not failed,
            successful_keys=tuple(ok) if failed and ok else None,
            transfer_time=time.monotonic() - t0,
            transfer_bytes=len(ok) * self._row,
        )
        self._finished.put((result, [keys[i] for i in failed]))

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        if self.events is not None:
            self._stored_keys[job_metadata.job_id] = keys
        job = _Job(job_metadata, [self.names.of(k) for k in keys], [int(c) for c in job_metadata.chunk_ids])
        parents = _parents(keys, job.names, job_metadata.req_context)
        self._writes.submit(lambda: self._run_store(job, keys, parents))

    def _run_store(self, job: _Job, keys: list[OffloadKey], parents: list[str | None]) -> None:
        t0 = time.monotonic()
        n = len(keys)
        try:
            found = self.link.call(lambda c: c.lookup(job.names))
            todo = [i for i in range(n) if found.sizes[i] != self._block]
            bufs = [[self._row_of(job.rows[i]), self.names.trailer(keys[i])] for i in todo]
            failed = 0
            if todo:
                try:
                    self.link.call(
                        lambda c: c.put([job.names[i] for i in todo], bufs, parents=[parents[i] for i in todo])
                    )
                except BatchError as exc:
                    failed = len(exc.errors)
                    logger.warning(
                        "kvfs tier %s: %d of %d blocks not stored: %s", self.tier_type, failed, len(todo), exc
                    )
        except KvfsError as exc:
            logger.warning("kvfs tier %s: store of %d blocks failed: %s", self.tier_type, n, exc)
            todo, failed = list(range(n)), n
        self._count(Metrics.STORED, len(todo) - failed)
        self._count(Metrics.STORE_FAILED, failed)
        self._count(Metrics.STORE_SKIPPED, n - len(todo))
        result = JobResult(
            job_id=job.job.job_id,
            success=not failed,
            transfer_time=time.monotonic() - t0,
            transfer_bytes=(len(todo) - failed) * self._row,
        )
        self._finished.put((result, []))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        while True:
            try:
                result, failed = self._finished.get_nowait()
            except queue.Empty:
                break
            self._load_keys.pop(result.job_id, None)
            for key in failed:  # a block that failed to load is a miss from now on (no promotion loop)
                if key in self._verdicts:
                    self._verdicts[key] = False
            stored = self._stored_keys.pop(result.job_id, None)
            if stored and result.success and self.events is not None:
                self.events.append(
                    OffloadingEvent(keys=stored, medium=self.medium, removed=False, locality=self.locality)
                )
            out.append(result)
        return out

    def has_pending_work(self) -> bool:
        return self._reads.busy or self._writes.busy or any(v is None for v in self._verdicts.values())

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events:
            out, self.events = self.events, []
            yield from out

    def drain_jobs(self) -> None:
        self._reads.wait_idle()
        self._writes.wait_idle()

    def get_stats(self) -> OffloadingConnectorStats | None:
        lost = self.link.lost
        with self._stats_lock:
            if lost > self._lost_seen:
                self._stats.increase_counter(Metrics.DAEMON_LOST, lost - self._lost_seen, self._label)
                self._lost_seen = lost
            if self._stats.is_empty():
                return None
            out, self._stats = self._stats, OffloadingConnectorStats()
        return out

    def shutdown(self) -> None:
        self._reads.stop()
        self._writes.stop()
        self.link.close()
        if self._flat is not self._primary_kv_view:
            self._flat.release()  # the primary tier unmaps its region next


def _parents(keys: list[OffloadKey], names: list[str], ctx: ReqContext) -> list[str | None]:
    """Each key's parent in its request's chain: the job's key just before it in token
    order (vLLM records each key's end token in the request's context), else None."""
    pos = [ctx.get_offload_key_position(k) for k in keys]
    if any(p is None for p in pos):
        return [None, *names[:-1]] if len(keys) > 1 else [None]
    order = sorted(range(len(keys)), key=lambda i: pos[i])
    out: list[str | None] = [None] * len(keys)
    for a, b in itertools.pairwise(order):
        out[b] = names[a]
    return out
