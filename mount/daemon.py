"""The mount daemon: a store, a FUSE loop and its socket (the ``kvfs`` tools' control
commands and the batch client, :mod:`kvfs.mount.control`) in one trio nursery.

``run(mountpoint, config, foreground)`` is what ``kvfs mount`` calls.

- Foreground: mounts, serves until unmounted (``kvfs umount``, ``fusermount3 -u``) or
  until SIGTERM/SIGINT, then writes every block that is only in DRAM down to the first
  persistent tier that takes it (``store.flush_report``), closes the store and returns:
  0 when nothing was lost, 1 when some block only in DRAM could not be written down
  (each is named in the log, and the report is left at
  :func:`~kvfs.mount.paths.umount_report_path` for ``kvfs umount`` to show).
- Background: starts ``python -m kvfs.mount.daemon`` detached (its own session, output to
  :func:`~kvfs.mount.paths.log_path`), hands it the parsed config on stdin and returns
  once the child reports, on a pipe, that the mount is ready (or why it failed).

Every way the loop ends goes through the same exit path, so ``fusermount3 -u`` (the
kernel ends the session, which ends the transport's loop) flushes exactly as ``kvfs
umount`` does. The FUSE transport (kvfs's own on the kernel's protocol, or pyfuse3) is
chosen by ``[mount] transport`` (:mod:`kvfs.mount.transport`).
The pid file (:func:`~kvfs.mount.paths.pid_path`) exists while the daemon runs, and the
daemon holds an exclusive ``flock`` on it until it has flushed and closed its store
(:func:`hold`); ``kvfs umount`` waits for that lock, then for the process's exit.

A hung tier never holds the exit: store calls that are still waiting on a tier when the
loop ends are abandoned (their threads are daemon threads, never joined), every shared
tier call has a deadline, and the flush gives up on a tier after its first failure. So an
unmount during a stall takes the local flush plus at most one deadline per stalled tier
that still had work queued (docs/store.md, "Unmount").
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvfs import __version__
from kvfs.config import Config, EventsConfig
from kvfs.errors import KvfsError
from kvfs.store import FlushReport, Store
from kvfs.tier import Tier

from .assembly import capacity_warnings, open_store
from .paths import (
    FSTYPE,
    control_socket_path,
    log_path,
    open_private,
    pid_path,
    read_private,
    real_path,
    umount_report_path,
    unescape,
    write_private,
)

if TYPE_CHECKING:  # imported where used: the parent of a background mount never loads them
    import trio

    from .eventhub import EventHub
    from .fs import KvfsOperations
    from .kernel.device import MountSpec
    from .kv_events import Audience, KvEventPublisher
    from .options import FsOptions
    from .transport import FuseTransport
    from .workers import Offload, Workers

__all__ = ["MountError", "check_mountpoint", "fs_options_from_env", "mount_type", "run"]

log = logging.getLogger("kvfs.mount.daemon")

READY = b"ready\n"
_WRITE_THROUGH_INTERVAL = 0.2  # seconds between write-through passes when idle
# The DRAM arena is kept reserved this far ahead of its highest extent, checked this often,
# so seals land in memory already faulted in (growing it in the seal was ~1.1 ms of a
# ~1.4 ms 2 MiB seal; docs/mount-internals.md, "The seal, measured by its parts"): seals
# up to ~1.3 GB/s find their room there.
_ARENA_AHEAD = 64 << 20
_ARENA_AHEAD_INTERVAL = 0.05
_ARENA_AHEAD_IDLE_INTERVAL = 1.0  # after a second of checks that found nothing to reserve
_ARENA_AHEAD_QUIET_CHECKS = 20
_FUSE_OPTIONS_ENV = "KVFS_FUSE_OPTIONS"


class MountError(KvfsError):
    """Raised when a mountpoint cannot be used (missing, not a directory, not empty,
    already mounted) or the mount itself fails; nothing is left mounted."""


def mount_type(path: str | os.PathLike[str]) -> str | None:
    """The filesystem type mounted exactly at *path* (``fuse.kvfs``, ``ext4``…), or None.

    Reads /proc/self/mountinfo and resolves only *path*'s parent, so neither a stale
    mount nor our own not-yet-serving mount is touched (which would hang)."""
    real = real_path(path)
    found = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if unescape(left.split(" ")[4]) == real:
                    found = right.split(" ", 1)[0]  # the last mount there wins
    except OSError:
        pass
    return found


def check_mountpoint(path: str | os.PathLike[str]) -> str:
    """*path* made absolute, or :class:`MountError` saying why it cannot be mounted on."""
    p = os.path.abspath(path)
    kind = mount_type(p)
    if kind is not None:
        hint = f"; unmount it first with kvfs umount {p}" if kind == FSTYPE else ""
        raise MountError(f"{p}: already mounted ({kind}){hint}")
    if not os.path.lexists(p):
        raise MountError(f"{p}: mountpoint does not exist; create it first (mkdir -p {p})")
    if not os.path.isdir(p):
        raise MountError(f"{p}: mountpoint is not a directory")
    try:
        if os.listdir(p):
            raise MountError(f"{p}: mountpoint is not empty; kvfs mounts only on an empty directory")
    except PermissionError as exc:
        raise MountError(f"{p}: mountpoint is not readable: {exc.strerror}") from exc
    return os.path.realpath(p)  # safe: nothing is mounted there yet


def fs_options_from_env() -> FsOptions:
    """Per-file FUSE settings, overridable through $KVFS_FUSE_OPTIONS (a JSON object of
    :class:`~kvfs.mount.fs.FsOptions` fields; ``kvfs bench fuse`` uses it to compare)."""
    from .options import FsOptions

    raw = os.environ.get(_FUSE_OPTIONS_ENV)
    if not raw:
        return FsOptions()
    try:
        return FsOptions(**json.loads(raw))
    except (ValueError, TypeError) as exc:
        raise MountError(f"${_FUSE_OPTIONS_ENV}: {exc}") from exc


# -- the daemon itself ------------------------------------------------------------------


def _background_pass(store: Store) -> None:
    """One pass of the store's background work (in a worker thread)."""
    if store.pending:
        store.run_pending(256)
    if store.leases:
        store.expire_leases()
    store.sweep()  # soft pins that expired; retention when due (kvfs.lifetimes)


