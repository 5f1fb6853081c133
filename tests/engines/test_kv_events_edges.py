"""KV events at the edges (issue 20, items 2 and 6): the ZMQ publisher sends only the block
names its audience may read -- checked with a real second user subscribing -- and a
subscriber that falls behind is told with ``AllBlocksCleared`` and never ends the daemon.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from kvfs.client import Client
from kvfs.config import ConfigError, parse_config
from kvfs.events import Event, EventKind

from support import SUPPORT_DIR
from support.configs import dram_over_disk
from support.deadlines import wait_for
from support.users import users  # noqa: F401  (a fixture)

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

PEER = SUPPORT_DIR / "zmq_peer.py"

CONFIG = (
    dram_over_disk("16MiB", "64MiB", "{data}/disk")
    + """
[events]
zmq = "{addr}"
{audience}

[[namespaces]]
path = "priv"
owner = 0
mode = "0700"

[[namespaces]]
path = "shared"
owner = 0
mode = "0755"
"""
)


def _hex(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _name(ns: str, h: str) -> str:
    return f"{ns}/{h[:2]}/{h}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Subscriber:
    """tests/support/zmq_peer.py as uid:gid, subscribed to *addr* until it sees *stop*."""

    def __init__(self, addr: str, uid: int, gid: int, stop: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), addr, str(uid), str(gid), stop, "120"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        assert line.strip() == "READY", line + self.proc.stderr.read()
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    @property
    def live(self) -> bool:
        return "LIVE" in self.lines

    def result(self) -> dict:
        self.proc.wait(timeout=150)
        self._reader.join(10)
        assert self.proc.returncode == 0, self.proc.stderr.read()
        return json.loads(self.lines[-1])

    def stop(self) -> dict:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._reader.join(10)
        return json.loads(self.lines[-1]) if self.lines and self.lines[-1].startswith("{") else {"events": []}


def _until_live(mp: Path, sub: Subscriber) -> None:
    """Put probe blocks (outside every namespace) until *sub* receives one: ZMQ's
    subscription reaches the publisher some time after the connect."""
    with Client(mp, write=True) as c:
        i = 0

        def probe() -> bool:
            nonlocal i
            i += 1
            c.put([_name("open", _hex("probe", i))], [b"p"])
            return sub.live

        wait_for(probe, timeout=60, interval=0.1)


def _activity(mp: Path, stop: str) -> dict[str, list[str]]:
    """Blocks in the private namespace, the shared one and outside every namespace, then
    the stop block (outside). Their hashes by where they are."""
    made: dict[str, list[str]] = {"priv": [], "shared": [], "open": []}
    with Client(mp, write=True) as c:
        for ns, hashes in made.items():
            for i in range(3):
                h = _hex(ns, i, str(mp))
                hashes.append(h)
                c.put([_name(ns, h)], [bytes([i]) * 4096])
        c.put([_name("open", stop)], [b"end"])
    return made


def test_the_publisher_sends_a_second_user_only_what_every_user_may_read(kvfs_mount, users, tmp_path):
    eve = users("eve")["eve"]
    addr = f"tcp://127.0.0.1:{_free_port()}"  # any local user can connect to it
    mp = kvfs_mount(CONFIG.format(data=tmp_path, addr=addr, audience=""))  # audience: everyone, the default
    stop = _hex("stop", str(mp))
    sub = Subscriber(addr, eve[0], eve[1], stop)
    _until_live(mp, sub)
    made = _activity(mp, stop)
    res = sub.result()
    assert res["stopped"], res
    seen = {h for _, h in res["events"]}
    assert set(made["open"]) <= seen and set(made["shared"]) <= seen  # others may read those: sent
    assert not set(made["priv"]) & seen  # 0700: never sent, not even removed
    assert {t for t, _ in res["events"]} <= {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


def test_an_owner_publisher_is_a_socket_only_the_owner_can_reach(kvfs_mount, users, tmp_path):
    eve = users("eve")["eve"]
    d = Path(tempfile.mkdtemp(prefix="kvfs-ev-", dir="/tmp"))
    try:
        os.chmod(d, 0o755)  # eve may reach the socket file: its own mode must keep her out
        addr = f"ipc://{d}/events"
        mp = kvfs_mount(CONFIG.format(data=tmp_path, addr=addr, audience='audience = "owner"'))
        assert stat.S_IMODE(os.stat(d / "events").st_mode) == 0o600
        stop = _hex("stop", str(mp))
        theirs = Subscriber(addr, eve[0], eve[1], stop)
        mine = Subscriber(addr, os.getuid(), os.getgid(), stop)
        _until_live(mp, mine)
        made = _activity(mp, stop)
        res = mine.result()
        assert res["stopped"] and set(made["priv"]) <= {h for _, h in res["events"]}  # the owner gets every name
        assert theirs.stop()["events"] == []  # eve could not connect
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_an_audience_that_any_user_could_join_is_refused_for_every_name():
    base = {"tiers": [{"kind": "dram", "capacity": "8MiB", "prefault": False, "mlock": False}]}
    for audience in ("owner", "group:nogroup"):
        with pytest.raises(ConfigError, match="needs an ipc:// address"):
            parse_config({**base, "events": {"zmq": "tcp://127.0.0.1:5557", "audience": audience}})
    with pytest.raises(ConfigError, match="is not one of everyone, owner, all, group:NAME"):
        parse_config({**base, "events": {"zmq": "tcp://127.0.0.1:5557", "audience": "friends"}})
    assert parse_config({**base, "events": {"zmq": "ipc:///run/x", "audience": "group:nogroup"}}).events.audience


def test_a_burst_past_the_hub_buffer_is_a_resync_never_the_end_of_the_publisher(tmp_path):
    """15,000 events in one drain (one client committing small blocks while another keeps
    the loop busy): the publisher's queue holds 10,000; the rest are dropped, counted and
    replaced by AllBlocksCleared, and the publisher goes on with the next events."""
    import msgpack
    import trio
    import zmq

    from kvfs.config import EventsConfig
    from kvfs.mount.eventhub import EventHub
    from kvfs.mount.kv_events import Audience, KvEventPublisher, publish_hub

    class Tier:
        name, shared = "dram", False

        class kind:
            value = "dram"

    addr = f"ipc://{tmp_path}/burst"
    pub = KvEventPublisher(addr)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(addr)
    hashes = [_hex("burst", i) for i in range(15_001)]
    events = [Event(i, 0.0, EventKind.STORED, _name("b", h), "dram", 1, "", None) for i, h in enumerate(hashes)]
    got: list[tuple[str, str | None]] = []

    def drain() -> bool:
        while sub.poll(0):
            _t, _s, payload = sub.recv_multipart()
            for ev in msgpack.unpackb(payload)[1]:
                got.append((ev["type"], (ev.get("block_hashes") or [b""])[0].hex() or None))
        return bool(got) and got[-1][1] == hashes[-1]

    async def main() -> None:
        hub = EventHub()
        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(publish_hub, offload=trio.to_thread.run_sync),
                hub,
                [Tier],
                EventsConfig(),
                pub,
                Audience("all", lambda n: None),
            )
            while not got:  # the subscription reached the publisher (ZMQ's slow joiner)
                hub.publish([events[0]])
                await trio.sleep(0.05)
                drain()
            got.clear()
            hub.publish(events[1:-1])  # one burst of 14,999 events
            with trio.fail_after(120):
                while not any(t == "AllBlocksCleared" for t, _ in got):
                    await trio.sleep(0.02)
                    drain()
                hub.publish(events[-1:])  # the publisher goes on
                while not drain():
                    await trio.sleep(0.02)
            assert pub.lost == 14_999 - 10_000 and hub.dropped == pub.lost
            nursery.cancel_scope.cancel()

    trio.run(main)
    sub.close()
    seen = [(t, h) for t, h in got if h != hashes[0]]  # a late copy of a join probe is not the subject
    stored = [h for t, h in seen if t == "BlockStored"]
    assert stored == hashes[1:10_001] + hashes[-1:]  # in order; the gap where the dropped ones were
    i = next(i for i, (t, _) in enumerate(seen) if t == "AllBlocksCleared")
    assert [h for t, h in seen[:i] if t == "BlockStored"] == hashes[1:10_001]  # the receiver told at the gap
