"""NIXL agents: the one place kvfs drives NIXL (docs/cluster.md, docs/gpu.md).

Two parts of kvfs move bytes with NIXL: the daemon's peer tier
(:mod:`kvfs.mount.nixl_agent`: this node's DRAM arena registered with the UCX backend as
the source of its writes to peers, and landing buffers peers write into) and the GPU
agent's NIXL loader
(:class:`kvfs.gpu.transfer.NixlLoader`: block files read with the ``POSIX`` or ``GDS``
backends). Both go through :class:`Agent`, over NIXL's own bindings (``_bindings`` of
``nixl_cu13``/``nixl_cu12``/``nixl``): torch- and numpy-free, imported on first use, so
``import kvfs`` works without NIXL. NIXL's Python wrapper is not used: its progress
thread polls without pause (a busy core per idle process).

What the two share:

- :func:`bindings`: whichever CUDA variant is installed, or :class:`NixlUnavailable`
  saying what to install;
- :class:`Agent`: an agent with a UCX progress thread that sleeps on UCX's event
  descriptors (``progress_wait``) or none (the caller's status checks progress it),
  backends, registrations, peers' metadata. What a peer gets of an agent is only what
  :meth:`Agent.metadata_of` names: the connection and the registrations given, never
  the others (NIXL's ``getLocalMD``, which carries every registration's remote key, is
  not exposed); :func:`agent_of` reads the agent name a metadata blob carries;
- :meth:`Agent.transfer`: post, then wait until done or the deadline. Waiting is a short
  spin of status checks (each one progresses the backend in the caller's thread), then
  sleeps growing from 50 µs to 1 ms: a transfer of a few milliseconds costs a few
  wakeups, never a busy core, and one that ends early is seen within 50 µs. (A backend
  that moves only while it is checked, as ``POSIX`` without a progress thread, is spun
  for the whole transfer: its caller says so.) A transfer
  that fails or passes its deadline is released (NIXL cancels it): :class:`TransferFailed`;
  :class:`TransferStuck` when it could not be cancelled (its destination may still be
  written: the caller must never reuse it);
- :func:`leave`: how a process that loaded UCX ends (below).

**Leaving.** UCX's InfiniBand module (``libuct_ib``) loads ``libnl-route``, whose library
destructor crashes in ``_dl_fini``, after Python's exit: the work is done but the process
ends with SIGSEGV (status 139, maybe a core file). A process that never loaded it exits
as usual. One that did (:func:`needs_hard_exit`) leaves with :func:`leave`: its
``atexit`` handlers run, its logs and standard streams are flushed, then ``os._exit``. A node whose UCX uses TCP only
(``UCX_TLS`` without an RDMA transport) does not load that module at all
(:func:`tcp_only_modules`), and exits as any process does.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from .errors import NixlUnavailable, TransferFailed, TransferStuck

__all__ = [
    "MEMORY",
    "Agent",
    "Backend",
    "Registration",
    "agent_of",
    "bindings",
    "leave",
    "needs_hard_exit",
    "tcp_only_modules",
]

log = logging.getLogger("kvfs.nixl")

MEMORY = ("DRAM", "VRAM", "FILE")
"""The memory kinds kvfs registers: host memory, device memory, a file (its descriptor)."""

_VARIANTS = ("nixl_cu13", "nixl_cu12", "nixl")
_SPIN = 20e-6  # seconds of status checks before the first sleep
_FIRST_SLEEP = 50e-6
_MAX_SLEEP = 1e-3
_NOT_RDMA = frozenset(
    [
        "tcp",
        "self",
        "sm",
        "shm",
        "posix",
        "sysv",
        "cma",
        "knem",
        "xpmem",
        "cuda",
        "cuda_copy",
        "cuda_ipc",
        "gdr_copy",
        "rocm",
        "rocm_copy",
        "rocm_ipc",
    ]
)
_NL_ROUTE = "libnl-route"

Region = tuple[int, int, int]
"""``(address, length, device)`` of memory; ``(offset, length, fd)`` of a file."""


_bindings: Any = None
_errors: tuple[type[BaseException], ...] = ()


def bindings() -> Any:
    """NIXL's bindings module, from whichever variant is installed (loaded once).
    :class:`NixlUnavailable` when none is."""
    global _bindings, _errors
    if _bindings is not None:
        return _bindings
    why = []
    for name in _VARIANTS:
        try:
            mod = importlib.import_module(f"{name}._bindings")
        except (ImportError, OSError) as exc:
            why.append(f"{name}: {exc}")
            continue
        _errors = tuple(
            v for k, v in vars(mod).items() if k.startswith("nixl") and k.endswith("Error") and isinstance(v, type)
        )
        _bindings = mod
        return mod
    raise NixlUnavailable(f"NIXL is not installed (pip install nixl-cu12 or nixl-cu13): {'; '.join(why)}")


def errors() -> tuple[type[BaseException], ...]:
    """The exception classes NIXL's bindings raise (after :func:`bindings`)."""
    bindings()
    return _errors + (RuntimeError, ValueError)


