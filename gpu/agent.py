"""The GPU agent: kvfs blocks as device tensors in the engine's process.

:class:`Agent` sits over a :class:`~kvfs.client.Client` and keeps hot blocks in device
memory (:class:`~kvfs.gpu.hbm.DeviceCache`: a capacity in bytes, a kvfs eviction policy,
pins). :meth:`Agent.map` returns one uint8 tensor per block on the agent's device,
loading what is not cached; :meth:`Agent.load_async` does the same in the background and
returns a :class:`Loading` whose per-block :class:`BlockEvent` s fire as each block is in
place and checked, so an engine overlaps loading with compute; :meth:`Agent.store` writes
device blocks back to kvfs (and keeps them cached).

A load leases every missing block in one round trip and lands it by where its copy is
(:mod:`kvfs.gpu.transfer`): arena extents by pinned copies (DMA with CUDA), disk block
files by the configured transfer (kvikio, NIXL, POSIX). Every block is checked where it
landed (:mod:`kvfs.gpu.integrity`) before it is used or cached; a copy that fails is
reported to the daemon (:meth:`Client.suspect`: it re-checks and drops a bad copy) and
the block is leased once more, from its next copy, else it is a miss. Never wrong bytes
in device memory.

The cache follows kvfs through the client's event stream: a block stored anew (replaced)
is re-checked against its current checksum on its next hit (one lease round trip), a
block removed or renamed is dropped. A replacement by another process is seen once its
event arrives (milliseconds); the agent's own stores are seen at once.

``device="cpu"`` runs every part of it without a GPU: the same cache, events and
checks, the arena copied into host tensors, the disk files read by NIXL's POSIX backend
into registered host memory (or ``preadv``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Self, cast

import torch

from kvfs.blockfile import read_header
from kvfs.client import BatchError, Client, Hold
from kvfs.client.buffers import checksum as xxh3
from kvfs.errors import BlockCorrupt, KvfsError
from kvfs.events import EventKind
from kvfs.policies import POLICIES
from kvfs.protocol import Promote
from kvfs.units import parse_size

from .hbm import CacheStats, DeviceCache
from .host_io import host_bytes
from .integrity import matches
from .transfer import TRANSFERS, ArenaCopier, FileLoader, Item, cuda_missing, open_loader

__all__ = ["Agent", "AgentConfig", "BlockEvent", "Loading"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """How an :class:`Agent` keeps and loads blocks.

    - *device*: ``"cuda"``, ``"cuda:N"`` or ``"cpu"`` (everything but the CUDA copies).
    - *capacity*: bytes of blocks the device cache keeps (an int or ``"8GiB"``).
    - *policy*: its eviction policy (:data:`kvfs.policies.POLICIES`).
    - *transfer*: how disk block files are read: ``"auto"`` (kvikio, else NIXL, else POSIX
      reads, probed once), ``"kvikio"``, ``"nixl"`` or ``"posix"``.
    - *promote*: how leases treat blocks whose hottest copy is on disk (``"never"``: read
      the file straight into device memory; ``"always"``/``"policy"`` as the client).
    - *batch*: blocks landed per transfer call; each batch's events fire as it is checked.
    - *watch*: follow the daemon's events to keep the cache coherent (see the module).
    """

    device: str = "cuda"
    capacity: int | str = "4GiB"
    policy: str = "lru"
    transfer: str = "auto"
    promote: str = Promote.NEVER
    batch: int = 8
    watch: bool = True

    def __post_init__(self) -> None:
        cap = parse_size(self.capacity) if isinstance(self.capacity, str) else self.capacity
        if cap < 0:
            raise ValueError(f"capacity must be >= 0 (got {self.capacity!r})")
        object.__setattr__(self, "capacity", cap)
        if self.transfer not in TRANSFERS:
            raise ValueError(f"transfer must be one of {', '.join(TRANSFERS)} (got {self.transfer!r})")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)} (got {self.policy!r})")
        if self.promote not in Promote.ALL:
            raise ValueError(f"promote must be one of {', '.join(Promote.ALL)} (got {self.promote!r})")
        if self.batch < 1:
            raise ValueError("batch must be at least 1")
        try:
            dev = torch.device(self.device)
        except RuntimeError as exc:
            raise ValueError(f"device {self.device!r} is not a torch device: {exc}") from None
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda (got {self.device!r})")


class BlockEvent:
    """Fires once one block of a :class:`Loading` is in place and checked (or failed)."""

    __slots__ = ("_done", "error", "name", "tensor")

    def __init__(self, name: str) -> None:
        self.name = name
        self.tensor: torch.Tensor | None = None
        self.error: KvfsError | None = None
        self._done = threading.Event()

    def _set(self, tensor: torch.Tensor | None, error: KvfsError | None) -> None:
        self.tensor, self.error = tensor, error
        self._done.set()

    def ready(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        """The block's tensor once it is loaded; its error if it failed; ``TimeoutError``."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.name!r} did not load within {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.tensor is not None
        return self.tensor