async def _write_through(store: Store, run: Offload) -> None:
    """The background pass every 0.2 s while the store has work, in a thread *run* gives
    (``Workers.background``: abandoned on cancel, so a copy stuck in a hung tier never
    holds the unmount)."""
    import trio

    while True:
        if not store.idle:  # an idle daemon wakes no thread (memory reads only: fine on the loop)
            await run(_background_pass, store)
        await trio.sleep(_WRITE_THROUGH_INTERVAL)


async def _reserve_ahead(store: Store, run: Offload) -> None:
    """Keep the tiers' memory reserved :data:`_ARENA_AHEAD` past what they hold
    (:meth:`Store.reserve_ahead`, in a thread *run* gives: the fault-in lets the GIL go),
    so no seal grows the DRAM arena on the loop while the writes keep below ~1.3 GB/s.
    The check is a memory read on the loop, every 50 ms while the arena grows and once a
    second after a second without growth (an idle daemon must not wake 20 times a second;
    the first seals of a burst after a quiet spell grow the arena themselves, as they
    did before this window existed); an idle daemon with its window reserved wakes no
    thread."""
    import trio

    quiet = 0
    while True:
        if store.unreserved_ahead(_ARENA_AHEAD):
            await run(store.reserve_ahead, _ARENA_AHEAD)
            quiet = 0
        else:
            quiet += 1
        busy = quiet < _ARENA_AHEAD_QUIET_CHECKS
        await trio.sleep(_ARENA_AHEAD_INTERVAL if busy else _ARENA_AHEAD_IDLE_INTERVAL)


async def _on_signals(cancel_scope: trio.CancelScope, task_status: trio.TaskStatus[None]) -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()  # before the mount serves: a signal from then on unmounts cleanly
        async for signum in signals:
            log.info("received %s: unmounting", signal.Signals(signum).name)
            cancel_scope.cancel()
            return


async def _on_shutdown(requested: trio.Event, cancel_scope: trio.CancelScope) -> None:
    import trio

    await requested.wait()
    log.info("shutdown requested over the control socket: unmounting")
    await trio.sleep(0.05)  # let the control server send its reply first
    cancel_scope.cancel()


async def _serve(
    ops: KvfsOperations,
    store: Store,
    mountpoint: str,
    sock: Path,
    on_ready: Callable[[], object],
    config: Config,
    transport: FuseTransport,
    workers: Workers,
) -> None:
    import trio

    from .control import Server, serve
    from .limits import PeerLimits

    limits = PeerLimits(config.client)  # under the descriptor limit raised at start (raise_nofile)
    server = Server(
        store,
        mountpoint,
        opstats=ops.opstats,
        client=config.client,
        mount=ops,
        origin=config.origin,
        limits=limits,
        workers=workers,
    )
    publisher = None
    if config.events.zmq is not None:  # bound before anything starts: a bad address fails the mount
        from .kv_events import Audience, KvEventPublisher

        def rule_of(name: str) -> Any:
            ns = store.namespaces.of(name)
            return None if ns is None else ns.access

        audience = Audience(config.events.audience, rule_of)
        publisher = KvEventPublisher(config.events.zmq, topic=config.events.topic, mode=audience.socket_mode())
    async with trio.open_nursery() as nursery:
        ops.attach_nursery(nursery, transport)
        shutdown = trio.Event()
        server.control.request_shutdown = shutdown.set
        nursery.start_soon(_on_shutdown, shutdown, nursery.cancel_scope)
        await nursery.start(serve, server, sock)
        nursery.start_soon(_write_through, store, workers.background)
        nursery.start_soon(_reserve_ahead, store, workers.cpu)
        await nursery.start(_on_signals, nursery.cancel_scope)
        if publisher is not None:
            await nursery.start(
                _publish_events, server.control.hub, store.tiers, config.events, publisher, audience, workers.events
            )
        on_ready()
        await transport.serve()
        log.info("the kernel ended the session (unmounted from outside)")
        nursery.cancel_scope.cancel()