_SERDES = b"nixlSerDes|Agent"
_LEN = struct.Struct("<Q")


def agent_of(metadata: bytes) -> str | None:
    """The agent name a NIXL metadata blob carries (its first field, in NIXL's
    serialization: ``nixlSerDes|``, the tag ``Agent``, a 64-bit length, the name), read
    without loading it; None when the blob does not start that way."""
    if not metadata.startswith(_SERDES) or len(metadata) < len(_SERDES) + _LEN.size:
        return None
    (n,) = _LEN.unpack_from(metadata, len(_SERDES))
    start = len(_SERDES) + _LEN.size
    if not 0 < n <= 256 or len(metadata) < start + n:
        return None
    try:
        return metadata[start : start + n].decode()
    except UnicodeDecodeError:
        return None


def tcp_only_modules(tls: str | None) -> bool:
    """Whether UCX transports *tls* (``UCX_TLS``) name no RDMA transport, so UCX's
    InfiniBand module need not be loaded (``UCX_MODULES=^ib``; see the module doc)."""
    names = [t.strip() for t in (tls or "").split(",") if t.strip()]
    return bool(names) and all(n in _NOT_RDMA for n in names)  # "^x", "all", rc, ud, dc...: RDMA may be used


def needs_hard_exit() -> bool:
    """Whether this process mapped the library whose destructor crashes its exit."""
    try:
        with open("/proc/self/maps") as f:
            return any(_NL_ROUTE in line for line in f)
    except OSError:
        return False


def leave(status: int) -> NoReturn:
    """End the process with *status* as one that loaded UCX's InfiniBand module must
    (:func:`needs_hard_exit`; see the module doc): its ``atexit`` handlers run, its logs
    and standard streams are flushed, then ``os._exit``."""
    try:
        atexit._run_exitfuncs()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(status)


@dataclass(frozen=True, slots=True)
class Backend:
    """A backend of an :class:`Agent`: its ``kind`` (``UCX``, ``POSIX``, ``GDS_MT``...),
    NIXL's handle, and the memory kinds it moves (``DRAM``, ``FILE``...)."""

    kind: str
    handle: Any
    mems: frozenset[str]


@dataclass(frozen=True, slots=True)
class Registration:
    """Memory registered with a backend (:meth:`Agent.register`)."""

    mem: str
    regions: tuple[Region, ...]
    backend: Backend
    dlist: Any


