"""``kvfs umount MOUNTPOINT``: write every DRAM-only block down, unmount, and return when
that is done.

Asks the daemon over its control socket (op ``shutdown``) and waits for the daemon
process to exit, which it does after unmounting and flushing -- every thread of it: a
thread blocked in the kernel in a call into a stalled filesystem keeps the process (and
its memory) after its main thread exited, and ``kvfs umount`` says so and waits for it
(up to ``--timeout``) rather than report a daemon gone that is not. A stale mount left by a
killed daemon (no one answers the socket) is detached with ``fusermount3 -u -z``.

Then it reads what the daemon could not do (its unmount report): blocks only in DRAM that
no persistent tier took are named and make the exit status 1; write-through copies not
made and deletes that never reached a shared tier are warned about. With a tier stalled,
the daemon gives up on it after one deadline, so this returns within the local flush plus
one deadline per stalled tier (docs/store.md, "Unmount").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from kvfs.errors import KvfsError

_NAMES_SHOWN = 20  # lost blocks named on the terminal (all of them are in the daemon's log)
_STUCK_SAY = 2.0  # seconds a thread of an exiting daemon stays blocked in the kernel before it is named


class UnmountError(KvfsError):
    """Raised when a mountpoint is not a kvfs mount or could not be unmounted."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for the flush and unmount (default 600)",
    )


def _ask_shutdown(sock_path: str) -> int:
    """The daemon's pid once it has accepted the shutdown; :class:`DaemonNotAnswering` if
    nobody answers."""
    from kvfs.client.connection import Connection
    from kvfs.protocol import DaemonNotAnswering, Shutdown

    with Connection(sock_path, timeout=10.0) as conn:
        try:
            return conn.request(Shutdown()).pid
        except DaemonNotAnswering:
            raise
        except KvfsError as exc:
            raise UnmountError(f"the daemon refused to shut down: {exc}") from None


def _threads(pid: int) -> list[tuple[int, str, str]]:
    """The live threads of process *pid*: ``(tid, state, where it waits in the kernel)``.
    A process lives while any of its threads does: after its main thread exits (a zombie)
    one blocked in an uninterruptible call keeps it, with everything it holds."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                wchan = f.read().strip()
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append((int(tid), state, wchan))
    return out


def _alive(pid: int) -> bool:
    return bool(_threads(pid))


def _stuck(pid: int) -> str | None:
    """Why the daemon, done with its exit path (main thread gone), has not ended: a
    thread blocked in the kernel (a call into a stalled filesystem); None otherwise."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                return None  # still at work (flushing, unmounting)
    except OSError:
        return None
    left = [t for t in _threads(pid) if t[1] == "D"]  # in an uninterruptible wait: not just finishing
    if not left:
        return None
    where = ", ".join(f"thread {tid} ({state}, waiting in {wchan or '?'})" for tid, state, wchan in left)
    return (
        f"the daemon (pid {pid}) has unmounted and written its blocks down, but it cannot end yet: {where} "
        "is blocked in the kernel in a call into a tier's filesystem that does not answer (a stalled shared tier); "
        "the process ends when that filesystem answers or is unmounted"
    )


def _lazy_unmount(mountpoint: str) -> None:
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", "-z", mountpoint] if tool else ["umount", "-l", mountpoint]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise UnmountError(f"{mountpoint}: {' '.join(cmd)} failed: {res.stderr.strip()}")


def _report(mp: str, pid: int) -> int:
    """Print what the daemon's unmount could not do; 1 if blocks were lost."""
    from kvfs.mount.paths import log_path, read_private, umount_report_path
    from kvfs.writeback import FlushReport

    raw = read_private(umount_report_path(mp))
    if raw is None:
        return 0
    try:
        obj = json.loads(raw)
        if obj.get("pid") != pid:
            return 0  # an older daemon's report
        report = FlushReport.from_json(obj)
    except (ValueError, KeyError, TypeError):
        print(f"kvfs: {mp}: the unmount report is unreadable; see {log_path(mp)}", file=sys.stderr)
        return 1
    for tier, n in report.unsynced.items():
        print(f"kvfs: warning: {n} write-through copies to {tier} were not made (the blocks are kept)", file=sys.stderr)
    for tier, names in report.undeleted.items():
        print(
            f"kvfs: warning: {len(names)} deleted blocks are still in {tier}: the deletes did not reach it",
            file=sys.stderr,
        )
    if not report.lost:
        return 0
    shown = "\n".join(f"  {name}: {why}" for name, why in report.lost[:_NAMES_SHOWN])
    more = f"\n  ... and {len(report.lost) - _NAMES_SHOWN} more" if len(report.lost) > _NAMES_SHOWN else ""
    print(
        f"kvfs: {mp}: {len(report.lost)} blocks only in DRAM could not be written to a persistent tier "
        f"and are lost (all are named in {log_path(mp)}):\n{shown}{more}",
        file=sys.stderr,
    )
    return 1


def run(args: argparse.Namespace) -> int:
    from kvfs.mount.daemon import mount_type
    from kvfs.mount.paths import FSTYPE, control_socket_path, pid_path

    mp = os.path.abspath(args.mountpoint)
    kind = mount_type(mp)
    if kind is None:
        raise UnmountError(f"{mp}: not mounted")
    if kind != FSTYPE:
        raise UnmountError(f"{mp}: not a kvfs mount ({kind})")
    from kvfs.protocol import DaemonNotAnswering

    try:
        pid = _ask_shutdown(str(control_socket_path(mp)))
    except DaemonNotAnswering as exc:
        # nobody answers: the daemon was killed; detach the stale mount
        if mount_type(mp) != FSTYPE:
            return 0  # it went away meanwhile
        _lazy_unmount(mp)
        try:
            pid_path(mp).unlink()
        except OSError:
            pass
        print(f"kvfs: {mp}: the daemon did not answer ({exc.why}); detached the stale mount", file=sys.stderr)
        return 0
    deadline = time.monotonic() + args.timeout
    said = False
    stuck_since: float | None = None
    while _alive(pid) or mount_type(mp) == FSTYPE:
        stuck = _stuck(pid)
        if time.monotonic() > deadline:
            raise UnmountError(
                f"{mp}: {stuck}"
                if stuck
                else f"{mp}: the daemon (pid {pid}) did not finish flushing within {args.timeout:.0f}s"
            )
        stuck_since = (stuck_since or time.monotonic()) if stuck else None
        if stuck and not said and time.monotonic() - stuck_since >= _STUCK_SAY:
            print(f"kvfs: {mp}: {stuck}; waiting for it (--timeout {args.timeout:.0f}s)", file=sys.stderr)
            said = True
        time.sleep(0.05)
    return _report(mp, pid)
