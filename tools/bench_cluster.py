"""``kvfs bench cluster``: the peer tier on a namespace cluster (tools/netcluster.py).

Three nodes in network namespaces on a veth bridge, each with its own daemon, and a moto
S3 server on a fourth address (as root; UCX over TCP). In one run it measures the get of a
block with the batch client (``get_into`` into one reused buffer per client, every byte
compared after the timed get), block by block in turn so the machine's load weighs on
the three alike, with every client's mapping and connections warm:

- **local**: node A reads blocks it holds in DRAM;
- **peer**: node B reads the same blocks, which only A's DRAM holds (the peer tier);
- **s3**: node C reads blocks only the S3 tier holds (written through by A, then evicted
  from A, so no peer holds them);
- **visible**: the time from A's put returning to B's first good read of that block;

and prints the ratios: peer vs s3 (aim >= 3x faster) and peer vs local (aim >= 0.3x).

``--soak SECONDS``: a mixed run instead: every node writes blocks and reads its own and
the others', checking every byte, while one fault every ``--fault-every`` seconds
(default: a minute; SIGKILL, SIGSTOP, link down, nftables drop, in turn, on a, b, c in
turn) hits a node for ``--fault-for`` seconds. It reports reads that were correct,
misses, wrong reads (must be 0) and the latency of local hits, with no fault on and, with
one on, on the nodes it did not hit (aim: p99 <= 50 ms). Exits 1 on any wrong read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvfs.units import parse_size

from .netcluster import NetCluster, Node, block_name, checked_get, missing_tools
from .scratch import progress

__all__ = ["add_arguments", "mixed_run", "run"]

FAULTS = ("kill", "stop", "cut", "drop")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--blocks", type=int, default=32, help="blocks per measurement (default: %(default)s)")
    p.add_argument("--block-size", default="1MiB", help="payload bytes per block (default: %(default)s)")
    p.add_argument(
        "--landing",
        default=None,
        help="[cluster] landing of every node (default: its default, 4MiB); smaller than "
        "--block-size: blocks come in chunks",
    )
    p.add_argument("--soak", type=float, default=None, metavar="SECONDS", help="a mixed run with faults instead")
    p.add_argument(
        "--fault-every", type=float, default=60.0, help="--soak: one fault every this many seconds (default: 60)"
    )
    p.add_argument("--fault-for", type=float, default=15.0, help="--soak: seconds each fault lasts (default: 15)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    s = sorted(values)
    return {
        "n": len(s),
        "mean_ms": round(statistics.fmean(s) * 1e3, 3),
        "p50_ms": round(s[len(s) // 2] * 1e3, 3),
        "p99_ms": round(s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3, 3),
        "max_ms": round(s[-1] * 1e3, 3),
    }


class _Reader:
    """Gets blocks through one client into one reused buffer (its pages faulted in once,
    as an engine's are), timing only the get; every byte is compared afterwards."""

    def __init__(self, client: Any, size: int) -> None:
        self.client = client
        self.buf = bytearray(size)
        self.buf[:] = bytes(size)  # touch every page now, not inside a timed get

    def get(self, name: str, data: bytes) -> float | None:
        """Seconds one get took, or None when the block was not readable."""
        from kvfs.client import BatchError

        t0 = time.perf_counter()
        try:
            [n] = self.client.get_into([name], [self.buf])
        except BatchError:
            return None
        dt = time.perf_counter() - t0
        if n != len(data) or memoryview(self.buf)[:n] != data:
            raise SystemExit(f"kvfs bench cluster: {name}: wrong bytes ({n} bytes read, {len(data)} expected)")
        return dt

    def timed(self, name: str, data: bytes) -> float:
        dt = self.get(name, data)
        if dt is None:
            raise SystemExit(f"kvfs bench cluster: {name} was not readable")
        return dt


def measure(nc: NetCluster, count: int, size: int, say: Any) -> dict[str, Any]:
    """The three gets, interleaved block by block (A's local get of block i, B's peer get
    of it, C's S3 get of another), so the machine's load weighs on all three alike; each
    client's mapping, buffer and connections are warm before the first timed get."""
    from kvfs.client import Client

    a, b, c = nc.nodes[:3]
    ca, cb, cc = (Client(str(n.socket), write=True, timeout=120) for n in (a, b, c))
    ra, rb, rc = (_Reader(cl, size) for cl in (ca, cb, cc))
    try:
        say(f"writing {count} blocks of {size} bytes on A, and {count} more that only S3 keeps")
        warm = {block_name(i, "warm"): os.urandom(size) for i in range(2)}
        blocks = {block_name(i): os.urandom(size) for i in range(count)}
        cold = {block_name(i, "s3only"): os.urandom(size) for i in range(count + 1)}
        ca.put(
            list(warm) + list(blocks) + list(cold), list(warm.values()) + list(blocks.values()) + list(cold.values())
        )
        deadline = time.monotonic() + 120
        while any("s3" not in ca.stat(n).tiers for n in cold):
            if time.monotonic() > deadline:
                raise SystemExit("kvfs bench cluster: A's write-through to S3 did not finish in 120 s")
            time.sleep(0.1)
        ca.evict(list(cold))  # every local copy: then no peer holds them
        say("warming up: each client's mapping, B's connections to A, C's to S3")
        for name, data in warm.items():
            ra.timed(name, data)
            _until_readable(rb, name, data)
        first_cold = next(iter(cold))
        rc.timed(first_cold, cold.pop(first_cold))
        say("local (A's DRAM), peer (B from A's DRAM), s3 (C from S3), block by block")
        local, peer, s3 = [], [], []
        for (name, data), (cname, cdata) in zip(blocks.items(), cold.items(), strict=True):
            local.append(ra.timed(name, data))
            peer.append(rb.timed(name, data))
            s3.append(rc.timed(cname, cdata))
        say("visible: A puts a block, B polls for it")
        visible = []
        for i in range(count):
            name, data = block_name(i, "vis"), os.urandom(size)
            ca.put([name], [data])
            visible.append(_until_readable(rb, name, data))
    finally:
        for cl in (ca, cb, cc):
            cl.close()
    res: dict[str, Any] = {"local": _ms(local), "peer": _ms(peer), "s3": _ms(s3), "visible": _ms(visible)}
    res["peer_vs_s3"] = round(statistics.fmean(s3) / statistics.fmean(peer), 2)
    res["peer_vs_local"] = round(statistics.fmean(local) / statistics.fmean(peer), 3)
    res["block_size"] = size
    return res


def _until_readable(reader: _Reader, name: str, data: bytes) -> float:
    """Seconds until *reader* got *name* right (its writer's event takes a moment)."""
    t0 = time.perf_counter()
    while reader.get(name, data) is None:
        if time.perf_counter() - t0 > 30:
            raise SystemExit(f"kvfs bench cluster: {name} not readable after 30 s")
        time.sleep(0.002)
    return time.perf_counter() - t0


# -- the mixed run --------------------------------------------------------------------


@dataclass
class SoakReport:
    """What a mixed run saw: reads that were correct (``ok``), not readable (``miss``) or
    WRONG (must stay 0), writes, the faults, and the latency of local hits (a node's
    reads of its own blocks) with no fault on and, with one on, on the nodes it did not
    hit (a stopped node serves nobody, itself included)."""

    ok: int = 0
    miss: int = 0
    wrong: int = 0
    writes: int = 0
    faults: list[str] = field(default_factory=list)
    local_during_fault: list[float] = field(default_factory=list)
    local: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def reads(self) -> int:
        return self.ok + self.miss + self.wrong

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "miss": self.miss,
            "wrong": self.wrong,
            "writes": self.writes,
            "faults": self.faults,
            "local_hits": _ms(self.local),
            "local_hits_during_faults": _ms(self.local_during_fault),
            "errors": self.errors[:10],
        }


