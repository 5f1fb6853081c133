"""The daemon's control socket: JSON lines over a Unix socket, owner-only.

A request is one JSON object per line, ``{"op": NAME, "args": {...}}``; the reply is one
line, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": MESSAGE, "type":
ERROR CLASS}``. Store calls run in worker threads, never on the FUSE loop.

Streaming ops (methods marked ``streaming = True``: prefetch, evict, fsck, events) first
send any number of item lines, objects without an ``"ok"`` key, then the usual final
reply: ``{"progress": {"done": N, "total": M}}`` while working through many blocks,
``{"event": {...}}`` for each block event. ``events`` never ends on its own: the client
hangs up when it has seen enough.

Ops are methods ``op_<name>`` of :class:`ControlHandler`; adding an op is adding a method.
The ops, their arguments and results are listed in ``docs/tools.md``.

Events: the store queues them (``store.events``); :func:`serve` starts
:meth:`ControlHandler.pump_events`, the one task that drains that queue, and hands every
event to every subscriber of :attr:`ControlHandler.hub` (``kvfs events`` clients, and any
other consumer in the daemon that calls ``hub.subscribe()``), each in order.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from kvfs.errors import BlockNotFound, KvfsError
from kvfs.events import Event
from kvfs.names import normalize
from kvfs.store import LastCopy, Store

__all__ = ["ControlError", "ControlHandler", "EventHub", "SubscriberTooSlow", "serve"]

log = logging.getLogger("kvfs.mount.control")

_BATCH = 64  # blocks handled per worker-thread call in multi-block ops
_PROGRESS_EVERY = 0.1  # seconds between progress lines
_EVENT_POLL = 0.02  # seconds between drains of the store's event queue


class ControlError(KvfsError):
    """Raised by an op for a request that cannot be served as asked (an unknown tier)."""


class SubscriberTooSlow(KvfsError):
    """Raised to an ``events`` subscriber whose backlog passed the hub's buffer: it was
    cut off rather than let one slow reader hold events back from the others."""


def _streaming(fn):
    fn.streaming = True
    return fn


async def _send(stream: trio.SocketStream, obj: dict) -> None:
    await stream.send_all(json.dumps(obj).encode() + b"\n")


class EventHub:
    """Fan-out of block events: every subscriber gets every published event, in order.

    Each subscriber has its own bounded buffer (*buffer* events). A subscriber that falls
    that far behind is cut off (its channel closed) instead of slowing the others. The
    buffer must also hold one publish's burst: :meth:`ControlHandler.pump_events` drains
    every 20 ms, so 10k events keep up with 500k events/s.
    """

    def __init__(self, buffer: int = 10_000) -> None:
        self.buffer = buffer
        self._subs: dict[trio.MemorySendChannel, bool] = {}  # channel -> cut off

    @property
    def subscribers(self) -> int:
        """Subscribers receiving events (not counting any cut off but not yet gone)."""
        return sum(1 for cut in self._subs.values() if not cut)

    @contextmanager
    def subscribe(self) -> Iterator[trio.MemoryReceiveChannel]:
        """A channel receiving every event published while the ``with`` block is open."""
        send, receive = trio.open_memory_channel[Event](self.buffer)
        self._subs[send] = False
        try:
            yield receive
        finally:
            self._subs.pop(send, None)
            send.close()
            receive.close()

    def publish(self, events: list[Event]) -> None:
        for send in list(self._subs):
            if self._subs[send]:
                continue
            for ev in events:
                try:
                    send.send_nowait(ev)
                except trio.WouldBlock:
                    log.warning("an events subscriber fell %d events behind; cutting it off", self.buffer)
                    self._subs[send] = True
                    send.close()
                    break
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break


class _Progress:
    """Sends ``{"progress": {"done", "total"}}`` lines, at most every 0.1 s, and the last."""

    def __init__(self, stream: trio.SocketStream, total: int) -> None:
        self.stream = stream
        self.total = total
        self._last = 0.0

    async def update(self, done: int) -> None:
        now = time.monotonic()
        if done == self.total or now - self._last >= _PROGRESS_EVERY:
            self._last = now
            await _send(self.stream, {"progress": {"done": done, "total": self.total}})


class ControlHandler:
    """Maps control ops onto the store. *mountpoint* is reported by ``ping``; *opstats*
    (a :class:`~kvfs.mount.opstats.OpStats`, optional) adds FUSE op counts to ``top``."""

    def __init__(self, store: Store, mountpoint: str, opstats=None) -> None:
        self.store = store
        self.mountpoint = mountpoint
        self.opstats = opstats
        self.hub = EventHub()

    # -- helpers -------------------------------------------------------------------

    def _check_tier(self, tier: str | None) -> None:
        if tier is not None and tier not in (t.name for t in self.store.tiers):
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

    async def _each(
        self, stream: trio.SocketStream, names: list[str], fn: Callable[[str], object]
    ) -> list[tuple[str, object, KvfsError | None]]:
        """Run *fn* on every name in worker threads, in batches, streaming progress.
        Returns ``(name, result, error)`` per name; a :class:`KvfsError` is kept, not raised."""

        def batch(chunk: list[str]) -> list[tuple[str, object, KvfsError | None]]:
            out = []
            for n in chunk:
                try:
                    out.append((n, fn(n), None))
                except KvfsError as exc:
                    out.append((n, None, exc))
            return out

        progress = _Progress(stream, len(names))
        results: list[tuple[str, object, KvfsError | None]] = []
        await progress.update(0)
        for i in range(0, len(names), _BATCH):
            results += await trio.to_thread.run_sync(batch, names[i : i + _BATCH])
            await progress.update(len(results))
        return results

    @staticmethod
    def _failures(results) -> list[dict]:
        return [{"name": n, "error": str(e), "type": type(e).__name__} for n, _, e in results if e is not None]

    # -- ops -----------------------------------------------------------------------

    async def op_ping(self) -> dict:
        return {"mountpoint": self.mountpoint, "pid": os.getpid()}

    async def op_shutdown(self) -> dict:
        """Flush every block that is only in DRAM down and unmount. Replies at once; the
        daemon exits when both are done (``kvfs umount`` waits for that)."""
        request = getattr(self, "request_shutdown", None)  # set by the daemon that serves
        if request is None:
            raise KvfsError("this control server cannot shut its daemon down")
        request()
        return {"pid": os.getpid()}

    async def op_stat(self, name: str) -> dict:
        st = await trio.to_thread.run_sync(self.store.stat, name)
        return st.to_json()

    async def op_statistics(self) -> dict:
        return (await trio.to_thread.run_sync(self.store.statistics)).to_json()

    async def op_ls(self, name: str = "") -> dict:
        """``{"path", "type": "dir"|"block", "entries": [...]}``: a directory's children
        (directories as ``{"name", "type": "dir"}``, blocks with their stat fields and
        ``"type": "block"``, ``name`` the basename), or the block itself."""

        def ls() -> dict:
            path = normalize(name)
            if not self.store.is_dir(path):
                st = self.store.stat(path)
                return {"path": path, "type": "block", "entries": [{**st.to_json(), "type": "block"}]}
            entries = []
            for base, is_dir in sorted(self.store.listdir(path).items()):
                if is_dir:
                    entries.append({"name": base, "type": "dir"})
                    continue
                st = self.store.lookup(f"{path}/{base}" if path else base)
                if st is not None:  # removed since the listing
                    entries.append({**st.to_json(), "name": base, "type": "block"})
            return {"path": path, "type": "dir", "entries": entries}

        return await trio.to_thread.run_sync(ls)

    async def op_du(self, name: str = "") -> dict:
        """``{"path", "tiers": {tier: {"used", "blocks"}}, "total": {"used", "blocks",
        "size"}, "quota": {tier: bytes or null} or null}``; ``used`` is bytes against the
        tier's capacity, ``size`` payload bytes; ``quota`` when *name* is a namespace."""
        path = normalize(name)
        u = await trio.to_thread.run_sync(self.store.usage, name)
        ns = self.store.namespaces.get(path)
        return {
            "path": path,
            "tiers": {t: {"used": used, "blocks": blocks} for t, used, blocks in u.tiers},
            "total": {"used": sum(t[1] for t in u.tiers), "blocks": u.blocks, "size": u.size},
            "quota": None if ns is None else dict(zip(self.store.namespaces.tier_names, ns.quota, strict=True)),
        }

    async def op_df(self) -> dict:
        """The mount's tiers: statistics plus ``mountpoint`` (capacity, used, health) and
        ``namespaces`` (each namespace's use against its quotas, as ``quota_show``)."""
        st = (await trio.to_thread.run_sync(self.store.statistics)).to_json()
        spaces = await trio.to_thread.run_sync(self.store.namespace_statistics)
        return {"mountpoint": self.mountpoint, **st, "namespaces": [n.to_json() for n in spaces]}

    async def op_quota_show(self, name: str | None = None) -> dict:
        """``{"namespaces": [NamespaceStatistics.to_json()]}``: every namespace, or the one
        at *name*, with use, quota, copies and quota evictions per tier."""

        def show() -> dict:
            try:
                spaces = self.store.namespace_statistics(name)
            except KeyError as exc:
                raise ControlError(f"{name or '/'}: not a namespace; kvfs quota set makes one") from exc
            return {"namespaces": [n.to_json() for n in spaces]}

        return await trio.to_thread.run_sync(show)

    async def op_quota_set(
        self, name: str, quotas: dict[str, int | None] | None = None, retention: float | None = None
    ) -> dict:
        """Set namespace *name*'s *quotas* (tier -> bytes, null to drop one) and, when
        given, its *retention* (seconds; 0 drops it). Lowering a quota evicts down to it
        now. Returns the namespace as ``quota_show`` does."""
        quotas = quotas or {}
        for tier in quotas:
            self._check_tier(tier)

        def apply() -> dict:
            for tier, q in quotas.items():
                self.store.set_quota(name, tier, q)
            if retention is not None:
                self.store.set_retention(name, retention or None)
            return self.store.namespace_statistics(normalize(name))[0].to_json()

        try:
            return await trio.to_thread.run_sync(apply)
        except ValueError as exc:
            raise ControlError(str(exc)) from exc

    async def op_top(self) -> dict:
        """A snapshot for ``kvfs top``: wall time, store statistics, events lost by the
        store's queue, subscribers, and FUSE op counts when the mount records them."""
        st = await trio.to_thread.run_sync(self.store.statistics)
        ops = []
        if self.opstats is not None:
            ops = [
                {"op": s.op, "count": s.count, "errors": s.errors, "seconds": s.total_seconds}
                for s in self.opstats.snapshot()
            ]
        return {
            "time": time.time(),
            "mountpoint": self.mountpoint,
            "statistics": st.to_json(),
            "events_dropped": self.store.events.dropped,
            "subscribers": self.hub.subscribers,
            "ops": ops,
        }

    async def op_pin(self, paths: list[str], pinned: bool = True, ttl: float | None = None) -> dict:
        """Pin (or unpin) blocks; a directory means every block under it; *ttl*: a soft
        pin that ends after *ttl* seconds. ``{"blocks": N, "changed": M}``."""

        def pin() -> dict:
            names = self._expand(paths)
            changed = 0
            for n in names:
                try:
                    before = self.store.stat(n).pinned
                    self.store.pin(n, pinned, ttl=ttl)
                except BlockNotFound:
                    continue  # removed since the expansion
                changed += before != pinned
            return {"blocks": len(names), "changed": changed}

        return await trio.to_thread.run_sync(pin)

    @_streaming
    async def op_prefetch(self, stream: trio.SocketStream, paths: list[str], tier: str | None = None) -> dict:
        """Copy blocks into *tier* (the hottest by default). ``{"blocks", "fetched"
        (copied now), "already" (were there), "failed": [{"name", "error", "type"}]}``."""
        self._check_tier(tier)
        target = tier or self.store.tiers[0].name
        names = await trio.to_thread.run_sync(self._expand, paths)

        def fetch(n: str) -> bool:
            before = self.store.stat(n)
            self.store.prefetch(n, tier)
            return target not in before.tiers

        results = await self._each(stream, names, fetch)
        return {
            "blocks": len(names),
            "tier": target,
            "fetched": sum(1 for _, r, e in results if e is None and r),
            "already": sum(1 for _, r, e in results if e is None and not r),
            "failed": self._failures(results),
        }

    @_streaming
    async def op_evict(
        self, stream: trio.SocketStream, paths: list[str], tier: str | None = None, force: bool = False
    ) -> dict:
        """Drop copies from *tier* (default: every local tier), never a last copy unless
        *force*. ``{"blocks", "evicted", "removed" (blocks gone entirely), "failed"}``."""
        self._check_tier(tier)
        names = await trio.to_thread.run_sync(self._expand, paths)

        def evict(n: str) -> tuple[bool, bool]:
            before = self.store.stat(n)
            after = self.store.evict(n, tier, force=force)
            return after is None, after is None or after.tiers != before.tiers

        results = await self._each(stream, names, evict)
        failed = self._failures(results)
        for f in failed:
            if f["type"] == LastCopy.__name__:
                f["error"] = f["error"].replace("use --force", "use kvfs evict --force")
        ok = [r for _, r, e in results if e is None]
        return {
            "blocks": len(names),
            "evicted": sum(1 for gone, moved in ok if moved),
            "removed": sum(1 for gone, _ in ok if gone),
            "failed": failed,
        }

    @_streaming
    async def op_fsck(self, stream: trio.SocketStream, name: str = "", repair: bool = False) -> dict:
        """Read every copy of every block (under *name*) on every tier and check its
        checksum; with *repair* drop bad copies. ``{"blocks", "copies", "bad": [{"name",
        "tier", "error"}], "unavailable": [...], "removed": [names left with no copy],
        "repaired": bool}``."""
        names = await trio.to_thread.run_sync(self._expand, [name])

        def verify(n: str) -> dict[str, str | None]:
            return self.store.verify(n, repair=repair)

        results = await self._each(stream, names, verify)
        bad, unavailable, removed, copies = [], [], [], 0
        for n, checks, err in results:
            if err is not None:
                continue  # removed since the expansion
            copies += len(checks)
            for tier, why in checks.items():
                if why is None:
                    continue
                entry = {"name": n, "tier": tier, "error": why.removeprefix(f"{n}: ")}
                (unavailable if why.startswith("tier unavailable") else bad).append(entry)
            if repair and checks and all(why for why in checks.values()) and not self.store.exists(n):
                removed.append(n)
        return {
            "blocks": len(names),
            "copies": copies,
            "bad": bad,
            "unavailable": unavailable,
            "removed": removed,
            "repaired": repair,
        }

    @_streaming
    async def op_events(self, stream: trio.SocketStream) -> None:
        """Stream ``{"event": Event.to_json()}`` lines for every block event from now on,
        until the client hangs up (noticed at once, even with no events flowing). A client
        that falls too far behind gets a :class:`SubscriberTooSlow` error."""
        hung_up = False

        async def until_hangup(cancel: trio.CancelScope) -> None:
            # The client sends nothing more; EOF means it is gone. Noticing that now,
            # not at the next event, keeps idle subscriptions from piling up.
            nonlocal hung_up
            try:
                while await stream.receive_some(4096):
                    pass
            except trio.BrokenResourceError:
                pass
            hung_up = True
            cancel.cancel()

        with self.hub.subscribe() as events:
            await _send(stream, {"subscribed": True})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_hangup, nursery.cancel_scope)
                async for ev in events:
                    await _send(stream, {"event": ev.to_json()})
                nursery.cancel_scope.cancel()  # the hub cut us off: stop watching
        if hung_up:
            return
        raise SubscriberTooSlow(
            f"this subscriber fell more than {self.hub.buffer} events behind and was cut off; events were lost"
        )

    async def pump_events(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Drain the store's event queue forever and publish to :attr:`hub`. :func:`serve`
        runs it; only one task may drain a store's events."""
        task_status.started()
        while True:
            events = self.store.events.drain()  # a lock and a list copy: fine on the loop
            if events:
                self.hub.publish(events)
            await trio.sleep(_EVENT_POLL)

    # -- dispatch ------------------------------------------------------------------

    async def handle(self, request: dict, stream: trio.SocketStream) -> dict | None:
        if not isinstance(request, dict):
            return {"ok": False, "error": "a request is a JSON object", "type": "BadRequest"}
        op = request.get("op")
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if fn is None:
            return {"ok": False, "error": f"unknown op {op!r}", "type": "UnknownOp"}
        args = request.get("args") or {}
        try:
            if getattr(fn, "streaming", False):
                return {"ok": True, "result": await fn(stream, **args)}
            return {"ok": True, "result": await fn(**args)}
        except KvfsError as exc:
            return {"ok": False, "error": str(exc), "type": type(exc).__name__}
        except TypeError as exc:
            return {"ok": False, "error": f"bad arguments for {op}: {exc}", "type": "BadRequest"}
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None  # the client hung up mid-stream (how ``events`` normally ends)
        except Exception as exc:  # a bug must not take the control server down: report it
            log.exception("control op %s failed", op)
            return {"ok": False, "error": f"internal error in {op}: {exc!r}", "type": "InternalError"}


async def _serve_client(handler: ControlHandler, stream: trio.SocketStream) -> None:
    buf = b""
    async with stream:
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    request = json.loads(line)
                except ValueError:
                    reply = {"ok": False, "error": "request is not JSON", "type": "BadRequest"}
                else:
                    reply = await handler.handle(request, stream)
                if reply is not None:
                    try:
                        await stream.send_all(json.dumps(reply).encode() + b"\n")
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return


async def serve(handler: ControlHandler, path: Path, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Listen on *path* (replacing a stale socket) until cancelled; removes it on exit.

    Also runs ``handler.pump_events`` (the fan-out of the store's events) for as long as
    it listens."""
    path = Path(path)
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
    os.chmod(path, 0o600)
    sock.listen(64)
    listener = trio.SocketListener(sock)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(handler.pump_events)
            task_status.started()
            await trio.serve_listeners(lambda s: _serve_client(handler, s), [listener], handler_nursery=nursery)
    finally:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
