"""The peer tier's wire on real NIXL: two nodes in this process, UCX over TCP on loopback.

Two real stores stand for two nodes, each with what ``[cluster]`` adds to a daemon
(``kvfs.mount.cluster.Cluster``: its NIXL agent with the UCX backend, its peer channel on
127.0.0.1, its links to the other). What tests/cluster/test_cluster.py shows between daemons in
network namespaces, this shows path by path: a block that fits a landing buffer comes
in one round trip, a larger one in chunks, both byte-exact and counted; a read with
every landing buffer busy waits, then misses; the counters reach Prometheus and ``kvfs
top``/``kvfs df``'s renderings. And what a peer holds of a node is checked: everything
the serving node ever sent it names neither its arena nor its NIXL agent, NIXL refuses
its reads and writes of the arena, a node's metadata for one peer carries only that
peer's landing buffers, and a peer cannot pass itself off as another. With ``ucx_tls =
"tcp"`` UCX's InfiniBand module is not loaded, so this process exits as any does
(kvfs.nixl); the exit itself is tested in subprocesses at the end.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvfs.config import ClusterConfig, PeerConfig
from kvfs.errors import BlockNotFound, TierUnavailable
from kvfs.hashing import block_hash_of
from kvfs.peers import PEER_DETAIL, Medium

from support.stores import BLOCK, blob, make

nixl = pytest.importorskip("nixl_cu12", reason="NIXL is not installed (pip install 'kvfs[cluster]')")
prometheus_client = pytest.importorskip("prometheus_client")

from kvfs.errors import TransferFailed
from kvfs.mount import peer_server
from kvfs.mount.cluster import Cluster
from kvfs.mount.nixl_agent import QUARANTINE, Landing
from kvfs.mount.peer_wire import MAX_REQUEST, recv_frame, send_frame
from kvfs.nixl import agent_of

DEADLINE = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def name_of(i: int) -> str:
    h = f"{i:02x}" + "ef" * 15
    return f"m/{h[:2]}/{h}"


def _config(node: str, port: int, peers: dict[str, int], landing: int) -> ClusterConfig:
    return ClusterConfig(
        node=node,
        listen=f"127.0.0.1:{port}",
        peers=tuple(PeerConfig(name=p, address=f"127.0.0.1:{pp}") for p, pp in peers.items()),
        timeout=5.0,
        ucx_tls="tcp",
        landing=landing,
    )


@pytest.fixture(params=[BLOCK, BLOCK // 4], ids=["fits", "chunks"])
def nodes(request, tmp_path: Path):
    """Nodes a and b; b's landing buffers hold a block, or a quarter of one. b also
    names a node c that never runs (it has landing buffers of its own on b)."""
    a, b = make(tmp_path / "a", blocks=16), make(tmp_path / "b", blocks=16)
    pa, pb, pc = _free_port(), _free_port(), _free_port()
    ca = Cluster(a, _config("a", pa, {"b": pb}, BLOCK))
    try:
        cb = Cluster(b, _config("b", pb, {"a": pa, "c": pc}, request.param))
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


def _until(cond) -> bool:
    deadline = time.monotonic() + DEADLINE
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def test_a_peer_block_is_read_byte_exact_in_one_round_or_in_chunks(nodes):
    a, b, ca, cb = nodes
    name = _hold(a, cb, 1)
    room = cb.config.landing
    incoming = cb.links.fetch("a", name, 5.0)
    try:
        assert (incoming.size, incoming.done) == (BLOCK, min(BLOCK, room))
        landing = cb.agent.landings["a"]
        assert bytes(landing.bytes(incoming.buffers[0], min(BLOCK, room))) == blob(1)[:room]
        # a holds the block for b only while chunks remain to be sent
        assert len(a.leases) == (0 if room >= BLOCK else 1)
    finally:
        cb.links.release("a", incoming)
    assert _until(lambda: len(a.leases) == 0)  # the release is sent without an answer
    assert b.read(name) == blob(1)
    assert b.stat(name).tiers == ("dram",)
    stored = [e for e in b.events.drain() if e.name == name and e.kind.value == "stored"]
    assert [e.detail for e in stored] == [f"{PEER_DETAIL}a"]
    assert len(a.leases) == 0


def test_chunks_come_through_one_landing_buffer_when_the_others_are_busy(nodes):
    a, b, ca, cb = nodes
    landing = cb.agent.landings["a"]
    others = landing.take_free(landing.count - 1)
    try:
        name = _hold(a, cb, 12)
        assert b.read(name) == blob(12)
    finally:
        for address in others:
            landing.give(address)
    assert len(landing.take_free(landing.count)) == landing.count  # every buffer came back


def test_a_read_with_every_landing_buffer_busy_waits_then_is_a_counted_miss(nodes):
    a, b, ca, cb = nodes
    landing = cb.agent.landings["a"]
    name = _hold(a, cb, 13)
    held = landing.take_free(landing.count)
    try:
        with pytest.raises(BlockNotFound):
            b.read(name)  # waits the peer's timeout for a buffer, then gives up
    finally:
        for address in held:
            landing.give(address)
    [pb, _] = b.statistics().peers
    assert (pb.name, pb.busy, pb.misses, pb.errors, pb.healthy, pb.hits) == ("a", 1, 0, 0, True, 0)
    assert b.read(name) == blob(13)  # not skipped: the peer was not at fault


def test_a_remote_hit_is_counted_on_both_nodes_and_reaches_metrics_top_and_df(nodes):
    from kvfs.mount.metrics import make_registry
    from kvfs.tools.cmd_top import frame, render, render_peers

    a, b, ca, cb = nodes
    before = {"time": time.time() - 1, "statistics": b.statistics().to_json(), "mountpoint": "/b", "events_dropped": 0}
    names = [_hold(a, cb, i) for i in range(2, 5)]
    for i, name in enumerate(names, 2):
        assert b.read(name) == blob(i)
    [pb, _] = b.statistics().peers
    assert (pb.name, pb.healthy, pb.hits, pb.bytes_read, pb.misses, pb.corrupt, pb.busy) == (
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
    assert 'kvfs_peer_busy_total{peer="a"} 0.0' in text
    assert 'kvfs_peer_served_total{peer="b"} 3.0' in prometheus_client.generate_latest(make_registry(a)).decode()

    now = {"time": time.time(), "statistics": b.statistics().to_json(), "mountpoint": "/b", "events_dropped": 0}
    f = frame(before, now)
    row = f["peers"][0]
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
    pb = b.statistics().peers[0]
    assert (pb.hits, pb.misses, pb.healthy) == (0, 1, True)
    assert cb.index.holders(block_hash_of(name)) == []


def _values(obj):
    """Every leaf of a decoded frame."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _values(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _values(v)
    else:
        yield obj


