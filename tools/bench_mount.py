"""``kvfs bench mount``: what a mount costs before it does anything — the time from
``kvfs mount`` to a mount that serves, and what the idle daemon holds and burns.

It mounts the embedded default (a DRAM tier of 1/16 of memory over a disk tier; the disk
tier in a scratch ``$XDG_CACHE_HOME`` so nothing of the user's is touched), or a config
given with ``--config``, and, as the baseline in the same run, a minimal mount (a 64 MiB
DRAM tier, no mlock, no prefault, over a 64 MiB disk tier). For each, ``--runs`` times:

- ``mount_s``: wall time of ``kvfs mount MP`` (it returns once the mount serves);
- then the daemon left idle for ``--idle`` seconds: its resident memory at the end
  (``VmRSS``, of which ``RssShmem`` is the mapped DRAM arena, and ``VmLck`` locked),
  its CPU use over the window (user + system time of all its threads / the window) and
  its wakeups per second (voluntary context switches of all its threads);
- ``umount_s``: wall time of ``kvfs umount MP`` (it returns once the daemon has exited).

Each figure is the median of the runs; ``ratio`` is the default's over the baseline's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .flags import positive_int, seconds
from .render import print_json, table
from .scratch import dram_disk_config, progress

__all__ = ["add_arguments", "daemon_usage", "measure_mount", "run"]

_KEYS = ("mount_s", "rss_MiB", "shmem_MiB", "locked_MiB", "idle_cpu_pct", "wakeups_per_s", "umount_s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="measure this config instead of the embedded default")
    p.add_argument("--runs", type=positive_int, default=3, help="mounts of each (default: %(default)s)")
    p.add_argument("--idle", type=seconds(), default=5.0, metavar="SECONDS", help="idle window (default: %(default)s)")
    p.add_argument("--dir", metavar="DIR", help="scratch directory (default: a new one under $TMPDIR)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _threads_ticks_and_switches(pid: int) -> tuple[int, int]:
    """CPU clock ticks (user + system) and voluntary context switches of every thread of *pid*."""
    ticks = switches = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        switches += int(line.split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return ticks, switches


def _memory(pid: int) -> dict[str, float]:
    want = {"VmRSS": "rss_MiB", "RssShmem": "shmem_MiB", "VmLck": "locked_MiB"}
    out = dict.fromkeys(want.values(), 0.0)
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in want:
                out[want[key]] = int(rest.split()[0]) / 1024  # kB
    return out


def daemon_usage(pid: int, seconds: float) -> dict[str, float]:
    """What the process *pid* uses while left alone for *seconds*: CPU percent and
    wakeups per second over the window, resident/shared/locked MiB at its end."""
    hz = os.sysconf("SC_CLK_TCK")
    t0, (ticks0, sw0) = time.monotonic(), _threads_ticks_and_switches(pid)
    time.sleep(seconds)  # the measurement itself: the daemon is left idle this long
    t1, (ticks1, sw1) = time.monotonic(), _threads_ticks_and_switches(pid)
    window = t1 - t0
    return {
        "idle_cpu_pct": 100.0 * (ticks1 - ticks0) / hz / window,
        "wakeups_per_s": (sw1 - sw0) / window,
        **_memory(pid),
    }


def _kvfs(*args: str, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "kvfs.tools.cli", *args], capture_output=True, text=True, env=env, check=False
    )
    return time.monotonic() - t0, res


def measure_mount(mp: Path, config: Path | None, idle: float, env: dict[str, str]) -> dict[str, float]:
    """Mount at *mp* (with *config*, or the embedded default), leave it idle, unmount."""
    from kvfs.mount.paths import pid_path

    args = ["mount", str(mp)] + (["--config", str(config)] if config is not None else [])
    mount_s, res = _kvfs(*args, env=env)
    if res.returncode != 0:
        raise SystemExit(f"kvfs: bench mount: {' '.join(args)} failed: {res.stderr.strip()}")
    try:
        pid = int(pid_path(mp).read_text())
        figures = daemon_usage(pid, idle)
    finally:
        umount_s, res = _kvfs("umount", str(mp), env=env)
    if res.returncode != 0:
        raise SystemExit(f"kvfs: bench mount: umount {mp} failed: {res.stderr.strip()}")
    return {"mount_s": mount_s, **figures, "umount_s": umount_s}


def _median(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in _KEYS}


def run(args: argparse.Namespace) -> int:
    say = progress(args.json)
    with tempfile.TemporaryDirectory(prefix="kvfs-bench-mount-", dir=args.dir) as tmp:
        base = Path(tmp)
        env = {**os.environ, "XDG_CACHE_HOME": str(base / "cache")}  # the default's disk tier: ours
        minimal = dram_disk_config(base, "64MiB", "64MiB", name="minimal.toml")
        subject = Path(args.config).resolve() if args.config else None
        label = str(subject) if subject else "embedded default"
        rows: dict[str, list[dict[str, float]]] = {label: [], "minimal": []}
        for i in range(args.runs):
            for name, cfg in ((label, subject), ("minimal", minimal)):
                mp = base / f"mnt-{len(rows[name])}-{name == 'minimal'}"
                mp.mkdir()
                say(f"run {i + 1}/{args.runs}: {name}")
                rows[name].append(measure_mount(mp, cfg, args.idle, env))
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
    subject_m, minimal_m = _median(rows[label]), _median(rows["minimal"])
    ratio = {k: (subject_m[k] / minimal_m[k] if minimal_m[k] else None) for k in _KEYS}
    out: dict[str, Any] = {
        "config": label,
        "runs": args.runs,
        "idle_s": args.idle,
        "loadavg": load,
        "subject": subject_m,
        "minimal": minimal_m,
        "ratio": ratio,
        "all_runs": rows,
    }
    if args.json:
        print_json(out)
        return 0
    headers = ["", "MOUNT s", "RSS MiB", "SHMEM MiB", "LOCKED MiB", "IDLE CPU %", "WAKEUPS/s", "UMOUNT s"]
    fmt = ("{:.2f}", "{:.0f}", "{:.0f}", "{:.0f}", "{:.2f}", "{:.1f}", "{:.2f}")

    def cells(m: dict[str, Any]) -> list[str]:
        return ["-" if m[k] is None else f.format(m[k]) for k, f in zip(_KEYS, fmt, strict=True)]

    print(f"kvfs bench mount: median of {args.runs} runs, idle {args.idle:g} s each (load {load})")
    print(
        table(
            headers,
            [[label, *cells(subject_m)], ["minimal (64 MiB, lean)", *cells(minimal_m)], ["ratio", *cells(ratio)]],
            right=tuple(range(1, len(headers))),
        )
    )
    return 0
