"""The peer tier's wire on real NIXL: two nodes in this process, UCX over TCP on loopback.

Two real stores stand for two nodes, each with what ``[cluster]`` adds to a daemon
(``kvfs.mount.cluster.Cluster``: its NIXL agent with the UCX backend, its peer channel on
127.0.0.1, its links to the other). What tests/test_cluster.py shows between daemons in
network namespaces, this shows path by path: a block that fits a landing buffer comes
in one round trip, a larger one is offered and read, both byte-exact and counted, and
the counters reach Prometheus and ``kvfs top``/``kvfs df``'s renderings. With
``ucx_tls = "tcp"`` UCX's InfiniBand module is not loaded, so this process exits as any
does (kvfs.nixl); the exit itself is tested in subprocesses at the end.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_ingest import BLOCK, blob, make

from kvfs.config import ClusterConfig, PeerConfig
from kvfs.peers import PEER_DETAIL, Medium, block_hash_of

nixl = pytest.importorskip("nixl_cu12", reason="NIXL is not installed (pip install 'kvfs[cluster]')")
prometheus_client = pytest.importorskip("prometheus_client")

from kvfs.mount.cluster import Cluster
from kvfs.mount.nixl_agent import QUARANTINE, Landing

DEADLINE = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def name_of(i: int) -> str:
    h = f"{i:02x}" + "ef" * 15
    return f"m/{h[:2]}/{h}"


def _config(node: str, port: int, peer: str, peer_port: int, landing: int) -> ClusterConfig:
    return ClusterConfig(
        node=node,
        listen=f"127.0.0.1:{port}",
        peers=(PeerConfig(name=peer, address=f"127.0.0.1:{peer_port}"),),
        timeout=5.0,
        ucx_tls="tcp",
        landing=landing,
    )


@pytest.fixture(params=[BLOCK, BLOCK // 4], ids=["lands", "offered"])
def nodes(request, tmp_path: Path):
    """Nodes a and b; b's landing buffers hold a block, or only a quarter of one."""
    a, b = make(tmp_path / "a", blocks=16), make(tmp_path / "b", blocks=16)
    pa, pb = _free_port(), _free_port()
    ca = Cluster(a, _config("a", pa, "b", pb, BLOCK))
    try:
        cb = Cluster(b, _config("b", pb, "a", pa, request.param))
    except BaseException:
        ca.close()
        raise
    yield a, b, ca, cb
    cb.close()
    ca.close()
    b.close()
    a.close()


def _hold(a, cb, i: int) -> str:
    """Block *i* written on a, and b told so (as a's KV event would)."""
    name = name_of(i)
    a.put(name, blob(i))
    cb.index.stored("a", block_hash_of(name), Medium.DRAM)
    return name


def test_a_peer_block_is_read_byte_exact_by_the_path_its_size_takes(nodes):
    a, b, ca, cb = nodes
    name = _hold(a, cb, 1)
    offer = cb.links.fetch("a", name, 5.0)
    try:
        assert (offer.size, offer.landed) == (BLOCK, cb.config.landing >= BLOCK)
        if offer.landed:  # a wrote it here: it holds nothing more for b
            assert bytes(cb.agent.landing.bytes(offer.address, offer.size)) == blob(1)
            assert len(a.leases) == 0
        else:  # offered: a holds it for b's read
            assert len(a.leases) == 1
    finally:
        cb.links.release("a", offer)
    deadline = time.monotonic() + DEADLINE
    while len(a.leases) and time.monotonic() < deadline:  # the release is sent without an answer
        time.sleep(0.01)
    assert len(a.leases) == 0
    assert b.read(name) == blob(1)
    assert b.stat(name).tiers == ("dram",)
    stored = [e for e in b.events.drain() if e.name == name and e.kind.value == "stored"]
    assert [e.detail for e in stored] == [f"{PEER_DETAIL}a"]