def test_a_peer_holding_all_the_server_sent_it_cannot_name_read_or_write_its_arena(nodes, monkeypatch):
    a, b, ca, cb = nodes
    sent = []
    real_send = peer_server.send_frame

    def recording(sock, msg):
        sent.append(msg)
        real_send(sock, msg)

    monkeypatch.setattr(peer_server, "send_frame", recording)
    names = [_hold(a, cb, i) for i in (20, 21)]
    for i, name in zip((20, 21), names, strict=True):
        assert b.read(name) == blob(i)
    cb.links.holdings("a", 5.0)
    assert sent and any("got" in m for m in sent) and any("holdings" in m for m in sent)

    leaves = list(_values(sent))
    arena = range(ca.agent.base, ca.agent.base + ca.agent.size)
    assert not [v for v in leaves if isinstance(v, int) and v in arena]  # no address in a's arena
    blobs = [v for v in leaves if isinstance(v, bytes | str)]
    assert not [v for v in blobs if (v.encode() if isinstance(v, str) else v).find(ca.agent.name.encode()) >= 0]
    assert not [v for v in blobs if isinstance(v, bytes) and agent_of(v) is not None]  # no NIXL metadata
    assert not [v for v in blobs if isinstance(v, bytes) and struct.pack("<Q", ca.agent.base) in v]

    # b's NIXL, told a's agent's name (which a never sent) and its arena's address, is refused
    agent, ucx = cb.agent._agent, cb.agent._ucx
    theirs = [(ca.agent.base + a.slots[0].tier.locate(names[0]).offset, BLOCK // 4, 0)]
    mine = [(cb.agent.landings["c"].base, BLOCK // 4, 0)]  # registered memory of b's
    for op in ("READ", "WRITE"):
        with pytest.raises(TransferFailed):
            agent.transfer(op, mine, theirs, backend=ucx, timeout=5.0, agent=ca.agent.name)
    assert a.read(names[0]) == blob(20)  # a's copy is untouched


def test_a_nodes_metadata_for_a_peer_names_only_that_peers_landing_buffers(nodes):
    a, b, ca, cb = nodes
    md = cb.agent.metadata_for("a")
    assert agent_of(md) == cb.agent.name
    assert struct.pack("<Q", cb.agent.landings["a"].base) in md
    assert struct.pack("<Q", cb.agent.landings["c"].base) not in md  # another peer's buffers
    assert struct.pack("<Q", cb.agent.base) not in md  # the arena
    # a, holding only that, is refused by NIXL when it aims anywhere else in b
    remote = agent_of(md)
    name = _hold(a, cb, 22)
    assert b.read(name) == blob(22)  # a has loaded b's metadata for it (the read's hello)
    offset = a.slots[0].tier.locate(name).offset
    for dest in (cb.agent.landings["c"].base, cb.agent.base + 4096):
        with pytest.raises(TierUnavailable):
            ca.agent.write(remote, offset, 4096, [dest], 4096, 5.0)
    ca.agent.write(remote, offset, 4096, [cb.agent.landings["a"].base], 4096, 5.0)  # its own: written
    assert bytes(cb.agent.landings["a"].bytes(cb.agent.landings["a"].base, 4096)) == blob(22)[:4096]


def _hello(port: int, msg: dict) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as s:
        send_frame(s, msg)
        return recv_frame(s)


def test_a_peer_cannot_pass_itself_off_as_another(nodes):
    a, b, ca, cb = nodes
    md = cb.agent.metadata_for("a")
    port = ca.config.port
    other = f"c-1-{cb.agent.name.rsplit('-', 1)[1]}"
    reply = _hello(port, {"op": "hello", "node": "b", "agent": other, "metadata": md})
    assert "is not one of node b's" in reply["error"]  # b's address, another node's agent name
    reply = _hello(port, {"op": "hello", "node": "b", "agent": "b-1-ab", "metadata": md})
    assert f"the metadata is of NIXL agent {cb.agent.name!r}" in reply["error"]  # it names another agent
    reply = _hello(port, {"op": "fetch", "name": name_of(1), "dests": [4096], "room": 4096})
    assert "say hello first" in reply["error"]  # every connection starts with its own hello
    assert peer_server.agent_belongs(cb.agent.name, "b") and not peer_server.agent_belongs(cb.agent.name, "a")
    assert not peer_server.agent_belongs("a-b-1-ff", "a")  # node "a" cannot claim node "a-b"'s agents


def test_peers_sharing_an_address_are_told_apart_by_their_hello(nodes):
    """b names a and c, both on 127.0.0.1: a's hello to b is a's, not refused as c's (the
    address alone was last-wins, so a connection from a could be taken for c)."""
    a, b, ca, cb = nodes
    md = ca.agent.metadata_for("b")
    port = cb.config.port
    reply = _hello(port, {"op": "hello", "node": "a", "agent": ca.agent.name, "metadata": md})
    assert reply["node"] == "b" and "error" not in reply
    reply = _hello(port, {"op": "holdings"})
    assert "say hello first" in reply["error"] and "a or c" in reply["error"]  # which of them is asking?
    stranger = f"d-1-{ca.agent.name.rsplit('-', 1)[1]}"
    reply = _hello(port, {"op": "hello", "node": "d", "agent": stranger, "metadata": md})
    assert "is not one of node" in reply["error"]  # neither a's nor c's


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes *sock* (a read gets end of file) within the deadline."""
    sock.settimeout(DEADLINE)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_the_channel_refuses_other_addresses_and_ends_oversized_or_stalled_requests(nodes):
    a, b, ca, cb = nodes
    port = ca.config.port
    refused = ca.server.refused
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))  # loopback too, but not a configured peer's address
        s.connect(("127.0.0.1", port))
        assert _closed_by_server(s)
    assert ca.server.refused == refused + 1
    assert len(cb.agent.metadata_for("a")) < MAX_REQUEST // 16  # a real hello is far below the bound
    with socket.create_connection(("127.0.0.1", port)) as s:
        try:  # a request over the limit, its bytes streaming in: the header is enough to end it
            s.sendall(struct.pack(">I", 1 << 30) + b"x" * MAX_REQUEST)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert _closed_by_server(s)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(struct.pack(">I", MAX_REQUEST + 1))  # one byte over: refused as well
        assert _closed_by_server(s)
    idle = socket.create_connection(("127.0.0.1", port))  # connected, silent: allowed to wait
    stalled = socket.create_connection(("127.0.0.1", port))
    try:
        stalled.sendall(struct.pack(">I", 100) + b"x" * 10)  # begun, then never finished
        name = _hold(a, cb, 23)
        assert b.read(name) == blob(23)  # the peer is served while the hostile frame waits
        assert _closed_by_server(stalled)  # ended at the server's timeout
        assert b.read(name) == blob(23)
        assert b.read(_hold(a, cb, 24)) == blob(24)  # and after it
        idle.setblocking(False)
        with pytest.raises(BlockingIOError):  # the silent connection is still open, not closed
            idle.recv(1)
    finally:
        stalled.close()
        idle.close()


def test_a_reply_trickled_past_the_deadline_ends_the_ask_not_the_trickle():
    """A hostile serving node that sends a reply a byte at a time, each well within the
    timeout, cannot hold an asker longer than its deadline: the ask fails while the
    trickle goes on."""
    from kvfs.mount.peer_link import _Link

    trickling, stopped = threading.Event(), threading.Event()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def trickle() -> None:
            conn, _ = listener.accept()
            with conn:
                recv_frame(conn)  # the ask
                trickling.set()
                conn.sendall(struct.pack(">I", 1000))
                for _ in range(int(DEADLINE / 0.1)):
                    if stopped.is_set():
                        return
                    try:
                        conn.sendall(b"x")
                    except OSError:
                        return
                    stopped.wait(0.1)

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        host, port = listener.getsockname()
        link = _Link(PeerConfig(name="hostile", address=f"{host}:{port}"), 1.0)
        try:
            with pytest.raises(TierUnavailable):
                link.ask({"op": "holdings"}, 1.0)
            assert trickling.is_set() and thread.is_alive()  # the trickle had not ended
        finally:
            stopped.set()
            link.close()
            thread.join(DEADLINE)


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


def test_a_take_waits_for_a_buffer_given_back_until_its_deadline():
    landing = Landing(4096, 1)
    held = landing.take()
    assert landing.take(time.monotonic() + 0.05) is None  # none came back in time
    threading.Timer(0.05, landing.give, args=(held,)).start()
    assert landing.take(time.monotonic() + DEADLINE) == held
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
