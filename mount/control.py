"""The daemon's socket: the typed protocol (:mod:`kvfs.protocol`) over Unix sockets.

One :class:`Server` answers every request a peer makes, on the mount's owner-only control
socket and, with ``[client] socket``, on a socket given to a group: the operator commands
of the ``kvfs`` tools (:class:`ControlHandler`) and the batch client's ops
(:class:`~kvfs.mount.clientserver.ClientOps`). Each connection is read frame by frame; a
request is decoded (a bad frame gets an :class:`~kvfs.protocol.Error` naming what is
wrong, and the connection keeps serving), authorized (:meth:`Server.authorize`, the one
place: :class:`~kvfs.mount.session.AccessPolicy`), and handed to the op of its kind
(``op_<kind>``); what the op returns is the reply. Store calls run in worker threads or,
when they finish at memory speed, on the loop (``Store.nowait``); never blocking it
(:mod:`kvfs.mount.workers`: the tools' commands are its ``control`` kind, the batch
client's its ``client`` and ``cpu`` kinds).

Streaming ops (prefetch, evict, fsck, events) send items before their reply:
:class:`~kvfs.protocol.Progress` while working through many blocks, one
:class:`~kvfs.protocol.EventItem` per block event. ``events`` never ends on its own: the
client hangs up when it has seen enough. The ops, their arguments and results are listed
in ``docs/tools.md``; the client's in ``docs/client.md``.

Events: the store queues them (``store.events``); :func:`serve` starts
:meth:`ControlHandler.pump_events`, the one task that drains that queue, and hands every
event to every subscriber of :attr:`ControlHandler.hub` (``kvfs events`` clients, batch
clients' event subscriptions, and any other consumer in the daemon that calls
``hub.subscribe()``), each in order.
"""

from __future__ import annotations

import grp
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from kvfs import __version__
from kvfs.config import ClientConfig
from kvfs.errors import BlockNotFound, KvfsError, LastCopy, LimitReached, Pinned
from kvfs.names import normalize
from kvfs.policies import Hint
from kvfs.protocol import (
    MAX_VALUES,
    Advise,
    Advised,
    ControlError,
    CopyProblem,
    Df,
    DfResult,
    Du,
    DuResult,
    DuTotal,
    EventItem,
    Events,
    Evict,
    EvictResult,
    Failure,
    Fsck,
    FsckResult,
    InternalError,
    Ls,
    LsEntry,
    LsResult,
    Message,
    OpCount,
    Pin,
    Ping,
    PinResult,
    Pong,
    Prefetch,
    PrefetchResult,
    Progress,
    ProtocolError,
    QuotaResult,
    QuotaSet,
    QuotaShow,
    Request,
    Shutdown,
    ShuttingDown,
    Stat,
    Statistics,
    StatisticsResult,
    StatResult,
    Subscribed,
    SubscriberTooSlow,
    TierUse,
    Top,
    TopResult,
    decode,
    error_type,
)
from kvfs.store import Store

from .clientserver import ClientOps, MountSide
from .eventhub import EventHub, Gap
from .limits import PeerLimits
from .session import AccessPolicy, Connection, Peer, Session, batch_size, is_request
from .workers import Workers

__all__ = ["ControlError", "ControlHandler", "EventHub", "Server", "SubscriberTooSlow", "serve"]

log = logging.getLogger("kvfs.mount.control")

_BATCH = 64  # blocks handled per worker-thread call in multi-block ops
_PROGRESS_EVERY = 0.1  # seconds between progress items
_EVENT_POLL = 0.02  # seconds between drains of the store's event queue while someone subscribes
_EVENT_IDLE_DRAIN = 1.0  # with no subscriber: the queue is emptied (nobody's events) this often
_MAX_ADVICE = 65536  # names one hint may carry
_ADVICE_ON_LOOP = 4096  # names a hint handles on the loop when the store's lock is free
_ENCODE_ON_LOOP = 4096  # names or ids of a request whose reply is encoded on the loop; more in a worker thread


class _Progress:
    """Sends :class:`Progress` items, at most every 0.1 s, and the last."""

    def __init__(self, conn: Connection, total: int) -> None:
        self.conn = conn
        self.total = total
        self._last = 0.0

    async def update(self, done: int) -> None:
        now = time.monotonic()
        if done == self.total or now - self._last >= _PROGRESS_EVERY:
            self._last = now
            await self.conn.send(Progress(done=done, total=self.total))


