"""An operator's first hour (issue 24): the tools say what they did and refuse bad input
the same way, pinned blocks stay, a version is everywhere, and the embedded default mounts
light and says its sizes.

The commands run in-process against a real store behind a real control socket
(tests/support/control_harness.py), ``kvfs top`` also as a process; the embedded default and
``kvfs umount`` on a real FUSE mount.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from kvfs.client import Client
from kvfs.protocol import Ping
from kvfs.tools.cli import main
from kvfs.tools.control_client import ENV_SOCKET, ControlClient
from kvfs.units import _DUR_UNITS_SHOWN, format_size

from support.cli import KVFS, run_kvfs
from support.control_harness import ControlServer, make_store
from support.deadlines import wait_for
from support.mounts import fuse_missing

BLOCK = 1000
VERSION = metadata.version("kvfs")


@pytest.fixture
def server(tmp_path, monkeypatch):
    store = make_store(tmp_path, dram=64 << 10)
    try:
        with ControlServer(store) as srv:
            monkeypatch.setenv(ENV_SOCKET, str(srv.socket))
            yield srv
    finally:
        store.close()


def kvfs(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# -- a version everywhere: the package metadata ----------------------------------------------


def test_the_version_is_the_package_metadata_in_the_command_the_pong_and_the_welcome(server):
    res = run_kvfs("--version")
    assert (res.returncode, res.stdout) == (0, f"kvfs {VERSION}\n")
    with ControlClient(server.socket) as c:
        assert c.request(Ping()).version == VERSION
    with Client(server.socket) as client:
        assert client.welcome.version == VERSION


# -- the pin rule -------------------------------------------------------------------------


def test_evict_refuses_a_pinned_block_unless_forced_and_says_so(server, capsys):
    st = server.store
    st.put("d/pinned", b"p" * BLOCK)
    st.put("d/loose", b"l" * BLOCK)
    assert kvfs(capsys, "pin", "d/pinned")[0] == 0

    rc, out, err = kvfs(capsys, "evict", "--tier", "dram", "d")
    assert rc == 1
    assert out == "evicted 1 of 2 blocks under /d (0 removed entirely, 1 kept: 1 pinned)\n"
    assert (
        err == "kvfs: /d/pinned: is pinned; unpin it first (kvfs unpin), or use kvfs evict --force to evict it anyway\n"
    )
    assert st.stat("d/pinned").tiers == ("dram",) and st.stat("d/pinned").pinned
    assert st.stat("d/loose").tiers == ("disk",)

    rc, out, _ = kvfs(capsys, "evict", "--json", "d/pinned")
    res = json.loads(out)
    assert rc == 1 and (res["evicted"], res["kept"]) == (0, {"Pinned": 1})
    assert [(f["name"], f["type"]) for f in res["failed"]] == [("d/pinned", "Pinned")]

    with Client(server.socket) as client:  # the batch client's evict: the same rule
        refused = client.evict(["d/pinned"])
        assert [f.type for f in refused.failed] == ["Pinned"] and refused.evicted == 0
        forced = client.evict(["d/pinned"], tier="dram", force=True)
        assert forced.evicted == 1 and not forced.failed
    assert st.stat("d/pinned").tiers == ("disk",) and st.stat("d/pinned").pinned  # still pinned, lower

    rc, out, _ = kvfs(capsys, "evict", "--force", "d/pinned")  # the last copy too: gone
    assert rc == 0 and out == "evicted 1 of 1 blocks under /d/pinned (1 removed entirely, 0 kept)\n"


# -- flags: checked when read, one error form ---------------------------------------------


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["top", "--interval", "0"], "--interval"),
        (["top", "--interval", "-1"], "--interval"),
        (["top", "--interval", "0.01"], "--interval"),
        (["top", "--count", "0"], "--count"),
        (["pin", "--for", "0", "x"], "--for"),
        (["pin", "--for", "-5m", "x"], "--for"),
        (["pin", "--for", "1x", "x"], "--for"),
        (["pin", "--for", "inf", "x"], "--for"),
        (["events", "--count", "0"], "--count"),
        (["events", "--count", "-1"], "--count"),
        (["events", "--block-size", "-16"], "--block-size"),
        (["umount", "--timeout", "0", "/x"], "--timeout"),
        (["mount", "--metrics-port", "70000", "/x"], "--metrics-port"),
        (["gc", "--config", "x.toml", "--min-age", "soon"], "--min-age"),
        (["bench", "tiers", "--blocks", "0"], "--blocks"),
        (["bench", "faults", "--block-size", "lots"], "--block-size"),
        (["bench", "soak", "--seconds", "-1"], "--seconds"),
        (["bench", "policy", "--admit-threshold", "1.5"], "--admit-threshold"),
        (["bench", "mount", "--idle", "0"], "--idle"),
    ],
)
def test_a_bad_flag_is_refused_when_read_in_one_line_naming_it(capsys, argv, flag):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    sub = " ".join(a for a in argv[:2] if not a.startswith("-"))
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"kvfs: {sub}: argument {flag}: ") and err.endswith(f"; see kvfs {sub} --help\n"), err


def test_the_duration_error_lists_every_unit_the_parser_takes_and_each_is_taken(server, capsys):
    with pytest.raises(SystemExit):
        main(["pin", "--for", "1y", "x"])
    err = capsys.readouterr().err
    assert all(f" {unit}," in err or f" {unit} (" in err for unit in _DUR_UNITS_SHOWN), err
    server.store.put("x", b"x" * BLOCK)
    for unit in _DUR_UNITS_SHOWN:
        assert kvfs(capsys, "pin", "--for", f"2{unit}", "x")[0] == 0, unit
    st = server.store.stat("x")
    assert st.pinned and st.pin_expires == pytest.approx(server.store.clock() + 2 * 86400, abs=60)  # 2d, the last


def test_a_daemon_error_is_one_line_starting_kvfs(server, capsys):
    rc, out, err = kvfs(capsys, "stat", "no/such")
    assert rc == 1 and out == "" and err == "kvfs: /no/such: no such block or directory\n"


# -- kvfs top --json: a stream of JSON lines ------------------------------------------------


def test_top_json_streams_one_object_per_line_until_stopped(server):
    server.store.put("t/b", b"t" * BLOCK)
    env = {**os.environ, ENV_SOCKET: str(server.socket)}
    proc = subprocess.Popen(
        [*KVFS, "top", "--json", "--interval", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        frames = [json.loads(proc.stdout.readline()) for _ in range(3)]  # each line a whole frame
        assert proc.poll() is None  # no --once, no --count: it keeps streaming
    finally:
        proc.kill()
        proc.wait()
    assert all(f["blocks"] == 1 and [t["name"] for t in f["tiers"]] == ["dram", "disk"] for f in frames)
    assert frames[0]["time"] < frames[1]["time"] < frames[2]["time"]
    res = subprocess.run(
        [*KVFS, "top", "--json", "--interval", "0.1", "--count", "2"], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0 and [json.loads(line)["blocks"] for line in res.stdout.splitlines()] == [1, 1]
    res = subprocess.run([*KVFS, "top", "--json", "--once"], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 1 and json.loads(res.stdout)["blocks"] == 1


# -- kvfs ls -l FILE -------------------------------------------------------------------------


def test_ls_of_a_block_names_it_as_the_listing_of_its_directory_does(server, capsys):
    server.store.put("ns/aa/blk", b"b" * BLOCK)
    _, listing, _ = kvfs(capsys, "ls", "-l", "ns/aa")
    _, one, _ = kvfs(capsys, "ls", "-l", "ns/aa/blk")
    assert one == listing and one.splitlines()[1].endswith("  blk")
    assert kvfs(capsys, "ls", "ns/aa/blk")[1] == kvfs(capsys, "ls", "ns/aa")[1] == "blk\n"


# -- the embedded default on a real mount, and kvfs umount ------------------------------------


def _arena_of(pid: int) -> Path:
    [arena] = [p for p in Path("/dev/shm").glob(f"kvfs-{pid}-*")]
    return arena


def _switches(pid: int) -> int:
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                n += next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:"))
        except (OSError, StopIteration):
            continue
    return n


def _status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(f"{key}:"))


@pytest.mark.fuse
@pytest.mark.skipif(fuse_missing() is not None, reason=str(fuse_missing()))
def test_the_embedded_default_mounts_holding_only_what_it_uses_and_umount_waits_for_the_exit(tmp_path):
    from kvfs.mount.daemon import mount_type
    from kvfs.mount.paths import log_path, pid_path
    from kvfs.tiers.dram import STEP

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # the default's disk tier: this test's
    mp = tmp_path / "mnt"
    mp.mkdir()
    res = run_kvfs("mount", str(mp), env=env)
    assert res.returncode == 0, res.stderr
    try:
        pid = int(pid_path(mp).read_text())
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        dram = min(max(memory // 16, 256 << 20), 8 << 30) & ~0xFFFFF

        df = json.loads(run_kvfs("df", str(mp), "--json").stdout)
        assert df["config"].startswith(f"the embedded default: dram {format_size(dram)} (1/16 of memory")
        assert f"in {tmp_path / 'cache' / 'kvfs' / 'disk'} (a quarter of" in df["config"]
        assert (df["tiers"][0]["name"], df["tiers"][0]["capacity"]) == ("dram", dram)
        text = run_kvfs("df", str(mp)).stdout
        assert text.splitlines()[1].startswith("config: the embedded default: dram ")

        arena = _arena_of(pid)
        assert os.stat(arena).st_size > dram  # the whole arena, as clients map it
        assert os.stat(arena).st_blocks * 512 <= STEP  # but only what it has used is memory
        assert _status_kib(pid, "VmLck") * 1024 <= STEP
        with Client(mp):  # a client mapping the arena does not make it resident either
            assert os.stat(arena).st_blocks * 512 <= STEP

        t0, s0 = time.monotonic(), _switches(pid)
        time.sleep(2.0)  # a measurement window: an idle daemon's wakeups, not a wait for anything
        rate = (_switches(pid) - s0) / (time.monotonic() - t0)
        assert rate < 20, f"the idle daemon woke {rate:.0f} times a second"  # it polled at 65/s

        assert f"kvfs {VERSION} mounted at {mp} (pid {pid}" in log_path(mp).read_text()

        (mp / "blk").write_bytes(b"k" * 4096)
        res = run_kvfs("umount", str(mp))
        assert res.returncode == 0, res.stderr
        # it returned after the daemon's exit, not before: the kernel says so at once
        fd = os.pidfd_open(pid) if os.path.exists(f"/proc/{pid}") else None
        if fd is not None:
            try:
                assert select.select([fd], [], [], 0)[0] == [fd]  # exited (maybe not yet reaped)
            finally:
                os.close(fd)
        assert not arena.exists() and mount_type(mp) is None
        said = rf"unmounted {re.escape(str(mp))}: the daemon \(pid {pid}\) wrote 1 DRAM-only block down in [0-9.]+s"
        assert re.fullmatch(said + " and exited\n", res.stdout), res.stdout
    finally:
        if mount_type(mp) is not None:
            subprocess.run([sys.executable, "-m", "kvfs.tools.cli", "umount", str(mp)], capture_output=True)
            wait_for(lambda: mount_type(mp) is None)
