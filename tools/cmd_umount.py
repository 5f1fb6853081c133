"""``kvfs umount MOUNTPOINT``: write every DRAM-only block down, unmount, and return when
that is done.

Asks the daemon over its control socket (op ``shutdown``), waits for the ``flock`` the
daemon holds on its pid file until it has unmounted, flushed and closed its store (a
blocking lock: no polling, however long the flush), then for the process's exit (a
pidfd); then it says what was done. Calls into a stalled shared filesystem block in the
tier's helper process (kvfs.helper), not in the daemon, so the daemon does end; should
a thread of it still be blocked in the kernel, ``kvfs umount`` says so. A stale mount
left by a killed daemon (no one answers the socket) is detached with ``fusermount3 -u -z``.

Then it reads what the daemon could not do (its unmount report): blocks only in DRAM that
no persistent tier took are named and make the exit status 1; write-through copies not
made and deletes that never reached a shared tier are warned about. With a tier stalled,
the daemon gives up on it after one deadline, so this returns within the local flush plus
one deadline per stalled tier (docs/store.md, "Unmount").
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvfs.errors import KvfsError
from kvfs.writeback import FlushReport

from .flags import seconds
from .render import print_json

_NAMES_SHOWN = 20  # lost blocks named on the terminal (all of them are in the daemon's log)
_EXIT_GRACE = 0.5  # seconds the other threads get to end after the main one (killed ones end at once)


class UnmountError(KvfsError):
    """Raised when a mountpoint is not a kvfs mount or could not be unmounted."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mountpoint")
    parser.add_argument(
        "--timeout",
        type=seconds(),
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for the flush and unmount (default 600)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"mountpoint", "pid", "how" (unmounted | stale | gone), "written", "lost", '
        '"unsynced", "undeleted", "seconds"}',
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


def _leader_gone(pid: int) -> bool:
    """Whether process *pid*'s main thread has exited (gone, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _lock_released(pidfile: Path, pid: int, timeout: float) -> bool:
    """Block until the daemon *pid* lets go of the ``flock`` it holds on its pid file
    until its store is closed (:func:`kvfs.mount.daemon.hold`); False after *timeout*
    seconds. True at once when the file is gone or names another process."""
    from kvfs.mount.paths import open_private

    try:
        fd = open_private(pidfile, os.O_RDONLY)
    except FileNotFoundError:
        return True
    with os.fdopen(fd) as f:
        if f.read().strip() != str(pid):
            return True
        got = threading.Event()

        def wait() -> None:  # flock has no timeout: a thread waits, abandoned after ours
            fcntl.flock(f.fileno(), fcntl.LOCK_SH)
            got.set()

        threading.Thread(target=wait, daemon=True, name="kvfs-umount-wait").start()
        return got.wait(timeout)


def wait_done(mp: str, pid: int, timeout: float) -> int:
    """Block until the daemon *pid* of *mp* is done: its pid-file lock released (the
    flush is over and its store closed), then its process exited (a pidfd: the kernel
    wakes us). Returns how many of its threads are still alive: 0, unless it abandoned
    calls in a tier that stopped answering, whose threads end only when it answers (then
    its main thread has exited and nothing of the mount is left). :class:`UnmountError`
    after *timeout* seconds."""
    from kvfs.mount.paths import pid_path

    deadline = time.monotonic() + timeout
    late = UnmountError(f"{mp}: the daemon (pid {pid}) did not finish flushing within {timeout:g}s")
    if not _lock_released(pid_path(mp), pid, timeout):
        raise late
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return 0
    try:
        # what is left after the lock is the interpreter's exit: moments. The main thread
        # is watched too: threads stuck in a hung tier keep the pidfd from ever firing
        leader_gone = None
        while not select.select([fd], [], [], 0.05)[0]:
            now = time.monotonic()
            if leader_gone is None and _leader_gone(pid):
                leader_gone = now
            if leader_gone is not None and now - leader_gone > _EXIT_GRACE:
                try:
                    return max(len(os.listdir(f"/proc/{pid}/task")) - 1, 0)
                except OSError:
                    return 0
            if now > deadline:
                raise late
        return 0
    finally:
        os.close(fd)


def _lazy_unmount(mountpoint: str) -> None:
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    cmd = [tool, "-u", "-z", mountpoint] if tool else ["umount", "-l", mountpoint]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise UnmountError(f"{mountpoint}: {' '.join(cmd)} failed: {res.stderr.strip()}")


def _read_report(mp: str, pid: int) -> FlushReport | None:
    """The unmount report the daemon *pid* left; None if it left none (it wrote nothing
    down, or died first). :class:`UnmountError` if it is unreadable."""
    from kvfs.mount.paths import log_path, read_private, umount_report_path

    raw = read_private(umount_report_path(mp))
    if raw is None:
        return None
    try:
        obj = json.loads(raw)
        if obj.get("pid") != pid:
            return None  # an older daemon's report
        return FlushReport.from_json(obj)
    except (ValueError, KeyError, TypeError):
        raise UnmountError(f"{mp}: the unmount report is unreadable; see {log_path(mp)}") from None


def _warn(mp: str, report: FlushReport) -> int:
    """Print what the daemon's unmount could not do; 1 if blocks were lost."""
    from kvfs.mount.paths import log_path

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


def _say(args: argparse.Namespace, mp: str, pid: int | None, report: FlushReport | None, how: str) -> None:
    """What was done: one line, or ``--json``."""
    if args.json:
        print_json({"mountpoint": mp, "pid": pid, "how": how, **(report or FlushReport()).to_json()})
        return
    if how == "stale":
        print(f"{mp}: detached a stale mount (its daemon was gone)")
        return
    written = 0 if report is None else report.written
    seconds = 0.0 if report is None else report.seconds
    print(
        f"unmounted {mp}: the daemon (pid {pid}) wrote {written} DRAM-only block{'' if written == 1 else 's'} "
        f"down in {seconds:.2f}s and exited"
    )


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
            _say(args, mp, None, None, "gone")
            return 0  # it went away meanwhile
        _lazy_unmount(mp)
        try:
            pid_path(mp).unlink()
        except OSError:
            pass
        print(f"kvfs: {mp}: the daemon did not answer ({exc.why}); detached the stale mount", file=sys.stderr)
        _say(args, mp, None, None, "stale")
        return 0
    stuck = wait_done(mp, pid, args.timeout)
    if stuck:
        print(
            f"kvfs: warning: {stuck} thread{'s' if stuck != 1 else ''} of the daemon (pid {pid}) still wait on a "
            "tier that does not answer; they end when it does (the mount is gone)",
            file=sys.stderr,
        )
    how = "unmounted"
    if mount_type(mp) == FSTYPE:  # it died before unmounting (killed mid-flush): detach what is left
        _lazy_unmount(mp)
        print(f"kvfs: {mp}: the daemon (pid {pid}) exited without unmounting; detached the mount", file=sys.stderr)
        how = "stale"
    report = _read_report(mp, pid)
    _say(args, mp, pid, report, how)
    return 0 if report is None else _warn(mp, report)