async def _publish_events(
    hub: EventHub,
    tiers: Sequence[Tier],
    config: EventsConfig,
    publisher: KvEventPublisher,
    audience: Audience,
    offload: Offload,
    *,
    task_status: trio.TaskStatus[None],
) -> None:
    """The KV event publisher; a failure of it is logged and ends it, never the daemon."""
    from .kv_events import publish_hub

    try:
        await publish_hub(hub, tiers, config, publisher, audience, offload=offload, task_status=task_status)
    except Exception:
        log.exception("the KV event publisher failed and stopped; the mount goes on without it")


def _set_read_ahead(mountpoint: str, kb: int) -> None:
    """Raise the kernel's read-ahead for our mount (its bdi is named by the mount's dev)."""
    if kb <= 0:
        return
    dev = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" ")
            if unescape(fields[4]) == mountpoint:
                dev = fields[2]
    try:
        if dev is None:
            raise OSError("not in mountinfo")
        Path(f"/sys/class/bdi/{dev}/read_ahead_kb").write_text(str(kb))
    except OSError as exc:
        log.info("cannot set read_ahead_kb of %s (%s); uncached reads use 128 KiB requests", mountpoint, exc)


def _mount_spec(config: Config) -> MountSpec:
    from .kernel.device import MountSpec

    return MountSpec(fsname="kvfs", subtype=FSTYPE.split(".", 1)[1], allow_other=config.mount.allow_other)


def serve_foreground(mountpoint: str, config: Config, on_ready: Any = lambda: None) -> int:
    """Mount, serve until unmounted or signalled, flush, close. Returns an exit status:
    0, or 1 when blocks only in DRAM could not be written down (see the module doc)."""
    import trio

    from .fs import KvfsOperations
    from .kernel.device import MountFailed
    from .limits import raise_nofile
    from .transport import open_transport
    from .workers import Workers

    mountpoint = check_mountpoint(mountpoint)
    options = fs_options_from_env()
    for warning in capacity_warnings(config):
        log.warning("%s", warning)
    log.info("descriptor limit: %d", raise_nofile())
    # every path derived from the mountpoint is computed before mounting: resolving it
    # afterwards would stat our own mount before its loop serves (a deadlock)
    pidfile = pid_path(mountpoint)
    sock = control_socket_path(mountpoint)
    report_file = umount_report_path(mountpoint)
    try:
        report_file.unlink()
    except FileNotFoundError:
        pass
    store = open_store(config)
    workers = Workers(store)  # the daemon's one owner of worker threads and their limiters
    ops = KvfsOperations(store, options, write_buffer=config.mount.write_buffer, workers=workers)
    metrics_server = None
    cluster = None
    report = FlushReport()
    pid_lock: int | None = None
    try:
        if config.cluster is not None:  # before mounting: a busy address mounts nothing
            from .cluster import Cluster

            cluster = Cluster(store, config.cluster)
        if config.mount.metrics_port is not None:  # before mounting: a busy port mounts nothing
            from .metrics import start_metrics

            try:
                metrics_server, port = start_metrics(store, ops.opstats, config.mount.metrics_port, inodes=ops.inodes)
            except OSError as exc:
                raise MountError(f"cannot serve metrics on port {config.mount.metrics_port}: {exc.strerror}") from exc
            log.info("Prometheus metrics on http://127.0.0.1:%d/metrics", port)
        try:
            transport = open_transport(config.mount.transport, ops, mountpoint, _mount_spec(config))
        except (MountFailed, RuntimeError, OSError) as exc:
            raise MountError(f"{mountpoint}: mount failed: {exc}") from exc
        _set_read_ahead(mountpoint, options.read_ahead_kb)
        write_private(pidfile, f"{os.getpid()}\n")
        pid_lock = hold(pidfile)
        log.info(
            "kvfs %s mounted at %s (pid %d, tiers %s, %s transport; config: %s)",
            __version__,
            mountpoint,
            os.getpid(),
            ", ".join(f"{t.name}:{t.kind.value}" for t in store.tiers),
            transport.name,
            config.origin or "given in code",
        )
        try:
            trio.run(_serve, ops, store, mountpoint, sock, on_ready, config, transport, workers)
        finally:
            still = mount_type(mountpoint) == FSTYPE
            transport.close(unmount=still)
            log.info("unmounted %s", mountpoint)
            ops.close_handles()
            report = store.flush_report()
            _log_report(report)
            write_private(report_file, json.dumps({"pid": os.getpid(), **report.to_json()}))
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
        if cluster is not None:
            cluster.close()
        store.close()
        try:
            if (read_private(pidfile) or "").strip() == str(os.getpid()):
                pidfile.unlink()
        except OSError:
            pass
        if pid_lock is not None:
            os.close(pid_lock)  # the last thing done: kvfs umount waits for this lock
    return 0 if report.ok else 1


