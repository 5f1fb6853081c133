"""``kvfs bench faults``: local hits, unmount and recovery while a shared tier stops answering.

For each scenario (:data:`~kvfs.tools.faultrig.SCENARIOS`: a posix tier on a filesystem
that stops answering, an S3 server stopped with SIGSTOP, an S3 endpoint that accepts and
never answers) it mounts kvfs over DRAM, a disk tier and that shared tier
(:class:`~kvfs.tools.faultrig.FaultRig`), writes blocks through the mount, and measures in
the same run:

- DRAM hits and disk hits (open, read, close; byte-exact) with the tier healthy (the
  baseline) and while it does not answer, with another thread asking the shared tier all
  the while; printed as p50/p99/max and the fault/baseline ratio;
- how long a read of a block only the shared tier holds takes to fail, against the
  tier's deadline, and the next one (the tier is known unhealthy by then);
- the recovery: from the moment the tier answers again until that block reads;
- ``kvfs umount`` during the fault, with blocks written meanwhile (their write-through
  cannot finish): its time, exit status and report; then a remount checks that every
  block written reads back byte-exact.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import random
import threading
import time
from typing import Any

from kvfs.units import parse_duration, parse_size

from .faultrig import SCENARIOS, FaultRig
from .flags import positive_int, seconds, size
from .render import print_json, table

__all__ = ["add_arguments", "measure", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="which fault (repeatable; default: all of them)",
    )
    p.add_argument("--hits", type=positive_int, default=200, help="reads per measurement (default: %(default)s)")
    p.add_argument("--block-size", type=size, default="256KiB", help="payload bytes per block (default: %(default)s)")
    p.add_argument("--blocks", type=positive_int, default=12, help="blocks written (default: %(default)s)")
    p.add_argument("--timeout", type=seconds(), default="2s", help="the shared tier's timeout (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def measure(rig: FaultRig, hits: int, say: Any = None) -> dict[str, Any]:
    """Run the measurements of the module doc on a fresh *rig*; returns the figures."""
    say = say or (lambda _msg: None)
    out: dict[str, Any] = {"scenario": rig.scenario, "deadline_s": rig.deadline}
    rig.mount()
    rig.populate()
    dram, disk = rig.local("dram"), rig.local("disk")
    if not dram or not disk:
        raise RuntimeError(f"expected blocks in DRAM and on disk, got dram={dram} disk={disk}")
    say(f"  {rig.scenario}: {len(dram)} blocks in DRAM, {len(disk)} on disk, 1 only in the shared tier")
    base = {"dram": rig.hits(dram, hits), "disk": rig.hits(disk, hits)}
    rig.break_()
    stop = threading.Event()
    loader = rig.load_shared(stop)
    try:
        first = rig.read_shared_only()
        again = rig.read_shared_only()
        fault = {"dram": rig.hits(dram, hits), "disk": rig.hits(disk, hits)}
    finally:
        stop.set()
    rig.mend()
    loader.join(rig.deadline * 3)
    out["recovery_s"] = rig.recovery()
    for kind in ("dram", "disk"):
        b, f = base[kind], fault[kind]
        out[kind] = {"baseline": b.to_json(), "fault": f.to_json(), "p99_ratio": f.p99 / b.p99}
    out["shared_only"] = {
        "first_s": first[0],
        "first_errno": errno.errorcode.get(first[1] or 0, first[1]),
        "again_s": again[0],
        "again_errno": errno.errorcode.get(again[1] or 0, again[1]),
    }
    # unmount while the tier does not answer, with blocks written meanwhile
    rig.break_()
    rng = random.Random(5)
    for k in range(3):
        rig.publish(f"m/ff/during{k}", rng.randbytes(rig.block_size))
    took, rc, said = rig.umount()
    rig.mend()
    out["umount"] = {"seconds": took, "exit": rc, "said": said}
    rig.mount()
    out["lost_or_wrong"] = rig.intact()
    took, rc, said = rig.umount()
    out["final_umount"] = {"seconds": took, "exit": rc}
    return out


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:.2f}"


def _rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        for kind in ("dram", "disk"):
            b, f = r[kind]["baseline"], r[kind]["fault"]
            rows.append(
                [
                    r["scenario"],
                    f"{kind} hit",
                    f"{b['p50_ms']:.2f}/{b['p99_ms']:.2f}/{b['max_ms']:.2f}",
                    f"{f['p50_ms']:.2f}/{f['p99_ms']:.2f}/{f['max_ms']:.2f}",
                    f"{r[kind]['p99_ratio']:.2f}x",
                ]
            )
    return rows


def run(args: argparse.Namespace) -> int:
    size = parse_size(args.block_size)
    timeout = parse_duration(args.timeout)
    scenarios = args.scenario or list(SCENARIOS)
    load = os.getloadavg()
    quiet = args.json

    def say(msg: str) -> None:
        if not quiet:
            print(msg, flush=True)

    results = []
    for scenario in scenarios:
        say(f"kvfs bench faults: {scenario} (shared tier timeout {timeout:g}s)")
        rig = FaultRig(scenario, blocks=args.blocks, block_size=size, timeout=timeout)
        t0 = time.monotonic()
        try:
            results.append(measure(rig, args.hits, say))
        finally:
            rig.close()
        say(f"  done in {time.monotonic() - t0:.1f}s")
    if args.json:
        print_json({"load": list(load), "block_size": size, "hits": args.hits, "results": results})
        return 0
    print(f"\nlatency of open+read+close in ms, p50/p99/max (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    print(table(["SCENARIO", "ACCESS", "HEALTHY", "DURING THE FAULT", "P99 RATIO"], _rows(results)))
    print()
    rows = []
    for r in results:
        s = r["shared_only"]
        u = r["umount"]
        rows.append(
            [
                r["scenario"],
                f"{r['deadline_s']:g}",
                f"{s['first_s']:.2f} ({s['first_errno']})",
                f"{s['again_s'] * 1e3:.1f}ms ({s['again_errno']})",
                f"{r['recovery_s']:.2f}",
                f"{u['seconds']:.2f} (exit {u['exit']})",
                "none" if not r["lost_or_wrong"] else ", ".join(r["lost_or_wrong"]),
            ]
        )
    print(
        table(
            ["SCENARIO", "DEADLINE S", "SHARED-ONLY READ S", "AGAIN", "RECOVERY S", "UMOUNT S", "LOST OR WRONG"],
            rows,
        )
    )
    return 0
