"""``kvfs quota``, ``kvfs df``/``du`` against quotas and ``kvfs pin --for``, against a real
store with namespaces behind a real control socket (as tests/tools/test_tools.py does)."""

from __future__ import annotations

import pytest

from kvfs.config import Config, DiskConfig, DramConfig, NamespaceConfig, PolicyConfig
from kvfs.mount.assembly import open_store
from kvfs.tools.cli import main
from kvfs.tools.control_client import ENV_SOCKET

from support.cli import kvfs, kvfs_json
from support.control_harness import ControlServer

BLOCK = 4096  # 4 KiB in DRAM and on disk (block format 3: its header is an attribute)


@pytest.fixture
def store(tmp_path):
    config = Config(
        tiers=(
            DramConfig(name="dram", capacity=64 << 10, mlock=False, prefault=False),
            DiskConfig(name="disk", capacity=16 << 20, path=tmp_path / "disk"),
        ),
        policy=PolicyConfig(eviction="lru"),
        namespaces=(
            NamespaceConfig(path="tenant-a", quota={"dram": 3 * BLOCK}, owner=1234, group=1234, mode=0o750),
            NamespaceConfig(path="tenant-b", retention=3600.0),
        ),
    )
    s = open_store(config)
    yield s
    s.close()


@pytest.fixture
def server(store, monkeypatch):
    with ControlServer(store) as srv:
        monkeypatch.setenv(ENV_SOCKET, str(srv.socket))
        yield srv


def test_quota_show_and_set(server, capsys):
    s = server.store
    for i in range(5):
        s.put(f"tenant-a/00/{i}", bytes([i]) * BLOCK)
    shown = kvfs_json(capsys, "quota", "show")
    a, b = shown["namespaces"]
    assert a["path"] == "tenant-a" and a["tiers"]["dram"] == {
        "used": 3 * BLOCK,
        "quota": 3 * BLOCK,
        "blocks": 3,
        "evictions": 2,
    }
    assert a["tiers"]["disk"]["quota"] is None and a["tiers"]["disk"]["blocks"] == 2
    assert (a["owner"], a["group"], a["mode"], a["configured"]) == (1234, 1234, "0750", True)
    assert b["retention"] == 3600.0 and b["owner"] is None

    rc, out, _ = kvfs(capsys, "quota", "show")
    lines = out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "TIER", "USED", "QUOTA", "USE%", "COPIES", "EVICTED", "RULES"]
    assert lines[1].split()[:10] == ["/tenant-a", "dram", "12", "KiB", "12", "KiB", "100%", "3", "2", "owner"]

    res = kvfs_json(capsys, "quota", "set", "tenant-a", "--tier", "dram=8KiB")
    assert res["namespaces"][0]["tiers"]["dram"]["used"] == 2 * BLOCK  # lowered: evicted down to it now
    res = kvfs_json(capsys, "quota", "set", "scratch", "--tier", "disk=1MiB", "--retention", "1h")
    ns = res["namespaces"][0]
    assert ns["path"] == "scratch" and ns["configured"] is False and ns["retention"] == 3600.0
    assert s.is_dir("scratch")
    res = kvfs_json(capsys, "quota", "set", "scratch", "--tier", "disk=none", "--retention", "none")
    assert res["namespaces"][0]["tiers"]["disk"]["quota"] is None and res["namespaces"][0]["retention"] is None
    one = kvfs_json(capsys, "quota", "show", "tenant-b")
    assert [n["path"] for n in one["namespaces"]] == ["tenant-b"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["quota", "set", "tenant-a"], "give at least one --tier TIER=SIZE"),
        (["quota", "set", "tenant-a", "--tier", "ssd=1GiB"], "no tier named 'ssd'; tiers: dram, disk"),
        (["quota", "set", "tenant-a", "--tier", "dram"], "write TIER=SIZE, like dram=1GiB"),
        (["quota", "set", "tenant-a", "--tier", "dram=lots"], "config error in --tier: dram:"),
        (
            ["quota", "set", "tenant-a/00", "--tier", "dram=1MiB"],
            "'tenant-a/00' lies inside namespace 'tenant-a'; namespaces do not nest",
        ),
        (["quota", "set", "/", "--tier", "dram=1MiB"], "the mount's root cannot be a namespace"),
        (["quota", "show", "nothing-here"], "nothing-here: not a namespace; kvfs quota set makes one"),
    ],
)
def test_quota_errors(server, capsys, argv, message):
    rc, out, err = kvfs(capsys, *argv)
    assert rc == 1 and message in err and out == ""


def test_df_and_du_show_use_against_quota(server, capsys):
    s = server.store
    for i in range(4):
        s.put(f"tenant-a/00/{i}", bytes([i]) * BLOCK)
    df = kvfs_json(capsys, "df")
    assert [n["path"] for n in df["namespaces"]] == ["tenant-a", "tenant-b"]
    rc, out, _ = kvfs(capsys, "df")
    assert "NAMESPACE" in out and "/tenant-a" in out
    du = kvfs_json(capsys, "du", "tenant-a")
    assert du["quota"] == {"dram": 3 * BLOCK, "disk": None}
    assert kvfs_json(capsys, "du", "tenant-a/00")["quota"] is None  # only a namespace's own directory
    rc, out, _ = kvfs(capsys, "du", "tenant-a")
    assert out.splitlines()[-1] == "/tenant-a: namespace; quota use: dram 12 KiB of 12 KiB, disk 4 KiB"


def test_pin_for_a_while(server, capsys):
    s = server.store
    s.put("tenant-b/x", b"x" * BLOCK)
    rc, out, _ = kvfs(capsys, "pin", "--for", "10m", "tenant-b/x")
    assert rc == 0 and out == "pinned 1 block under /tenant-b/x (1 changed)\n"
    st = kvfs_json(capsys, "stat", "tenant-b/x")
    assert st["pinned"] and st["pin_expires"] == pytest.approx(s.clock() + 600, abs=5)
    rc, out, _ = kvfs(capsys, "stat", "tenant-b/x")
    assert "pinned:   yes (until " in out
    with pytest.raises(SystemExit) as exc:  # refused as the command line is read (status 2)
        kvfs(capsys, "pin", "--for", "0s", "tenant-b/x")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == "kvfs: pin: argument --for: must be more than 0 seconds (got '0s'); see kvfs pin --help\n"


@pytest.mark.parametrize("argv", [["quota"], ["quota", "set"], ["quota", "show"], ["gc"]])
def test_help(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kvfs {' '.join(argv)}") and "--socket" not in out
