"""The ``kvfs`` inspection commands against a real store behind a real control socket.

Every subcommand runs in-process through ``kvfs.tools.cli.main`` (``kvfs events`` also as
a subprocess), reaching the server through ``$KVFS_CONTROL_SOCKET`` or ``--socket``.
Tests on a real FUSE mount (paths found through /proc/self/mountinfo) come with the mount.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from kvfs.blockfile import read_header
from kvfs.mount.control import ControlHandler
from kvfs.protocol import Du, Events, Subscribed
from kvfs.tools.cli import COMMANDS, main
from kvfs.tools.control_client import ENV_SOCKET, ControlClient

from support import SUPPORT_DIR
from support.cli import kvfs, kvfs_json
from support.control_harness import ControlServer, make_store
from support.deadlines import DEADLINE

BLOCK = 1000  # payload bytes: 4 KiB in DRAM, 8 KiB on disk (header + payload pages)


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path, dram=64 << 10)  # 16 blocks of BLOCK fit in DRAM
    yield s
    s.close()


@pytest.fixture
def server(store, monkeypatch):
    with ControlServer(store) as srv:
        monkeypatch.setenv(ENV_SOCKET, str(srv.socket))
        yield srv


def payload(i: int) -> bytes:
    return bytes([i % 251]) * BLOCK


# -- help and paths outside a mount ---------------------------------------------------


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("ls", "du", "stat", "df", "pin", "unpin", "prefetch", "evict", "fsck", "top", "events"):
        assert name in COMMANDS
        assert f"    {name} " in out


@pytest.mark.parametrize(
    "name", ["ls", "du", "stat", "df", "pin", "unpin", "prefetch", "evict", "fsck", "top", "events"]
)
def test_subcommand_help(capsys, name):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kvfs {name}")
    assert "--socket" not in out  # hidden: for tests and for a daemon whose mount is gone
    assert len(out.split("\n\n")[1]) > 40  # a real description, not just the one-liner


@pytest.mark.parametrize(
    "argv",
    [
        ["ls"],
        ["ls", "-l"],
        ["du"],
        ["stat"],
        ["df"],
        ["pin"],
        ["unpin"],
        ["prefetch"],
        ["evict"],
        ["fsck"],
        ["top", "--once"],
        ["events", "--count", "1"],
    ],
)
def test_path_outside_any_mount(capsys, monkeypatch, tmp_path, argv):
    monkeypatch.delenv(ENV_SOCKET, raising=False)
    rc, out, err = kvfs(capsys, *argv, str(tmp_path))
    assert rc == 1
    assert out == ""
    assert err == f"kvfs: {tmp_path} is not inside a kvfs mount\n"


def test_outside_mount_as_a_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != ENV_SOCKET}
    p = subprocess.run(
        [sys.executable, "-m", "kvfs.tools.cli", "du", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert p.returncode == 1
    assert p.stderr == f"kvfs: {tmp_path} is not inside a kvfs mount\n"


def test_daemon_not_answering(capsys, tmp_path):
    rc, out, err = kvfs(capsys, "df", "--socket", str(tmp_path / "nothing.sock"))
    assert rc == 1
    assert "is not answering (no control socket" in err


def test_explicit_socket_option(server, capsys, monkeypatch):
    monkeypatch.delenv(ENV_SOCKET)
    server.store.put("a/b", payload(1))
    rc, out, err = kvfs(capsys, "ls", "--socket", str(server.socket), "/a")
    assert (rc, out) == (0, "b\n")


# -- ls, du, stat, df -------------------------------------------------------------------


def test_ls(server, capsys):
    st = server.store
    st.put("ns/aa/b1", payload(1))
    st.put("ns/aa/b2", payload(2))
    st.put("ns/bb/c1", payload(3))
    st.pin("ns/aa/b2")
    st.read("ns/aa/b1")

    rc, out, _ = kvfs(capsys, "ls")
    assert (rc, out) == (0, "ns/\n")
    rc, out, _ = kvfs(capsys, "ls", "/ns")
    assert out == "aa/\nbb/\n"

    res = kvfs_json(capsys, "ls", "ns/aa")
    assert res["type"] == "dir"
    assert res["path"] == "/ns/aa"
    b1, b2 = res["entries"]
    assert set(b1) >= {"name", "type", "size", "tiers", "pinned", "hits", "accessed", "created", "checksum"}
    assert (b1["name"], b1["type"], b1["size"], b1["tiers"], b1["pinned"], b1["hits"]) == (
        "b1",
        "block",
        BLOCK,
        ["dram"],
        False,
        1,
    )
    assert (b2["name"], b2["pinned"], b2["hits"]) == ("b2", True, 0)

    rc, out, _ = kvfs(capsys, "ls", "-l", "ns/aa", "ns")
    lines = out.splitlines()
    assert lines[0] == "/ns/aa:"
    assert lines[1].split() == ["SIZE", "TIERS", "PIN", "HITS", "ACCESSED", "NAME"]
    assert lines[2].split()[:4] == ["1000", "B", "dram", "-"] and lines[2].endswith(" b1")
    assert lines[3].split()[3] == "pinned"
    assert "/ns:" in lines and lines[-1].endswith(" bb/")

    one = kvfs_json(capsys, "ls", "ns/bb/c1")
    assert one["type"] == "block" and one["entries"][0]["name"] == "ns/bb/c1"


def test_ls_missing_path(server, capsys):
    for argv in (
        ["ls", "nope"],
        ["du", "nope"],
        ["stat", "nope"],
        ["pin", "nope"],
        ["prefetch", "nope"],
        ["evict", "nope"],
    ):
        rc, out, err = kvfs(capsys, *argv)
        assert (rc, out, err) == (1, "", "kvfs: /nope: no such block or directory\n"), argv


def test_du(server, capsys):
    st = server.store
    for i in range(3):
        st.put(f"m/x/{i}", payload(i))
    st.put("m/y/0", payload(9))
    st.put("other/0", payload(8))
    st.evict("m/x/0", "dram")  # to disk: 8 KiB there

    res = kvfs_json(capsys, "du", "m")
    assert res["path"] == "/m"
    assert res["tiers"] == {"dram": {"used": 3 * 4096, "blocks": 3}, "disk": {"used": 4096, "blocks": 1}}
    assert res["total"] == {"used": 3 * 4096 + 4096, "blocks": 4, "size": 4 * BLOCK}

    root = kvfs_json(capsys, "du", "/")
    assert root["total"]["blocks"] == 5
    assert root["tiers"]["dram"] == {"used": 4 * 4096, "blocks": 4}

    both = kvfs_json(capsys, "du", "m/x", "m/y")
    assert [r["total"]["blocks"] for r in both] == [3, 1]

    rc, out, _ = kvfs(capsys, "du", "m/x", "m/y")
    header, row_x, row_y = out.splitlines()
    assert header.split() == ["DRAM", "BLOCKS", "DISK", "BLOCKS", "TOTAL", "BLOCKS", "SIZE", "PATH"]
    assert row_x.split() == ["8", "KiB", "2", "4", "KiB", "1", "12", "KiB", "3", "2.93", "KiB", "/m/x"]


def test_stat(server, capsys):
    st = server.store
    st.put("s/blk", payload(5))
    st.read("s/blk")
    st.read("s/blk")
    res = kvfs_json(capsys, "stat", "s/blk")
    assert set(res) == {
        "path",
        "name",
        "size",
        "checksum",
        "tiers",
        "pinned",
        "hits",
        "created",
        "accessed",
        "parent",
        "pin_expires",
    }
    assert res["parent"] is None and res["pin_expires"] is None
    assert res["name"] == "s/blk" and res["size"] == BLOCK and res["tiers"] == ["dram"]
    assert res["checksum"].startswith("xxh3-64:") and res["pinned"] is False and res["hits"] == 2
    assert res["accessed"] >= res["created"] > 0

    rc, out, _ = kvfs(capsys, "stat", "/s/blk")
    assert rc == 0
    assert "size:     1000 B (1000 bytes)\n" in out and "tiers:    dram\n" in out and "pinned:   no\n" in out

    rc, _, err = kvfs(capsys, "stat", "s")
    assert (rc, err) == (1, "kvfs: /s: is a directory\n")


def test_df(server, capsys):
    server.store.put("d/1", payload(1))
    res = kvfs_json(capsys, "df", "/")
    assert res["mountpoint"] == "/mnt/kvfs" and res["blocks"] == 1
    dram, disk = res["tiers"]
    assert (
        dram["name"],
        dram["kind"],
        dram["capacity"],
        dram["used"],
        dram["free"],
        dram["blocks"],
        dram["healthy"],
    ) == ("dram", "dram", 64 << 10, 4096, (64 << 10) - 4096, 1, True)
    assert (disk["name"], disk["capacity"], disk["used"], disk["healthy"], disk["persistent"]) == (
        "disk",
        16 << 20,
        0,
        True,
        True,
    )

    rc, out, _ = kvfs(capsys, "df")
    lines = out.splitlines()
    assert lines[0] == "/mnt/kvfs: 1 block"
    assert lines[1].split() == ["TIER", "KIND", "CAPACITY", "USED", "FREE", "USE%", "BLOCKS", "HEALTH"]
    assert lines[2].split() == ["dram", "dram", "64", "KiB", "4", "KiB", "60", "KiB", "6%", "1", "ok"]


# -- pin, prefetch, evict ------------------------------------------------------------------


def test_pin_survives_eviction_pressure(server, capsys):
    st = server.store
    for i in range(4):
        st.put(f"hot/{i}", payload(i))
    for i in range(4):
        st.put(f"cold/{i}", payload(10 + i))
    rc, out, _ = kvfs(capsys, "pin", "hot")  # a directory pins everything under it
    assert (rc, out) == (0, "pinned 4 blocks under /hot (4 changed)\n")
    assert all(kvfs_json(capsys, "stat", f"hot/{i}")["pinned"] for i in range(4))

    for i in range(40):  # far more than DRAM holds: LRU evicts the unpinned blocks
        st.put(f"flood/{i}", payload(20 + i))

    for i in range(4):
        res = kvfs_json(capsys, "stat", f"hot/{i}")
        assert res["tiers"] == ["dram"], res
        assert kvfs_json(capsys, "stat", f"cold/{i}")["tiers"] == ["disk"]  # demoted, not lost
    du = kvfs_json(capsys, "du", "hot")
    assert du["tiers"]["dram"]["blocks"] == 4

    rc, out, _ = kvfs(capsys, "unpin", "hot/0", "hot/1")
    assert out == "unpinned 1 block under /hot/0 (1 changed)\nunpinned 1 block under /hot/1 (1 changed)\n"
    for i in range(40, 80):
        st.put(f"flood/{i}", payload(i))
    assert kvfs_json(capsys, "stat", "hot/0")["tiers"] == ["disk"]
    assert kvfs_json(capsys, "stat", "hot/2")["tiers"] == ["dram"]


def test_prefetch_moves_a_disk_block_into_dram(server, capsys):
    st = server.store
    st.put("p/blk", payload(7))
    rc, out, err = kvfs(capsys, "evict", "--tier", "dram", "p/blk")
    assert rc == 0, err
    assert out == "evicted 1 of 1 blocks under /p/blk (0 removed entirely, 0 kept)\n"
    assert kvfs_json(capsys, "stat", "p/blk")["tiers"] == ["disk"]

    rc, out, err = kvfs(capsys, "prefetch", "p/blk")
    assert rc == 0, err
    assert out == "prefetched 1 of 1 blocks under /p/blk into dram (0 already there, 0 failed)\n"
    assert kvfs_json(capsys, "stat", "p/blk")["tiers"] == ["dram", "disk"]
    assert st.read("p/blk") == payload(7)


def test_prefetch_many_with_progress(server, capsys):
    st = server.store
    for i in range(10):
        st.put(f"many/{i}", payload(i))
    st.flush()
    for i in range(10):
        st.evict(f"many/{i}", "dram")
    rc, out, err = kvfs(capsys, "prefetch", "--progress", "many")
    assert rc == 0, err
    assert "prefetched 10 of 10 blocks" in out
    assert "prefetch /many [" in err and "10/10 100%" in err  # the bar (one line per update off a tty)
    assert kvfs_json(capsys, "du", "many")["tiers"]["dram"]["blocks"] == 10

    rc, _, err = kvfs(capsys, "prefetch", "--tier", "nvme", "many")
    assert rc == 1 and err == "kvfs: no tier named 'nvme'; tiers: dram, disk\n"


def test_evict_never_drops_the_last_copy_unless_forced(server, capsys):
    st = server.store
    st.put("e/blk", payload(3))
    st.evict("e/blk", "dram")  # now only on disk, the coldest tier
    rc, out, err = kvfs(capsys, "evict", "e/blk")
    assert rc == 1
    assert "0 kept" not in out and "1 kept" in out
    assert "kvfs: /e/blk: the copy in 'disk' is the last one" in err and "kvfs evict --force" in err
    assert kvfs_json(capsys, "stat", "e/blk")["tiers"] == ["disk"]

    rc, out, _ = kvfs(capsys, "evict", "--force", "e/blk")
    assert (rc, out) == (0, "evicted 1 of 1 blocks under /e/blk (1 removed entirely, 0 kept)\n")
    rc, _, err = kvfs(capsys, "stat", "e/blk")
    assert rc == 1


# -- fsck ------------------------------------------------------------------------------------


def _corrupt_on_disk(tmp_path: Path, name: str) -> None:
    f = tmp_path / "disk" / "blocks" / name
    with open(f, "r+b") as fh:
        start = read_header(fh.fileno()).header_length  # 0 when the header is an attribute beside
        fh.seek(start + 10)
        byte = fh.read(1)[0]
        fh.seek(start + 10)
        fh.write(bytes([byte ^ 0xFF]))  # a payload byte, in place: the header still parses


def test_fsck_finds_and_repairs_a_block_corrupted_on_disk(server, capsys, tmp_path):
    st = server.store
    for i in range(3):
        st.put(f"f/{i}", payload(i))
    st.flush()  # every block on both tiers
    st.evict("f/2", "dram")  # f/2 only on disk
    _corrupt_on_disk(tmp_path, "f/1")
    _corrupt_on_disk(tmp_path, "f/2")

    rc, out, err = kvfs(capsys, "fsck", "/")
    assert rc == 4, err
    lines = out.splitlines()
    assert lines[:2] == ["bad: /f/1 in disk: payload checksum mismatch", "bad: /f/2 in disk: payload checksum mismatch"]
    assert lines[-1] == "checked 5 copies of 3 blocks: 2 bad (run kvfs fsck --repair to drop them)"
    assert kvfs_json(capsys, "stat", "f/1")["tiers"] == ["dram", "disk"]  # fsck alone changes nothing

    rc, out, err = kvfs(capsys, "fsck", "--repair", "--progress", "--json")
    assert rc == 1
    res = json.loads(out)
    assert [(b["name"], b["tier"]) for b in res["bad"]] == [("f/1", "disk"), ("f/2", "disk")]
    assert res["removed"] == ["f/2"] and res["repaired"] is True and res["copies"] == 5
    assert "fsck [" in err and "3/3 100%" in err

    assert kvfs_json(capsys, "stat", "f/1")["tiers"] == ["dram"]
    assert kvfs(capsys, "stat", "f/2")[0] == 1
    assert st.read("f/1") == payload(1)
    disk = st.statistics().tiers[1]
    assert disk.corrupt == 2

    rc, out, _ = kvfs(capsys, "fsck")
    assert (rc, out) == (0, "checked 3 copies of 2 blocks: 0 bad\n")


# -- events ----------------------------------------------------------------------------------


def _wait_for(cond, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


def _scripted_sequence(st) -> list[tuple[str, str, str | None]]:
    st.put("ev/a", payload(1))  # stored in dram
    st.evict("ev/a", "dram")  # demoted to disk, evicted from dram
    st.prefetch("ev/a")  # promoted to dram
    st.rename("ev/a", "ev/b")  # renamed
    st.delete("ev/b")  # removed
    return [
        ("stored", "ev/a", "dram"),
        ("demoted", "ev/a", "disk"),
        ("evicted", "ev/a", "dram"),
        ("promoted", "ev/a", "dram"),
        ("renamed", "ev/b", None),
        ("removed", "ev/b", None),
    ]


def test_events_show_a_scripted_sequence_in_order(server, tmp_path):
    env = dict(os.environ, **{ENV_SOCKET: str(server.socket)})
    cmd = [sys.executable, "-m", "kvfs.tools.cli", "events", "--count", "6"]
    as_json = subprocess.Popen(cmd + ["--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    as_text = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_for(lambda: server.handler.hub.subscribers == 2)
        expected = _scripted_sequence(server.store)
        out, err = as_json.communicate(timeout=DEADLINE)
        text, _ = as_text.communicate(timeout=DEADLINE)
    finally:
        as_json.kill()
        as_text.kill()
    assert as_json.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["kind"], e["name"], e["tier"]) for e in events] == expected
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert events[0]["size"] == BLOCK and events[4]["detail"] == "ev/a"
    assert set(events[0]) == {"seq", "time", "kind", "name", "tier", "size", "detail", "parent"}

    lines = text.splitlines()
    assert [line.split()[1:4] for line in lines[:4]] == [
        ["stored", "dram", "/ev/a"],
        ["demoted", "disk", "/ev/a"],
        ["evicted", "dram", "/ev/a"],
        ["promoted", "dram", "/ev/a"],
    ]
    assert lines[4].split()[1:3] == ["renamed", "-"] and lines[4].endswith("(ev/a)")


def test_events_reach_every_subscriber_and_a_slow_one_is_cut_off(tmp_path):
    """Two subscribers: one reads everything in order; one never reads, so once its socket
    buffer is full its backlog passes the hub's buffer and it is cut off, without holding
    back the first."""
    # The hub's buffer must hold one drain's burst (20 ms of events); the never-read
    # socket's buffers hold ~2500 events (~170 bytes each) before the hub's backlog grows.
    n, buffer = 12_000, 3000
    st = make_store(tmp_path, dram=64 << 20)
    try:
        with ControlServer(st) as srv:
            hub = srv.handler.hub
            hub.buffer = buffer
            with ControlClient(srv.socket) as fast, ControlClient(srv.socket) as slow:
                fast_items = iter(fast.stream(Events()))
                slow_items = iter(slow.stream(Events()))
                assert isinstance(next(fast_items), Subscribed) and isinstance(next(slow_items), Subscribed)
                got: list[str] = []

                def read_fast():
                    for item in fast_items:
                        got.append(item.event.name)
                        if len(got) == n:
                            return

                reader = threading.Thread(target=read_fast)
                reader.start()
                for i in range(n):
                    st.put(f"fan/{i}", b"x")
                    if i % 500 == 499:  # pace the writer to what a Python reader keeps up with
                        _wait_for(lambda i=i: len(got) > i - 500)
                reader.join(30)
                assert got == [f"fan/{i}" for i in range(n)]
                _wait_for(lambda: hub.subscribers == 1)  # the slow one was dropped
                names = []
                with pytest.raises(Exception, match=f"fell more than {buffer} events behind"):
                    for item in slow_items:
                        names.append(item.event.name)
                assert names == [f"fan/{i}" for i in range(len(names))] and len(names) < n
    finally:
        st.close()


# -- top ---------------------------------------------------------------------------------------


def test_top_once(server, capsys):
    st = server.store
    for i in range(8):
        st.put(f"t/{i}", payload(i))
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            for i in range(8):
                st.read(f"t/{i}")
            time.sleep(0.005)

    th = threading.Thread(target=traffic)
    th.start()
    try:
        res = kvfs_json(capsys, "top", "--once", "--interval", "0.3")
        rc, out, _ = kvfs(capsys, "top", "--once", "--interval", "0.1")
    finally:
        stop.set()
        th.join()
    assert res["blocks"] == 8 and res["mountpoint"] == "/mnt/kvfs"
    assert res["lookups_per_s"] > 0 and res["hit_ratio"] == 1.0
    dram = res["tiers"][0]
    assert dram["name"] == "dram" and dram["hit_ratio"] == 1.0 and dram["read_bytes_per_s"] > 0
    assert set(dram) >= {
        "used",
        "capacity",
        "blocks",
        "healthy",
        "hits_per_s",
        "written_bytes_per_s",
        "promotions_per_s",
        "demotions_per_s",
        "evictions_per_s",
        "corrupt",
        "errors",
    }
    assert out.startswith("kvfs top  /mnt/kvfs")
    assert out.splitlines()[2].split()[:6] == ["TIER", "USED", "CAPACITY", "USE%", "BLOCKS", "HIT%"]


def test_top_shows_fuse_op_rates(store, capsys, monkeypatch):
    from kvfs.mount.opstats import OpStats

    ops = OpStats()
    with ControlServer(store, opstats=ops) as srv:
        monkeypatch.setenv(ENV_SOCKET, str(srv.socket))
        stop = threading.Event()

        def fuse_traffic():
            while not stop.is_set():
                ops.observe("read", 1e-4)
                time.sleep(0.001)

        th = threading.Thread(target=fuse_traffic)
        th.start()
        try:
            res = kvfs_json(capsys, "top", "--once", "--interval", "0.2")
        finally:
            stop.set()
            th.join()
    assert res["ops_per_s"]["read"] > 0
    # the mean time of one, from the recorded seconds: every observation above took 100 µs
    assert res["ops_mean_us"]["read"] == pytest.approx(100.0)
    from kvfs.tools.cmd_top import frame, render

    idle = {"lookups": 0, "misses": 0, "tiers": [], "blocks": 0, "pending_writes": 0}
    before = {"time": 0.0, "mountpoint": "/m", "statistics": idle, "events_dropped": 0, "ops": []}
    after = {**before, "time": 1.0, "ops": [{"op": "open", "count": 4, "errors": 0, "seconds": 2e-4}]}
    assert "open 4 (50)" in render(frame(before, after))


# -- the handler directly: protocol errors do not take the server down ---------------------------


def test_bad_requests_get_errors_and_the_server_keeps_serving(server):
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(server.socket))
        f = s.makefile("rb")
        for line, kind, message in [
            (b"not json", "ProtocolError", "a frame is not JSON; each message is one JSON object per line"),
            (b"[1, 2]", "ProtocolError", "a frame is a JSON object, not list"),
            (b'{"v": 3, "kind": "nope"}', "UnknownKind", "unknown message kind 'nope'"),
            (b'{"v": 3, "kind": "stat", "bogus": 1}', "ProtocolError", "stat: unknown field 'bogus'; fields are name"),
            (b'{"v": 3, "kind": "stat", "name": 3}', "ProtocolError", "stat.name: expected a string, got int"),
            (b'{"v": 3, "kind": "pong", "mountpoint": "x", "pid": 1}', "ProtocolError", "'pong' is not a request"),
            (
                b'{"v": 7, "kind": "ping"}',
                "VersionMismatch",
                (
                    "protocol version 7 is not spoken here (this side speaks version 3); use the same kvfs release on "
                    "both sides (remount after upgrading)"
                ),
            ),
        ]:
            s.sendall(line + b"\n")
            reply = json.loads(f.readline())
            assert reply == {"v": 3, "kind": "error", "type": kind, "message": message}
        s.sendall(b'{"v": 3, "kind": "ping"}\n')
        assert json.loads(f.readline())["mountpoint"] == "/mnt/kvfs"
        f.close()


def test_du_on_a_large_namespace_reads_totals_not_blocks(tmp_path, monkeypatch):
    """du of a directory answers from the catalog's running totals: it visits none of the
    blocks below (so it costs the same at 100k blocks as at 1; docs/tools.md has the
    figures). Checked by making every way to walk blocks fail, not by timing it."""
    import trio

    from kvfs.catalog import Catalog

    st = make_store(tmp_path, dram=1 << 30)
    try:
        for i in range(2_000):
            st.put(f"big/{i % 64:02x}/{i:032x}", b"x")
        handler = ControlHandler(st, "/mnt/kvfs")

        def walked(*_a, **_k):
            raise AssertionError("du walked the blocks")

        for method in ("under", "names", "listdir"):
            monkeypatch.setattr(Catalog, method, walked)
        res = trio.run(handler.op_du, None, Du(name="big"))
        assert (res.total.blocks, res.total.size) == (2_000, 2_000)
        assert res.tiers["dram"].blocks == 2_000
    finally:
        monkeypatch.undo()
        st.close()


# -- found through a real FUSE mount of type fuse.kvfs -----------------------------------------


@pytest.fixture
def stub_mount(tmp_path, monkeypatch):
    """An empty FUSE mount of type ``fuse.kvfs`` with a control server on the socket derived
    from its mountpoint: the tools find the daemon exactly as they will on a kvfs mount."""
    pytest.importorskip("pyfuse3")
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        pytest.skip("needs /dev/fuse and fusermount3")
    from kvfs.mount.paths import control_socket_path, find_mount

    monkeypatch.delenv(ENV_SOCKET, raising=False)
    runtime = tempfile.mkdtemp(prefix="kvfs-rt-")  # short: Unix socket paths are limited
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = subprocess.Popen([sys.executable, str(SUPPORT_DIR / "stub_mount.py"), str(mp)])
    try:
        _wait_for(lambda: find_mount(mp) is not None or proc.poll() is not None)
        if proc.poll() is not None:
            pytest.skip(f"could not mount FUSE here (exit {proc.returncode})")
        store = make_store(tmp_path)
        try:
            with ControlServer(store, str(mp), socket=control_socket_path(mp)) as srv:
                yield mp, srv
        finally:
            store.close()
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mp)], check=False)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(runtime, ignore_errors=True)


def test_tools_find_the_daemon_from_a_path_inside_a_kvfs_mount(stub_mount, capsys):
    mp, srv = stub_mount
    srv.store.put("ns/aa/b1", payload(1))
    rc, out, err = kvfs(capsys, "ls", str(mp / "ns" / "aa"))
    assert (rc, out, err) == (0, "b1\n", "")
    res = kvfs_json(capsys, "stat", str(mp / "ns/aa/b1"))
    assert res["path"] == str(mp / "ns/aa/b1") and res["tiers"] == ["dram"]
    res = kvfs_json(capsys, "df", str(mp))
    assert res["mountpoint"] == str(mp)
    assert kvfs_json(capsys, "du", str(mp))["path"] == str(mp)
    rc, out, _ = kvfs(capsys, "ls", str(mp))
    assert out == "ns/\n"
    rc, _, err = kvfs(capsys, "ls", str(mp / "missing"))
    assert (rc, err) == (1, f"kvfs: {mp}/missing: no such block or directory\n")


def test_a_mount_whose_daemon_is_gone(stub_mount, capsys):
    mp, srv = stub_mount
    from kvfs.mount.paths import control_socket_path

    srv.stop()  # the daemon's control server stops; the mount stays
    rc, _, err = kvfs(capsys, "df", str(mp))
    assert rc == 1
    assert err == (
        f"kvfs: the kvfs daemon of {mp} is not answering (no control socket; socket {control_socket_path(mp)}); "
        "is it mounted with `kvfs mount`?\n"
    )


def test_an_idle_events_subscriber_that_hangs_up_is_dropped_at_once(server):
    client = ControlClient(server.socket)
    items = iter(client.stream(Events()))
    assert isinstance(next(items), Subscribed)
    assert server.handler.hub.subscribers == 1
    client.close()
    _wait_for(lambda: server.handler.hub.subscribers == 0)