Pace = Callable[[SoakReport], None]
"""Waits (a phase of a mixed run) given the run so far."""


def sleeping(seconds: float) -> Pace:
    """A phase of *seconds* seconds (the bench's pace: one fault a minute...)."""
    return lambda _report: time.sleep(seconds)


def reading(count: int, deadline: float = 300.0) -> Pace:
    """A phase that lasts until the nodes made *count* more reads (the tests' pace: no
    clock in it, however loaded the machine; *deadline* only catches a hang)."""

    def wait(report: SoakReport) -> None:
        goal, end = report.reads + count, time.monotonic() + deadline
        while report.reads < goal:
            if time.monotonic() > end:
                raise RuntimeError(f"the mixed run made {report.reads} of {goal} reads in {deadline:g} s: a hang")
            time.sleep(0.05)

    return wait


def mixed_run(
    nc: NetCluster, *, faults: int, between: Pace, hold: Pace, size: int = 64 << 10, say: Any = print
) -> SoakReport:
    """Every node writes and reads (its own blocks and the others'), every byte checked,
    while *faults* faults hit the nodes in turn (kill, stop, cut, drop on a, b, c...): the
    run waits *between* before each fault, *hold* while it is on, and *between* once more
    after the last before it ends."""
    from kvfs.client import Client

    report = SoakReport()
    lock = threading.Lock()
    written: dict[str, tuple[str, bytes]] = {}  # name -> (writer, bytes)
    down: set[str] = set()
    victim: list[str] = []  # the node a fault is on now
    done = threading.Event()
    rng = random.Random(7)

    def worker(node: Node) -> None:
        client = None
        mine: list[str] = []
        while not done.is_set():
            if node.name in down:
                if client is not None:
                    client.close()
                    client = None
                time.sleep(0.1)
                continue
            try:
                if client is None:
                    client = Client(str(node.socket), write=True, timeout=60)
                if len(mine) < 400 and rng.random() < 0.3:
                    name, data = block_name(0, f"soak{node.name}"), os.urandom(size)
                    client.put([name], [data])
                    with lock:
                        written[name] = (node.name, data)
                        report.writes += 1
                    mine.append(name)
                    continue
                own = bool(mine) and rng.random() < 0.5
                with lock:
                    others = [n for n, (w, _) in written.items() if w != node.name]
                if not own and not others:
                    time.sleep(0.01)
                    continue
                name = rng.choice(mine) if own else rng.choice(others)
                data = written[name][1]
                during = list(victim)
                t0 = time.perf_counter()
                got = checked_get(client, name, data)
                dt = time.perf_counter() - t0
                with lock:
                    if got == "ok":
                        report.ok += 1
                    else:
                        report.miss += 1
                    if own and not during and not victim:
                        report.local.append(dt)
                    elif own and node.name not in during + victim:
                        report.local_during_fault.append(dt)
            except AssertionError as exc:
                with lock:
                    report.wrong += 1
                    report.errors.append(str(exc))
            except Exception as exc:  # noqa: BLE001 - a daemon that went away under a fault: reconnect
                with lock:
                    report.errors.append(f"{node.name}: {type(exc).__name__}: {exc}")
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.2)
        if client is not None:
            client.close()

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in nc.nodes]
    for t in threads:
        t.start()
    try:
        for k in range(faults):
            between(report)
            kind, node = FAULTS[k % len(FAULTS)], nc.nodes[k % len(nc.nodes)]
            say(f"fault: {kind} on node {node.name}")
            report.faults.append(f"{kind}:{node.name}")
            if kind == "kill":
                down.add(node.name)
            victim.append(node.name)
            {"kill": nc.kill, "stop": nc.stop, "cut": nc.cut, "drop": nc.drop}[kind](node)
            try:
                hold(report)
            finally:
                {"kill": nc.start, "stop": nc.cont, "cut": nc.mend, "drop": nc.undrop}[kind](node)
                victim.clear()
                down.discard(node.name)
        between(report)
    finally:
        done.set()
        for t in threads:
            t.join(timeout=120)
    return report


