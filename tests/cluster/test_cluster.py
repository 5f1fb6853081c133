"""The peer tier on a real network: three nodes in network namespaces (tools/netcluster.py).

Each node runs its own daemon with its own DRAM and disk, a shared posix directory and a
moto S3 server on a fourth address. Readers on B and C read what A holds in DRAM through
the peer tier and check every byte; then A fails in each way a node fails (SIGKILL,
SIGSTOP, its link cut, its packets dropped) and every read must be correct or a miss
within a generous deadline, and local hits must stay correct. The nodes' landing buffers
are 64 KiB: the 256 KiB blocks of the fault tests come in chunks, the 64 KiB blocks of
the mixed run in one round. No timing is asserted (``kvfs bench cluster`` measures);
docs/cluster.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kvfs.peers import PEER_DETAIL
from kvfs.tools.netcluster import NetCluster, block_name, checked_get, missing_tools

why = missing_tools()
pytestmark = pytest.mark.skipif(why is not None, reason=f"namespace cluster: {why}")

DEADLINE = 60.0  # seconds a read may take under any fault: a hang fails the test


@pytest.fixture(scope="module")
def cluster():
    from kvfs.client import Client

    nc = NetCluster(3, timeout="1s", landing="64KiB")
    try:
        nc.clients = {n.name: Client(str(n.socket), write=True, timeout=DEADLINE) for n in nc.nodes}
        yield nc
    finally:
        for c in getattr(nc, "clients", {}).values():
            c.close()
        nc.close()


def _df(node):
    """``kvfs df --json`` of *node* (over its control socket)."""
    import json

    return json.loads(_cli(node, "df", "--json"))


def _cli(node, *args):
    res = subprocess.run(
        [sys.executable, "-m", "kvfs.tools.cli", *args, "--socket", str(node.socket), str(node.mountpoint)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def _reconnect(nc, node):
    from kvfs.client import Client

    nc.clients[node.name].close()
    nc.clients[node.name] = Client(str(node.socket), write=True, timeout=DEADLINE)


def _put(client, count, size=256 << 10, tag="m"):
    names = [block_name(i, tag) for i in range(count)]
    data = [os.urandom(size) for _ in names]
    client.put(names, data)
    return dict(zip(names, data, strict=True))


def _until_ok(client, name, data):
    """Read until the block is there (its writer's event takes a moment to arrive)."""
    deadline = time.monotonic() + DEADLINE
    while (got := checked_get(client, name, data)) != "ok" and time.monotonic() < deadline:
        time.sleep(0.01)
    return got


def _read_within(client, name, data):
    t0 = time.monotonic()
    got = checked_get(client, name, data)
    assert time.monotonic() - t0 < DEADLINE, f"{name}: a read took {time.monotonic() - t0:.1f}s"
    return got


def test_peers_read_a_blocks_from_its_dram_byte_exact(cluster):
    a, b, c = cluster.nodes
    blocks = _put(cluster.clients["a"], 8)
    for name in blocks:
        assert cluster.clients["a"].stat(name).tiers[0] == "dram"
    for reader in ("b", "c"):
        client = cluster.clients[reader]
        with client.events() as events:
            for name, data in blocks.items():
                assert _until_ok(client, name, data) == "ok"
            # each came from A's DRAM, not from a shared tier (A writes them through too)
            sources = {}
            for ev in events:
                if ev.name in blocks and ev.kind.value == "stored":
                    sources[ev.name] = ev.detail
                if len(sources) == len(blocks):
                    break
        assert sources == {name: f"{PEER_DETAIL}a" for name in blocks}
    # each reader counts its remote hits, and A what it served; kvfs top and df show them
    for reader in (b, c):
        [peer] = [p for p in _df(reader)["peers"] if p["name"] == "a"]
        assert peer["hits"] >= len(blocks) and peer["bytes_read"] >= sum(map(len, blocks.values()))
    served = {p["name"]: p["served"] for p in _df(a)["peers"]}
    assert served["b"] >= len(blocks) and served["c"] >= len(blocks)
    df = _cli(b, "df")
    assert any(line.split()[:2] == ["a", "ok"] for line in df.splitlines()), df
    top = _cli(b, "top", "--once", "--interval", "0.1")
    assert any(line.split()[:2] == ["PEER", "HEALTH"] for line in top.splitlines()), top


def test_a_block_written_on_a_is_readable_on_b_soon(cluster):
    """As soon as A's event arrives (kvfs bench cluster times it)."""
    name, data = next(iter(_put(cluster.clients["a"], 1).items()))
    assert _until_ok(cluster.clients["b"], name, data) == "ok"


@pytest.mark.parametrize("fault", ["kill", "stop", "cut", "drop"])
def test_a_failed_peer_costs_a_deadline_and_never_wrong_bytes(cluster, fault):
    a, b, c = cluster.nodes
    mine = {r: _put(cluster.clients[r], 4, tag=f"own{r}") for r in ("b", "c")}
    theirs = _put(cluster.clients["a"], 12, tag=f"fault{fault}")
    # a few read before the fault (B and C then hold them), the rest only after
    early = list(theirs)[:4]
    for name in early:
        assert _until_ok(cluster.clients["b"], name, theirs[name]) == "ok"
    {"kill": cluster.kill, "stop": cluster.stop, "cut": cluster.cut, "drop": cluster.drop}[fault](a)
    try:
        outcomes = []
        for reader in ("b", "c"):
            client = cluster.clients[reader]
            for name, data in theirs.items():
                outcomes.append(_read_within(client, name, data))
            for name, data in mine[reader].items():  # local hits stay hits
                assert _read_within(client, name, data) == "ok"
        for name in early:  # B holds these itself now
            assert checked_get(cluster.clients["b"], name, theirs[name]) == "ok"
        assert set(outcomes) <= {"ok", "miss"}
    finally:
        {"kill": cluster.start, "stop": cluster.cont, "cut": cluster.mend, "drop": cluster.undrop}[fault](a)
        if fault == "kill":
            _reconnect(cluster, a)
    # A is back: its new blocks reach B through the peer tier again (after the breaker's pause)
    fresh = _put(cluster.clients["a"], 2, tag="after")
    for name, data in fresh.items():
        assert _until_ok(cluster.clients["b"], name, data) == "ok"


def test_a_mixed_run_with_faults_reads_no_wrong_byte(cluster):
    """The short version of ``kvfs bench cluster --soak``: all three nodes write and read
    each other's blocks (every byte checked) while each kind of fault comes and goes in
    turn. Paced by reads, not by the clock: each phase lasts a number of reads."""
    from kvfs.tools.bench_cluster import mixed_run, reading

    for c in cluster.clients.values():
        c.close()
    try:
        report = mixed_run(cluster, faults=4, between=reading(150), hold=reading(100), say=lambda *a: None)
    finally:
        for node in cluster.nodes:
            if node.pid is None:
                cluster.start(node)
            _reconnect(cluster, node)
    assert report.wrong == 0, report.errors
    assert report.faults == ["kill:a", "stop:b", "cut:c", "drop:a"]
    assert report.ok > 0 and report.writes > 0