class Loading:
    """A background load (:meth:`Agent.load_async`): one :class:`BlockEvent` per name,
    in order (``events``); :meth:`result` waits for all of them."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.events = [BlockEvent(n) for n in self.names]

    def done(self) -> bool:
        return all(e.ready() for e in self.events)

    def wait(self, timeout: float | None = None) -> list[torch.Tensor | KvfsError]:
        """Per name its tensor or its error (``TimeoutError`` if not all are done)."""
        out: list[torch.Tensor | KvfsError] = []
        for e in self.events:
            try:
                out.append(e.wait(timeout))
            except KvfsError as exc:
                out.append(exc)
        return out

    def result(self, timeout: float | None = None) -> list[torch.Tensor]:
        """Every block's tensor; :class:`BatchError` (its ``results`` per name) if some failed."""
        res = self.wait(timeout)
        if any(isinstance(r, KvfsError) for r in res):
            raise BatchError("map", list(res))
        return res  # type: ignore[return-value]


class Agent:
    """Blocks of the mount *client* talks to, as tensors on *config.device*."""

    def __init__(self, client: Client, config: AgentConfig | None = None, **overrides: Any) -> None:
        cfg = config or AgentConfig(**overrides)
        if config is not None and overrides:
            raise TypeError("give an AgentConfig or keyword settings, not both")
        self.config = cfg
        self.client = client
        self.device = torch.device(cfg.device)
        if self.device.type == "cuda":
            why = cuda_missing()
            if why:
                raise KvfsError(f"device {cfg.device!r}: {why}; use device='cpu' on this machine")
            if cast("int | None", self.device.index) is None:  # torch types it int; a bare "cuda" has None
                self.device = torch.device("cuda", torch.cuda.current_device())
        self.cache = DeviceCache(int(cfg.capacity), cfg.policy)
        self.loader: FileLoader
        self.loader, self.passed_over = open_loader(cfg.transfer, self.device)
        self.arena = ArenaCopier(client.arena, self.device, writable=client.writable)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._lock = threading.Lock()
        self._gen: dict[str, int] = {}  # bumped by events: a load that overlapped one caches nothing stale
        self._stale: set[str] = set()  # cached, but stored anew since: re-check on the next hit
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvfs-agent-load")
        self._closed = False
        self._watcher: threading.Thread | None = None
        self._events = None
        if cfg.watch:
            self._events = client.events()
            self._watcher = threading.Thread(target=self._watch, name="kvfs-agent-events", daemon=True)
            self._watcher.start()
        self.loads = {"arena": 0, "file": 0, "hit": 0, "corrupt": 0}

    # -- coherence -----------------------------------------------------------------------

    def _watch(self) -> None:
        stream = self._events
        assert stream is not None
        try:
            for ev in stream:
                if ev.kind in (EventKind.STORED, EventKind.REMOVED, EventKind.RENAMED):
                    names = [ev.name, ev.detail] if ev.kind is EventKind.RENAMED and ev.detail else [ev.name]
                    for n in names:
                        with self._lock:
                            self._gen[n] = self._gen.get(n, 0) + 1
                            if ev.kind is EventKind.STORED:
                                self._stale.add(n)
                        if ev.kind is not EventKind.STORED:
                            self.cache.remove(n)
        except (KvfsError, OSError, ValueError):
            pass  # the stream ended (closed, or the daemon went away)
        finally:
            if not self._closed:
                log.warning("kvfs gpu agent: the event stream ended; cached blocks are re-checked on every hit now")
                with self._lock:
                    self._stale.update(self.cache)
                    self._gen = {n: g + 1 for n, g in self._gen.items()}
                    self._watching_lost = True

    _watching_lost = False

    # -- the API -------------------------------------------------------------------------

    def map(self, names: Sequence[str], *, parents: Sequence[str | None] | None = None) -> list[torch.Tensor]:
        """One uint8 tensor per block on the agent's device, loading (and caching) what is
        missing. Raises :class:`BatchError` if some failed (``results``: per name its
        tensor or error — ``BlockNotFound`` for a miss, ``BlockCorrupt`` when no good copy
        was left). Do not write into the tensors: they are the cache's."""
        loading = Loading(names)
        self._run(loading, parents)
        return loading.result()

    def load_async(self, names: Sequence[str], *, parents: Sequence[str | None] | None = None) -> Loading:
        """:meth:`map` in the background: returns at once; wait on ``events[i]`` (or
        :meth:`Loading.result`) before using a block. Blocks already cached are ready at
        once; the others fire batch by batch as they land and pass their check."""
        loading = Loading(names)
        self._serve_hits(loading)
        if not loading.done():
            self._pool.submit(self._run, loading, parents)
        return loading

    def store(
        self, names: Sequence[str], tensors: Sequence[torch.Tensor], *, parents: Sequence[str | None] | None = None
    ) -> None:
        """Write each tensor (any dtype and shape, contiguous; on the agent's device or the
        host) as block *name* (replacing one of that name) and keep a copy cached.
        Raises :class:`BatchError` as :meth:`Client.put` does."""
        names = list(names)
        if len(tensors) != len(names):
            raise ValueError(f"{len(names)} names but {len(tensors)} tensors")
        flat = [_as_bytes(t) for t in tensors]
        hosts = []
        for t in flat:
            if t.device.type == "cpu":
                hosts.append(t)
            else:
                h = torch.empty(t.numel(), dtype=torch.uint8, pin_memory=True)
                h.copy_(t)
                hosts.append(h)
        sums = [xxh3([host_bytes(h)]) for h in hosts]
        with self._lock:
            gens = [self._gen.get(n, 0) for n in names]
        try:
            self.client.put(names, hosts, parents=parents)
        except BatchError as exc:  # the others were stored
            self._cache_stored(names, flat, sums, gens, parents, set(exc.errors))
            raise
        except BaseException:  # nothing is known to be stored: cache none of them
            for n in names:
                self.cache.remove(n)
            raise
        self._cache_stored(names, flat, sums, gens, parents, set())

    def _cache_stored(
        self,
        names: list[str],
        flat: list[torch.Tensor],
        sums: list[int],
        gens: list[int],
        parents: Sequence[str | None] | None,
        failed: set[int],
    ) -> None:
        par = list(parents) if parents is not None else [None] * len(names)
        for i, (n, t, s) in enumerate(zip(names, flat, sums, strict=True)):
            if i in failed:
                self.cache.remove(n)
                continue
            dev = t.to(self.device, copy=True) if t.device != self.device else t.clone()
            self._insert(n, dev, s, gens[i], par[i])

    def pin(self, names: Sequence[str]) -> None:
        """Keep these blocks in device memory once loaded: never evicted until unpinned."""
        for n in names:
            self.cache.pin(n)

    def unpin(self, names: Sequence[str]) -> None:
        for n in names:
            self.cache.unpin(n)

    def evict(self, names: Sequence[str]) -> None:
        """Drop blocks from the device cache (kvfs keeps them)."""
        for n in names:
            self.cache.remove(n)

    def stats(self) -> CacheStats:
        return self.cache.stats()

    def close(self) -> None:
        """Stop the loads and the event watcher, empty the cache, unregister the arena.
        The client stays open (it is the caller's)."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        if self._events is not None:
            self._events.close()
        if self._watcher is not None:
            self._watcher.join(5)
        self.cache.clear()
        self.loader.close()
        self.arena.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- loading -------------------------------------------------------------------------

    def _serve_hits(self, loading: Loading) -> None:
        for ev in loading.events:
            if ev.ready():
                continue
            with self._lock:
                stale = ev.name in self._stale
            e = None if stale else self.cache.get(ev.name)
            if e is not None:
                self.loads["hit"] += 1
                ev._set(e.tensor, None)

    def _run(self, loading: Loading, parents: Sequence[str | None] | None) -> None:
        """Serve *loading*: hits from the cache, the rest leased, landed, checked."""
        try:
            self._serve_hits(loading)
            par = dict(zip(loading.names, parents, strict=True)) if parents is not None else {}
            todo = list(dict.fromkeys(e.name for e in loading.events if not e.ready()))
            if not todo:
                return
            waiting: dict[str, list[BlockEvent]] = {}
            for e in loading.events:
                if not e.ready():
                    waiting.setdefault(e.name, []).append(e)

            def fire(name: str, tensor: torch.Tensor | None, error: KvfsError | None) -> None:
                for e in waiting.pop(name, ()):
                    e._set(tensor, error)

            retry = self._load(todo, par, fire, first=True)
            if retry:
                self._load(retry, par, fire, first=False)
        except BaseException as exc:  # never leave a waiter hanging
            err = exc if isinstance(exc, KvfsError) else KvfsError(f"the load failed: {exc!r}")
            for e in loading.events:
                if not e.ready():
                    e._set(None, err)
            if not isinstance(exc, Exception):
                raise

    def _load(
        self,
        names: list[str],
        parents: dict[str, str | None],
        fire: Callable[[str, torch.Tensor | None, KvfsError | None], None],
        *,
        first: bool,
    ) -> list[str]:
        """Lease *names*, land and check each; returns the names whose copy failed its
        check (reported) when *first*, to lease once more."""
        with self._lock:
            gens = {n: self._gen.get(n, 0) for n in names}
            stale = {n for n in names if n in self._stale}
        try:
            leased: list[Any] = self.client.lease(names, promote=self.config.promote)
        except BatchError as exc:
            leased = exc.results
        holds: list[tuple[str, Hold]] = []
        for n, h in zip(names, leased, strict=True):
            if isinstance(h, KvfsError):
                self.cache.remove(n)
                fire(n, None, h)
            else:
                holds.append((n, h))
        retry: list[str] = []
        try:
            # a stale cached block whose current copy has the checksum it was cached with is fine
            fresh = []
            for n, h in holds:
                e = self.cache.peek(n) if n in stale else None
                if e is not None and e.checksum == h.checksum:
                    with self._lock:
                        if self._gen.get(n, 0) == gens[n]:
                            self._stale.discard(n)
                    self.loads["hit"] += 1
                    self.cache.get(n)  # a hit: counted, and touched in the policy
                    fire(n, e.tensor, None)
                else:
                    fresh.append((n, h))
            step = self.config.batch
            for a in range(0, len(fresh), step):
                chunk = fresh[a : a + step]
                for (n, h), res in zip(chunk, self._land([h for _, h in chunk]), strict=True):
                    if isinstance(res, torch.Tensor):
                        self._insert(n, res, h.checksum, gens[n], parents.get(n))
                        fire(n, res, None)
                        continue
                    self.loads["corrupt"] += 1
                    self.cache.remove(n)
                    log.warning("kvfs gpu agent: %s", res)
                    self.client.suspect(h, str(res))
                    if first:
                        retry.append(n)
                    else:
                        fire(n, None, res)
        finally:
            self.client.release([h for _, h in holds if not h.released])
        return retry

    def _land(self, holds: list[Hold]) -> list[torch.Tensor | BlockCorrupt]:
        """Copy each held block into a fresh device tensor and check it there."""
        out: list[torch.Tensor | BlockCorrupt] = []
        dests = [torch.empty(h.length, dtype=torch.uint8, device=self.device) for h in holds]
        files = [i for i, h in enumerate(holds) if h.kind == "file"]
        errors: dict[int, BaseException | None] = {}
        if files:
            items = [Item(holds[i].path, holds[i].offset, holds[i].length, dests[i]) for i in files]
            errors = dict(zip(files, self.loader.read(items, self._stream), strict=True))
        for i, h in enumerate(holds):
            if h.kind != "file":
                if self.device.type == "cuda" and not matches(
                    self.arena.source(h.offset, h.length), h.length, h.checksum
                ):
                    errors[i] = BlockCorrupt(f"{h.name!r}: its DRAM copy does not match the block's checksum")
                    continue
                self.arena.copy(h.offset, h.length, dests[i], self._stream)
        if self._stream is not None:
            self._stream.synchronize()
        for i, h in enumerate(holds):
            err = errors.get(i)
            checked_here = h.kind == "file" or self.device.type == "cpu"  # else the arena was checked
            dsum = _recorded_devsum(h) if err is None and h.kind == "file" and self.device.type == "cuda" else None
            if err is None and checked_here and not matches(dests[i], h.length, h.checksum, dsum):
                where = "block file" if h.kind == "file" else "DRAM copy"
                err = BlockCorrupt(f"{h.name!r}: its {where} does not match the block's checksum")
            if err is None:
                self.loads[h.kind if h.kind == "file" else "arena"] += 1
                out.append(dests[i])
            else:
                out.append(err if isinstance(err, BlockCorrupt) else BlockCorrupt(f"{h.name!r}: {err}"))
        return out

    def _insert(self, name: str, tensor: torch.Tensor, checksum: int, gen: int, parent: str | None) -> None:
        with self._lock:
            current = self._gen.get(name, 0)
            if current > gen or self._watching_lost:  # an event came while it loaded: re-check on its next hit
                self._stale.add(name)
            else:
                self._stale.discard(name)
        self.cache.put(name, tensor, checksum, parent)


def _recorded_devsum(h: Hold) -> int | None:
    """The device checksum the block file's header records for this very block (the
    header's xxh3 and length must be the lease's), or None: then the block is checked by
    a copy back to the host."""
    try:
        fd = os.open(h.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            hdr = read_header(fd)  # beside the payload (an attribute) or before it
        finally:
            os.close(fd)
    except (OSError, BlockCorrupt):
        return None
    if hdr.checksum != h.checksum or hdr.length != h.length:
        return None
    return hdr.device_checksum


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError("the tensor is not contiguous; pass tensor.contiguous()")
    return t.reshape(-1).view(torch.uint8)