def hold(pidfile: Path) -> int:
    """An exclusive ``flock`` on the pid file, held (by the returned descriptor) until the
    daemon has unmounted, flushed and closed its store. ``kvfs umount`` waits for it:
    unlike the process's exit, its release does not wait for threads the daemon abandoned
    in a tier that stopped answering (they end when the tier answers)."""
    fd = open_private(pidfile, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _log_report(report: FlushReport) -> None:
    log.info("flushed %d DRAM-only blocks to persistent tiers in %.2fs", report.written, report.seconds)
    if report.lost:
        log.error(
            "%d blocks only in DRAM could not be written to a persistent tier and are lost: %s",
            len(report.lost),
            ", ".join(name for name, _ in report.lost),
        )
    for tier, n in report.unsynced.items():
        log.warning("%d write-through copies to %s were not made (the blocks are kept in another tier)", n, tier)
    for tier, names in report.undeleted.items():
        log.warning("%d deletes did not reach %s: %s", len(names), tier, ", ".join(names))


def _spawn_background(mountpoint: str, config: Config) -> int:
    """Start the daemon detached and wait until it reports the mount ready."""
    logfile = log_path(mountpoint)
    for warning in capacity_warnings(config):
        print(f"kvfs: warning: {warning}", file=sys.stderr)
    r, w = os.pipe()
    with os.fdopen(open_private(logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvfs.mount.daemon", "--ready-fd", str(w), mountpoint],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=out,
            pass_fds=(w,),
            start_new_session=True,
            close_fds=True,
            cwd="/",  # a daemon pins no directory (and "fsname=kvfs" never resolves to ./kvfs)
        )
    os.close(w)
    try:
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps(config))
        proc.stdin.close()
        with os.fdopen(r, "rb") as ready:
            msg = ready.read()
    except BaseException:
        proc.terminate()
        raise
    if msg == READY:
        print(f"kvfs mounted at {mountpoint} (pid {proc.pid}); log: {logfile}")
        return 0
    proc.wait()
    reason = msg.decode(errors="replace").strip() or f"the daemon exited with status {proc.returncode}"
    raise MountError(f"{reason} (log: {logfile})")


def run(mountpoint: str | os.PathLike[str], config: Config, foreground: bool = False) -> int:
    """Mount kvfs at *mountpoint* with *config*. Foreground: serve until unmounted or
    signalled. Background: return once the detached daemon has the mount ready.
    Raises :class:`MountError` (nothing left mounted) when the mountpoint is unusable."""
    mountpoint = check_mountpoint(mountpoint)
    if foreground:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        status = serve_foreground(mountpoint, config, lambda: log.info("ready"))
        if config.cluster is not None:
            from kvfs.nixl import leave, needs_hard_exit

            if needs_hard_exit():  # UCX's InfiniBand module crashes an ordinary exit (kvfs.nixl)
                leave(status)
        return status
    return _spawn_background(mountpoint, config)


def _child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvfs.mount.daemon")
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("mountpoint")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    ready = os.fdopen(args.ready_fd, "wb", buffering=0)

    def on_ready() -> None:
        ready.write(READY)
        ready.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)

    try:
        config = pickle.loads(sys.stdin.buffer.read())
        return serve_foreground(args.mountpoint, config, on_ready)
    except BaseException as exc:
        log.exception("kvfs daemon failed")
        if not ready.closed:
            ready.write(f"kvfs daemon: {exc}\n".encode())
            ready.close()
        return 1


if __name__ == "__main__":  # pragma: no cover - the detached daemon
    from kvfs.nixl import leave, needs_hard_exit

    status = _child_main(sys.argv[1:])
    if needs_hard_exit():  # UCX's InfiniBand module was loaded: an ordinary exit would crash (kvfs.nixl)
        leave(status)
    sys.exit(status)