def test_a_remote_hit_is_counted_on_both_nodes_and_reaches_metrics_top_and_df(nodes):
    from kvfs.mount.metrics import make_registry
    from kvfs.tools.cmd_top import frame, render, render_peers

    a, b, ca, cb = nodes
    before = {"time": time.time() - 1, "statistics": b.statistics().to_json(), "mountpoint": "/b", "events_dropped": 0}
    names = [_hold(a, cb, i) for i in range(2, 5)]
    for i, name in enumerate(names, 2):
        assert b.read(name) == blob(i)
    [pb] = b.statistics().peers
    assert (pb.name, pb.healthy, pb.hits, pb.bytes_read, pb.misses, pb.corrupt, pb.stranded) == (
        "a",
        True,
        3,
        3 * BLOCK,
        0,
        0,
        0,
    )
    assert pb.fetch_buckets[-1] == 3 and pb.fetch_seconds > 0
    [pa] = a.statistics().peers
    assert (pa.name, pa.served, pa.bytes_served, pa.hits) == ("b", 3, 3 * BLOCK, 0)

    text = prometheus_client.generate_latest(make_registry(b)).decode()
    assert 'kvfs_peer_hits_total{peer="a"} 3.0' in text
    assert f'kvfs_peer_read_bytes_total{{peer="a"}} {float(3 * BLOCK)}' in text
    assert 'kvfs_peer_fetch_seconds_count{peer="a"} 3.0' in text
    assert 'kvfs_peer_healthy{peer="a"} 1.0' in text
    assert 'kvfs_peer_served_total{peer="b"} 3.0' in prometheus_client.generate_latest(make_registry(a)).decode()

    now = {"time": time.time(), "statistics": b.statistics().to_json(), "mountpoint": "/b", "events_dropped": 0}
    f = frame(before, now)
    [row] = f["peers"]
    assert row["name"] == "a" and row["hits_per_s"] > 0 and row["fetch_ms"] > 0
    lines = render(f).splitlines()
    assert any(line.split()[:2] == ["PEER", "HEALTH"] for line in lines)
    assert any(line.split()[:2] == ["a", "ok"] for line in lines)
    assert render_peers(f["peers"]).splitlines()[1].split()[2] == str(pb.blocks)


def test_a_missing_block_costs_one_question_and_is_counted_as_a_miss(nodes):
    a, b, ca, cb = nodes
    name = _hold(a, cb, 6)
    a.delete(name)
    assert b.lookup(name) is None
    [pb] = b.statistics().peers
    assert (pb.hits, pb.misses, pb.healthy) == (0, 1, True)
    assert cb.index.holders(block_hash_of(name)) == []


def test_a_landing_buffer_whose_transfer_was_abandoned_rests_before_reuse():
    now = [0.0]
    landing = Landing(4096, 2, clock=lambda: now[0])
    first, second = landing.take(), landing.take()
    assert None not in (first, second) and landing.take() is None
    landing.give(first, abandoned=True)  # the peer may still write into it
    landing.give(second)
    assert landing.take() == second and landing.take() is None
    now[0] = QUARANTINE + 1
    assert landing.take() == first
    landing.close()


def _exit_status(code: str, env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    marker = tmp_path / "atexit"
    script = f"import atexit, sys\natexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n{code}"
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    return res.returncode, (marker.read_text() if marker.exists() else "") + res.stdout


UCX = """
from kvfs.nixl import Agent, leave, needs_hard_exit
agent = Agent("exit-test")
agent.backend("UCX")
print(needs_hard_exit())
if needs_hard_exit():
    leave(3)
sys.exit(3)
"""


def test_a_process_that_loaded_ucx_runs_its_atexit_handlers_and_keeps_its_status(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    assert _exit_status(UCX, env, tmp_path) == (3, "ranTrue\n")  # InfiniBand module loaded: leave()
    (tmp_path / "atexit").unlink()
    env.update(UCX_TLS="tcp", UCX_MODULES="^ib")  # as ucx_tls = "tcp" sets it: an ordinary exit
    assert _exit_status(UCX, env, tmp_path) == (3, "ranFalse\n")


def test_a_process_without_nixl_exits_as_usual(tmp_path):
    code = "from kvfs.nixl import needs_hard_exit\nprint(needs_hard_exit())\nsys.exit(4)"
    assert _exit_status(code, dict(os.environ), tmp_path) == (4, "ranFalse\n")