def run(args: argparse.Namespace) -> int:
    why = missing_tools()
    if why is not None:
        raise SystemExit(f"kvfs bench cluster: {why}")
    say = progress(args.json)
    size = parse_size(args.block_size)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    say("starting 3 nodes and an S3 server in network namespaces")
    if args.soak is not None:
        every, hold = args.fault_every, min(args.fault_for, args.fault_every)
        faults = int(args.soak // every)
        if not faults:
            raise SystemExit(f"kvfs bench cluster: --soak {args.soak:g} is shorter than --fault-every {every:g}")
        tail = max(args.soak - faults * every, every - hold)
        paces = iter([sleeping(every - hold)] * faults + [sleeping(tail)])
        with NetCluster(3, timeout="1s") as nc:
            rep = mixed_run(nc, faults=faults, between=lambda r: next(paces)(r), hold=sleeping(hold), say=say)
        out = {"soak_seconds": args.soak, **rep.to_json(), "load": load}
        with open("/proc/loadavg") as f:
            out["load_after"] = f.read().split()[:3]
        if args.json:
            print(json.dumps(out, indent=2))
        else:
            with open("/proc/loadavg") as f:
                after = " ".join(f.read().split()[:3])
            print(
                f"mixed run of {args.soak:g}s, faults: {', '.join(rep.faults)} (load {' '.join(load)} before, {after} after)"
            )
            print(f"reads: {rep.ok} correct, {rep.miss} misses, {rep.wrong} WRONG; writes: {rep.writes}")
            print(f"local hits: {_ms(rep.local)}")
            print(f"local hits during faults: {_ms(rep.local_during_fault)}")
        return 1 if rep.wrong else 0
    with NetCluster(3, timeout="1s", landing=args.landing, posix=False, dram="256MiB", disk="512MiB") as nc:
        res = measure(nc, args.blocks, size, say)
    res["landing"] = args.landing or "default"
    with open("/proc/loadavg") as f:
        res["load"] = load
        res["load_after"] = f.read().split()[:3]
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"{args.blocks} blocks of {size} bytes, landing buffers {res['landing']}, UCX over TCP between namespaces "
        f"(load {' '.join(load)} before, {' '.join(res['load_after'])} after)"
    )
    print(f"{'get':10} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for key in ("local", "peer", "s3", "visible"):
        r = res[key]
        print(f"{key:10} {r['mean_ms']:9.3f} {r['p50_ms']:9.3f} {r['p99_ms']:9.3f} {r['max_ms']:9.3f}")
    print(f"peer vs s3: {res['peer_vs_s3']}x faster (aim >= 3)")
    print(f"peer vs local: {res['peer_vs_local']}x a local DRAM get's speed (aim >= 0.3)")
    return 0