class Agent:
    """A NIXL agent named *name* (unique among the agents that talk to each other).

    *progress_thread*: a UCX progress thread that waits up to *progress_wait* seconds on
    UCX's event descriptors between rounds (needed where peers read or write this
    agent's memory; a transfer wakes it at once); without one, the caller's status
    checks progress every transfer. Thread-safe (NIXL's strict thread sync)."""

    def __init__(self, name: str, *, progress_thread: bool = False, progress_wait: float = 0.1) -> None:
        nixl = bindings()
        if "NIXL_LOG_LEVEL" not in os.environ:  # its INFO lines on every agent and backend are noise here
            logging.getLogger("nixl").setLevel(logging.WARNING)
        cfg = nixl.nixlAgentConfig()
        cfg.useProgThread = progress_thread
        cfg.useListenThread = False
        cfg.pthrDelay = int(progress_wait * 1e6)
        cfg.syncMode = nixl.NIXL_THREAD_SYNC_STRICT
        cfg.captureTelemetry = False
        self._nixl = nixl
        self.name = name
        try:
            self._agent = nixl.nixlAgent(name, cfg)
        except errors() as exc:
            raise NixlUnavailable(f"NIXL could not start an agent: {exc}") from None
        self._mem = {"DRAM": nixl.DRAM_SEG, "VRAM": nixl.VRAM_SEG, "FILE": nixl.FILE_SEG}
        self._ops = {"READ": nixl.NIXL_READ, "WRITE": nixl.NIXL_WRITE}

    @property
    def plugins(self) -> list[str]:
        """The backends this NIXL can make (its plugins)."""
        return list(self._agent.getAvailPlugins())

    def backend(self, kind: str, params: dict[str, str] | None = None) -> Backend:
        """Start a *kind* backend with *params*; :class:`NixlUnavailable` when it cannot."""
        if kind not in self.plugins:
            raise NixlUnavailable(f"NIXL has no {kind} plugin here")
        try:
            handle = self._agent.createBackend(kind, dict(params or {}))
            _, mems = self._agent.getBackendParams(handle)
        except errors() as exc:
            raise NixlUnavailable(f"NIXL's {kind} backend did not start: {exc}") from None
        return Backend(kind, handle, frozenset(str(m).removesuffix("_SEG") for m in mems))

    def register(self, mem: str, regions: Sequence[Region], backend: Backend) -> Registration:
        """Register *regions* of memory kind *mem* with *backend* (a file region names
        its descriptor where a memory region names its device)."""
        dlist = self._nixl.nixlRegDList(self._mem[mem], [(a, n, d, "") for a, n, d in regions])
        try:
            self._agent.registerMem(dlist, [backend.handle])
        except errors() as exc:
            raise NixlUnavailable(f"NIXL {backend.kind} could not register {mem} memory: {exc}") from None
        return Registration(mem, tuple(regions), backend, dlist)

    def deregister(self, reg: Registration) -> None:
        try:
            self._agent.deregisterMem(reg.dlist, [reg.backend.handle])
        except errors() as exc:
            log.warning("NIXL %s: deregistering %s memory failed: %s", reg.backend.kind, reg.mem, exc)

    def metadata_of(self, regs: Sequence[Registration], backend: Backend) -> bytes:
        """What a peer loads (:meth:`connect`) to reach this agent through *backend* and
        move bytes to or from *regs* (of one memory kind), and nothing else: the remote
        keys of this agent's other registrations are not in it (NIXL's partial metadata)."""
        if not regs or len({r.mem for r in regs}) != 1:
            raise ValueError("metadata_of: name one or more registrations of one memory kind")
        descs = [(a, n, d, "") for r in regs for a, n, d in r.regions]
        dlist = self._nixl.nixlRegDList(self._mem[regs[0].mem], descs)
        try:
            return bytes(self._agent.getLocalPartialMD(dlist, True, [backend.handle]))
        except errors() as exc:
            raise NixlUnavailable(f"NIXL {backend.kind} could not describe {regs[0].mem} memory: {exc}") from None

    def connect(self, metadata: bytes) -> str:
        """Load another agent's *metadata*; returns its name. :class:`TransferFailed` when
        it does not load."""
        try:
            remote = self._agent.loadRemoteMD(metadata)
        except errors() as exc:
            raise TransferFailed(f"cannot load a NIXL agent's metadata: {exc}") from None
        return remote.decode() if isinstance(remote, bytes) else str(remote)

    def forget(self, remote: str) -> None:
        """Drop agent *remote*'s metadata (it restarted or went away)."""
        try:
            self._agent.invalidateRemoteMD(remote)
        except errors() as exc:  # already gone: nothing to undo
            log.debug("forgetting NIXL agent %s: %s", remote, exc)

    def transfer(
        self,
        op: str,
        local: Sequence[Region],
        remote: Sequence[Region],
        *,
        backend: Backend,
        timeout: float,
        local_mem: str = "DRAM",
        remote_mem: str = "DRAM",
        agent: str | None = None,
        spin: float = _SPIN,
    ) -> None:
        """``READ`` *remote* regions into *local* ones, or ``WRITE`` *local* into *remote*,
        with agent *agent*'s memory (None: this agent's own, e.g. its files), within
        *timeout* seconds; returns once the bytes are in place (remote completion).
        *spin*: seconds of status checks before the first sleep (a backend without a
        progress thread of its own, such as ``POSIX``, moves only while it is checked:
        its caller spins the whole transfer). :class:`TransferFailed` when it failed or
        timed out and was cancelled, :class:`TransferStuck` when it could not be cancelled."""
        nixl = self._nixl
        mine = nixl.nixlXferDList(self._mem[local_mem], list(local))
        theirs = nixl.nixlXferDList(self._mem[remote_mem], list(remote))
        peer = self.name if agent is None else agent
        deadline = time.monotonic() + timeout
        try:
            req = self._agent.createXferReq(self._ops[op], mine, theirs, peer, "", [backend.handle])
        except errors() as exc:
            raise TransferFailed(f"NIXL {backend.kind} {op} with {peer} could not start: {exc}") from None
        status: Any
        try:
            status = self._wait(req, self._agent.postXferReq(req), deadline, spin)
        except errors() as exc:
            status = exc
        if status == nixl.NIXL_SUCCESS:
            self._release(req)
            return
        what = f"NIXL {backend.kind} {op} of {sum(r[1] for r in local)} bytes with {peer}"
        if not self._release(req):
            raise TransferStuck(f"{what} did not finish and could not be cancelled")
        why = f"timed out after {timeout:g}s" if status == nixl.NIXL_IN_PROG else f"failed: {status}"
        raise TransferFailed(f"{what} {why}")

    def _wait(self, req: Any, status: Any, deadline: float, spin: float) -> Any:
        in_prog = self._nixl.NIXL_IN_PROG
        check = self._agent.getXferStatus
        clock = time.monotonic
        spin_end = min(clock() + spin, deadline)
        while status == in_prog and clock() < spin_end:
            status = check(req)
        pause = _FIRST_SLEEP
        while status == in_prog:
            left = deadline - clock()
            if left <= 0:
                break
            time.sleep(min(pause, left))
            pause = min(pause * 2, _MAX_SLEEP)
            status = check(req)
        return status

    def _release(self, req: Any) -> bool:
        try:
            self._agent.releaseXferReq(req)
        except errors() as exc:
            log.warning("NIXL transfer could not be released: %s", exc)
            return False
        return True