class ControlHandler:
    """The operator commands on the store. *mountpoint* is reported by ``ping``;
    *opstats* (a :class:`~kvfs.mount.opstats.OpStats`, optional) adds FUSE op counts to
    ``top``; *mount*, the FUSE side of the daemon, seals files just closed there before a
    command names them; *workers* runs what leaves the loop (the daemon's one
    :class:`Workers`). ``request_shutdown`` is set by the daemon that serves it."""

    def __init__(
        self,
        store: Store,
        mountpoint: str,
        opstats: Any = None,
        access: AccessPolicy | None = None,
        mount: MountSide | None = None,
        *,
        origin: str = "",
        workers: Workers | None = None,
    ) -> None:
        self.store = store
        self.workers = workers if workers is not None else Workers(store)
        self._thread = self.workers.control
        self.mountpoint = mountpoint
        self.origin = origin  # where the config came from, for df (Config.origin)
        self.opstats = opstats
        self.access = access or AccessPolicy(store=store)
        self.mount = mount
        self.hub = EventHub()
        self.request_shutdown: Callable[[], None] | None = None

    # -- helpers -------------------------------------------------------------------

    async def _sealed(self, *paths: str) -> None:
        """Close-to-open for the tools: the kernel releases a file after ``close`` returned,
        so ``cp big /mnt/kvfs/x && kvfs stat /mnt/kvfs/x`` would otherwise find no block
        yet. Waits for the seals of the blocks named (as an operation on the name does)."""
        if self.mount is not None:
            await self.mount.settle_outside(list(paths))

    def _check_tier(self, tier: str | None) -> None:
        if tier is not None and tier not in [t.name for t in self.store.tiers]:
            raise ControlError(f"no tier named {tier!r}; tiers: {', '.join(t.name for t in self.store.tiers)}")

    def _expand(self, paths: list[str]) -> list[str]:
        """Block names for *paths*: a block itself, a directory everything under it.
        Raises :class:`BlockNotFound` naming the first path that is neither."""
        names: list[str] = []
        seen: set[str] = set()
        for p in paths:
            name = normalize(p)
            if self.store.is_dir(name):
                found = sorted(st.name for st in self.store.walk(name))
            elif self.store.exists(name):
                found = [name]
            else:
                raise BlockNotFound(f"{p or '/'}: no such block or directory")
            for n in found:
                if n not in seen:
                    seen.add(n)
                    names.append(n)
        return names

    @staticmethod
    def _permitted(conn: Connection, paths: list[str]) -> tuple[list[str], list[Failure]]:
        """The request's paths :meth:`Server.authorize` let through, and a failure for
        each it refused (``conn.refused``)."""
        refused = conn.refused
        if not refused:
            return paths, []
        failed = [Failure(name=paths[i], error=str(e), type=error_type(e)) for i, e in sorted(refused.items())]
        return [p for i, p in enumerate(paths) if i not in refused], failed

    async def _each(
        self, conn: Connection, names: list[str], fn: Callable[[str], Any]
    ) -> list[tuple[str, Any, KvfsError | None]]:
        """Run *fn* on every name in worker threads, in batches, streaming progress.
        Returns ``(name, result, error)`` per name; a :class:`KvfsError` is kept, not raised."""

        def batch(chunk: list[str]) -> list[tuple[str, Any, KvfsError | None]]:
            out: list[tuple[str, Any, KvfsError | None]] = []
            for n in chunk:
                try:
                    out.append((n, fn(n), None))
                except KvfsError as exc:
                    out.append((n, None, exc))
            return out

        progress = _Progress(conn, len(names))
        results: list[tuple[str, Any, KvfsError | None]] = []
        await progress.update(0)
        for i in range(0, len(names), _BATCH):
            results += await self._thread(batch, names[i : i + _BATCH])
            await progress.update(len(results))
        return results

    @staticmethod
    def _failures(results: list[tuple[str, Any, KvfsError | None]]) -> list[Failure]:
        return [Failure(name=n, error=str(e), type=error_type(e)) for n, _, e in results if e is not None]

    # -- ops -----------------------------------------------------------------------

    async def op_ping(self, conn: Connection, req: Ping) -> Pong:
        return Pong(mountpoint=self.mountpoint, pid=os.getpid(), version=__version__)

    async def op_shutdown(self, conn: Connection, req: Shutdown) -> ShuttingDown:
        """Flush every block that is only in DRAM down and unmount. Replies at once; the
        daemon exits when both are done (``kvfs umount`` waits for that)."""
        if self.request_shutdown is None:
            raise KvfsError("this control server cannot shut its daemon down")
        self.request_shutdown()
        return ShuttingDown(pid=os.getpid())

    async def op_stat(self, conn: Connection, req: Stat) -> StatResult:
        await self._sealed(req.name)
        return StatResult(block=await self._thread(self.store.stat, req.name))

    async def op_statistics(self, conn: Connection, req: Statistics) -> StatisticsResult:
        return StatisticsResult(statistics=await self._thread(self.store.statistics))

    async def op_ls(self, conn: Connection, req: Ls) -> LsResult:
        """A directory's children (directories, then blocks with their records, by
        name), or the block itself."""
        await self._sealed(req.name)

        def ls() -> LsResult:
            path = normalize(req.name)
            if not self.store.is_dir(path):
                st = self.store.stat(path)
                return LsResult(path=path, type="block", entries=[LsEntry(name=st.name, type="block", block=st)])
            entries = []
            for base, is_dir in sorted(self.store.listdir(path).items()):
                if is_dir:
                    entries.append(LsEntry(name=base, type="dir"))
                    continue
                child = self.store.lookup(f"{path}/{base}" if path else base)
                if child is not None:  # removed since the listing
                    entries.append(LsEntry(name=base, type="block", block=child))
            return LsResult(path=path, type="dir", entries=entries)

        return await self._thread(ls)

    async def op_du(self, conn: Connection, req: Du) -> DuResult:
        """``used`` is bytes against the tier's capacity, ``size`` payload bytes;
        ``quota`` when the path is a namespace."""
        await self._sealed(req.name)
        path = normalize(req.name)
        u = await self._thread(self.store.usage, req.name)
        ns = self.store.namespaces.get(path)
        return DuResult(
            path=path,
            tiers={t: TierUse(used=used, blocks=blocks) for t, used, blocks in u.tiers},
            total=DuTotal(used=sum(t[1] for t in u.tiers), blocks=u.blocks, size=u.size),
            quota=None if ns is None else dict(zip(self.store.namespaces.tier_names, ns.quota, strict=True)),
        )

    async def op_df(self, conn: Connection, req: Df) -> DfResult:
        """The mount's tiers: statistics plus ``mountpoint`` (capacity, used, health) and
        each namespace's use against its quotas."""
        st = await self._thread(self.store.statistics)
        spaces = await self._thread(self.store.namespace_statistics)
        return DfResult(mountpoint=self.mountpoint, statistics=st, namespaces=spaces, config=self.origin)

    async def op_quota_show(self, conn: Connection, req: QuotaShow) -> QuotaResult:
        """Every namespace, or the one at ``req.name``, with use, quota, copies and quota
        evictions per tier."""

        def show() -> QuotaResult:
            try:
                return QuotaResult(namespaces=self.store.namespace_statistics(req.name))
            except KeyError as exc:
                raise ControlError(f"{req.name or '/'}: not a namespace; kvfs quota set makes one") from exc

        return await self._thread(show)

    async def op_quota_set(self, conn: Connection, req: QuotaSet) -> QuotaResult:
        """Set a namespace's quotas (tier -> bytes, None to drop one) and, when given, its
        retention (seconds; 0 drops it). Lowering a quota evicts down to it now."""
        for tier in req.quotas:
            self._check_tier(tier)

        def apply() -> QuotaResult:
            for tier, q in req.quotas.items():
                self.store.set_quota(req.name, tier, q)
            if req.retention is not None:
                self.store.set_retention(req.name, req.retention or None)
            return QuotaResult(namespaces=self.store.namespace_statistics(normalize(req.name)))

        try:
            return await self._thread(apply)
        except ValueError as exc:
            raise ControlError(str(exc)) from exc
        except KeyError:  # nothing to set, and no namespace there to show
            raise ControlError(
                f"{req.name or '/'}: not a namespace; give a quota (or a retention) to make one"
            ) from None

    async def op_top(self, conn: Connection, req: Top) -> TopResult:
        """A snapshot for ``kvfs top``: wall time, store statistics, events lost by the
        store's queue, subscribers, and FUSE op counts when the mount records them."""
        st = await self._thread(self.store.statistics)
        ops = []
        if self.opstats is not None:
            ops = [
                OpCount(op=s.op, count=s.count, errors=s.errors, seconds=s.total_seconds)
                for s in self.opstats.snapshot()
            ]
        return TopResult(
            time=time.time(),
            mountpoint=self.mountpoint,
            statistics=st,
            events_dropped=self.store.events.dropped,
            subscribers=self.hub.subscribers,
            ops=ops,
        )

    async def op_pin(self, conn: Connection, req: Pin) -> PinResult:
        """Pin (or unpin) blocks; a directory means every block under it; ``req.ttl``: a soft
        pin that ends by itself after that many seconds."""
        paths, refused = self._permitted(conn, req.paths)
        await self._sealed(*paths)

        def pin() -> PinResult:
            names = self._expand(paths)
            changed = 0
            for n in names:
                try:
                    before = self.store.stat(n).pinned
                    self.store.pin(n, req.pinned, ttl=req.ttl)
                except BlockNotFound:
                    continue  # removed since the expansion
                changed += before != req.pinned
            return PinResult(blocks=len(names), changed=changed, failed=refused)

        return await self._thread(pin)

    async def op_prefetch(self, conn: Connection, req: Prefetch) -> PrefetchResult:
        """Copy blocks into *tier* (the hottest by default)."""
        self._check_tier(req.tier)
        target = req.tier or self.store.tiers[0].name
        paths, refused = self._permitted(conn, req.paths)
        await self._sealed(*paths)
        names = await self._thread(self._expand, paths)

        def fetch(n: str) -> bool:
            before = self.store.stat(n)
            self.store.prefetch(n, req.tier)
            return target not in before.tiers

        results = await self._each(conn, names, fetch)
        return PrefetchResult(
            blocks=len(names),
            tier=target,
            fetched=sum(1 for _, r, e in results if e is None and r),
            already=sum(1 for _, r, e in results if e is None and not r),
            failed=refused + self._failures(results),
        )

    async def op_evict(self, conn: Connection, req: Evict) -> EvictResult:
        """Drop copies from *tier* (default: every local tier), never a pinned block's nor
        a last copy unless *force*."""
        self._check_tier(req.tier)
        paths, refused = self._permitted(conn, req.paths)
        await self._sealed(*paths)
        names = await self._thread(self._expand, paths)

        def evict(n: str) -> tuple[bool, bool]:
            before = self.store.stat(n)
            after = self.store.evict(n, req.tier, force=req.force)
            return after is None, after is None or after.tiers != before.tiers

        results = await self._each(conn, names, evict)
        failed = [
            Failure(name=f.name, error=f.error.replace("use --force", "use kvfs evict --force"), type=f.type)
            if f.type in (LastCopy.__name__, Pinned.__name__)
            else f
            for f in self._failures(results)
        ]
        failed = refused + failed
        ok = [r for _, r, e in results if e is None]
        return EvictResult(
            blocks=len(names),
            evicted=sum(1 for gone, moved in ok if moved),
            removed=sum(1 for gone, _ in ok if gone),
            failed=failed,
        )

    async def op_hint(self, conn: Connection, req: Advise) -> Advised:
        """Pass an engine's or router's advice about a chain to every tier's policy."""
        try:
            when = Hint(req.when)
        except ValueError:
            raise ProtocolError(f"hint.when: {req.when!r} is not one of {', '.join(h.value for h in Hint)}") from None
        if len(req.names) > _MAX_ADVICE:
            raise ProtocolError(f"hint: {len(req.names)} names in one request, at most {_MAX_ADVICE}; split it")
        if len(req.names) > _ADVICE_ON_LOOP:  # a long chain's policy updates leave the FUSE loop
            return Advised(known=await self._thread(self.store.hint, req.names, when))
        return Advised(known=await self.workers.loop_or(self._thread, self.store.hint, req.names, when))

    async def op_fsck(self, conn: Connection, req: Fsck) -> FsckResult:
        """Read every copy of every block (under *name*) on every tier and check its
        checksum; with *repair* drop bad copies."""
        await self._sealed(req.name)
        names = await self._thread(self._expand, [req.name])

        def verify(n: str) -> dict[str, str | None]:
            return self.store.verify(n, repair=req.repair)

        results = await self._each(conn, names, verify)
        bad: list[CopyProblem] = []
        unavailable: list[CopyProblem] = []
        removed: list[str] = []
        copies = 0
        for n, checks, err in results:
            if err is not None:
                continue  # removed since the expansion
            copies += len(checks)
            for tier, why in checks.items():
                if why is None:
                    continue
                entry = CopyProblem(name=n, tier=tier, error=why.removeprefix(f"{n}: "))
                (unavailable if why.startswith("tier unavailable") else bad).append(entry)
            if req.repair and checks and all(why for why in checks.values()) and not self.store.exists(n):
                removed.append(n)
        return FsckResult(
            blocks=len(names), copies=copies, bad=bad, unavailable=unavailable, removed=removed, repaired=req.repair
        )

    async def op_events(self, conn: Connection, req: Events) -> None:
        """Stream an :class:`EventItem` for every block event from now on, until the
        client hangs up (noticed at once, even with no events flowing). A client that
        falls too far behind gets, after the events it was sent, a
        :class:`SubscriberTooSlow` error saying how many it lost."""
        hung_up = False
        lost = 0

        async def until_hangup(cancel: trio.CancelScope) -> None:
            # The client sends nothing more; EOF means it is gone. Noticing that now,
            # not at the next event, keeps idle subscriptions from piling up.
            nonlocal hung_up
            await conn.receive()
            hung_up = True
            cancel.cancel()

        owner = conn.session.owner
        with self.hub.subscribe(cut_off=True, after=self.store.events.seq) as events:
            await conn.send(Subscribed())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_hangup, nursery.cancel_scope)
                while not lost:
                    for ev in await events.receive():
                        if isinstance(ev, Gap):
                            lost = events.lost
                            break
                        if owner or self.access.may_read(conn.peer, ev.name):  # never another tenant's names
                            await conn.send(EventItem(event=ev))
                nursery.cancel_scope.cancel()  # it fell behind: stop watching
        if hung_up:
            return
        raise SubscriberTooSlow(
            f"this subscriber fell more than {self.hub.buffer} events behind and was cut off; "
            f"{lost} events were lost; subscribe again (and read faster)"
        )

    async def pump_events(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Drain the store's event queue forever and publish to :attr:`hub`. :func:`serve`
        runs it; only one task may drain a store's events. It polls only while someone
        subscribes: with nobody, it wakes once a second to empty the queue (an idle
        daemon does not spin). Every drain is shown to the mount first, whose kernel
        forgets the names the events changed (so it may cache sealed names long)."""
        task_status.started()
        while True:
            if not self.hub.subscribers:
                with trio.move_on_after(_EVENT_IDLE_DRAIN):
                    await self.hub.until_subscribed()
            events = self.store.events.drain()  # a lock and a list copy: fine on the loop
            if self.mount is not None:  # names removed or replaced behind the kernel's cache
                self.mount.names_changed(events, self.store.events.dropped)
            if events:
                self.hub.publish(events)
            if self.hub.subscribers:
                await trio.sleep(_EVENT_POLL)


_Op = Callable[[Connection, Any], Awaitable[Message | None]]


class Server:
    """Every request on the daemon's sockets: decode, authorize, dispatch (see the module
    doc). *client* configures the batch client's side (group socket, leases, puts);
    *origin* says where the mount's config came from (``kvfs df`` shows it); *workers*
    runs what leaves the loop (the daemon's one :class:`Workers`; its own when not given)."""

    def __init__(
        self,
        store: Store,
        mountpoint: str,
        *,
        opstats: Any = None,
        client: ClientConfig = ClientConfig(),
        access: AccessPolicy | None = None,
        mount: MountSide | None = None,
        origin: str = "",
        limits: PeerLimits | None = None,
        workers: Workers | None = None,
    ) -> None:
        self.store = store
        self.config = client
        self.limits = limits if limits is not None else PeerLimits(client)
        self.access = access or AccessPolicy(group_writes=client.group_writes, store=store)
        self.workers = workers if workers is not None else Workers(store)
        self.control = ControlHandler(
            store, mountpoint, opstats, self.access, mount, origin=origin, workers=self.workers
        )
        self.clients = ClientOps(store, mountpoint, client, self.access, mount, workers=self.workers)
        self._ops: dict[str, _Op] = {}
        for handler in (self.control, self.clients):
            for attr in dir(handler):
                if attr.startswith("op_"):
                    self._ops[attr[3:]] = getattr(handler, attr)

    @property
    def hub(self) -> EventHub:
        return self.control.hub

    def authorize(self, conn: Connection, request: Request) -> None:
        """The one place a request is authorized: raise to refuse it; the names of a
        batch refused one by one are left in ``conn.refused`` for its op to fail."""
        conn.refused = self.access.authorize(conn.peer, request)

    async def _answer(self, conn: Connection, frame: bytes) -> None:
        big = False
        try:
            request = is_request(decode(frame, max_values=MAX_VALUES))
            big = batch_size(request) > _ENCODE_ON_LOOP
            self.authorize(conn, request)
            op = self._ops[request.kind]
            reply = await op(conn, request)
        except KvfsError as exc:
            await conn.send_error(exc)
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except Exception as exc:  # a bug must not take the server down: report it
            log.exception("request %r failed", frame[:200])
            await conn.send_error(InternalError(f"internal error: {exc!r}"))
            return
        if reply is not None:
            await conn.send(reply, big=big)

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        """Serve one accepted connection until the peer hangs up; then give back what its
        session holds (leases, reservations)."""
        peer = Peer.of_socket(stream.socket)  # type: ignore[arg-type]  # a trio socket has getsockopt
        conn = Connection(
            stream, Session(peer=peer, owner=self.access.is_owner(peer)), self.limits, cpu=self.workers.cpu
        )
        try:
            self.limits.admit(peer.uid)
        except LimitReached as exc:  # answered and closed at once: its descriptor is back
            n = self.limits.refused
            if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th...: a flood does not flood the log
                log.warning("connection of pid %s (uid %d) refused (%d so far): %s", peer.pid, peer.uid, n, exc)
            async with stream:
                with trio.move_on_after(1):
                    await conn.send_error(exc)
            return
        try:
            async with stream:
                while True:
                    try:
                        frame = await conn.receive()
                    except (ProtocolError, LimitReached) as exc:  # the stream is lost
                        if isinstance(exc, LimitReached):
                            log.warning("connection of pid %s (uid %d) closed: %s", peer.pid, peer.uid, exc)
                        await conn.send_error(exc)
                        return
                    if frame is None:
                        return
                    await self._answer(conn, frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client hung up mid-reply (how ``events`` normally ends)
        finally:
            conn.close()
            self.limits.leave(peer.uid)
            if conn.session.holds_anything:
                with trio.CancelScope(shield=True):
                    await self.workers.client(conn.session.close, self.store)


def group_id(group: str) -> int:
    """The gid of *group* (a name or a number); :class:`ControlError` if unknown."""
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ControlError(f"client.group: no group named {group!r} on this machine") from None


async def _bind(path: Path, mode: int, gid: int | None) -> trio.SocketListener:
    """Listen on *path* (replacing a stale socket) with *mode* and group *gid*; the socket
    is created closed to everyone and opened only once its owner and mode are set."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    old_umask = os.umask(0o077)
    try:
        await sock.bind(str(path))
    finally:
        os.umask(old_umask)
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, mode)
    sock.listen(64)
    return trio.SocketListener(sock)


async def serve(server: Server, path: Path, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on *path* (owner-only) and, with ``[client] socket``, on that path for its
    group (0660), until cancelled; the sockets are removed on exit. Also runs
    ``server.control.pump_events`` (the fan-out of the store's events) meanwhile."""
    paths = [Path(path)]
    listeners = [await _bind(paths[0], 0o600, None)]
    cfg = server.config
    if cfg.socket is not None:
        if not Path(cfg.socket).parent.is_dir():
            raise ControlError(
                f"client.socket: the directory {Path(cfg.socket).parent} does not exist; create it, open to the "
                "group the socket is for"
            )
        gid = group_id(cfg.group) if cfg.group is not None else None
        paths.append(Path(cfg.socket))
        listeners.append(await _bind(paths[1], 0o660 if gid is not None else 0o600, gid))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.control.pump_events)
            task_status.started()
            await trio.serve_listeners(server.serve_connection, listeners, handler_nursery=nursery)
    finally:
        for p in paths:
            try:
                p.unlink()
            except FileNotFoundError:
                pass
