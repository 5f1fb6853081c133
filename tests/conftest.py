"""Shared fixtures.

``kvfs_mount``: mounts real kvfs filesystems (a daemon in a subprocess, through the
``kvfs mount`` command) and always unmounts them. Skipped with a reason where /dev/fuse,
fusermount3 or pyfuse3/trio are missing.

``transport``: the ``[mount] transport`` those mounts use ("auto", the default, unless a
module parametrizes it: ``TRANSPORTS`` runs its tests on each transport).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

KVFS = [sys.executable, "-m", "kvfs.tools.cli"]

DEFAULT_CONFIG = """\
[[tiers]]
kind = "dram"
name = "dram"
capacity = "{dram}"
prefault = false
mlock = false

[[tiers]]
kind = "disk"
name = "disk"
capacity = "{disk}"
path = "{data}/disk"

[mount]
allow_other = {allow_other}
"""


TRANSPORTS = pytest.mark.parametrize("transport", ["kernel", "pyfuse3"], indirect=True)
"""Put in a module's ``pytestmark`` to run its mount tests on both FUSE transports."""


def with_transport(config_text: str, transport: str) -> str:
    """*config_text* with ``[mount] transport`` set (unless it sets one itself)."""
    if transport == "auto" or "transport =" in config_text:
        return config_text
    line = f'transport = "{transport}"\n'
    if "[mount]\n" in config_text:
        return config_text.replace("[mount]\n", "[mount]\n" + line, 1)
    return config_text.rstrip("\n") + "\n\n[mount]\n" + line


def wait_for(cond, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll *cond* until it is true; AssertionError after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(interval)


def fuse_missing() -> str | None:
    """Why a real mount cannot run here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "needs /dev/fuse (FUSE is not available in this environment)"
    if shutil.which("fusermount3") is None:
        return "needs fusermount3 (apt install fuse3)"
    try:
        import pyfuse3  # noqa: F401
        import trio  # noqa: F401
    except ImportError as exc:
        return f"needs the mount extra (pyfuse3, trio): {exc}"
    return None


def _mount_type(path: Path) -> str | None:
    from kvfs.mount.daemon import mount_type

    return mount_type(path)


def run_kvfs(
    *args: str, timeout: float = 60, env: dict | None = None, check: bool = False
) -> subprocess.CompletedProcess:
    """Run ``kvfs ARGS…`` with this interpreter; returns the completed process (text)."""
    return subprocess.run(
        [*KVFS, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
        check=check,
    )


class KvfsMounter:
    """Mounts kvfs for one test; see the ``kvfs_mount`` fixture."""

    def __init__(self, base: Path, transport: str = "auto") -> None:
        self.base = base
        self.transport = transport
        self.mounts: list[Path] = []
        self.foreground: dict[Path, subprocess.Popen] = {}
        self.config_files: dict[Path, Path] = {}
        self._n = 0

    def __call__(
        self,
        config_text: str | None = None,
        *,
        dram: str = "8MiB",
        disk: str = "32MiB",
        allow_other: bool = False,
        mountpoint: Path | None = None,
        data: Path | None = None,
        foreground: bool = False,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> Path:
        self._n += 1
        data = Path(data) if data is not None else self.base / f"data{self._n}"
        data.mkdir(parents=True, exist_ok=True)
        if config_text is None:
            config_text = DEFAULT_CONFIG.format(dram=dram, disk=disk, data=data, allow_other=str(allow_other).lower())
        cfg = self.base / f"kvfs{self._n}.toml"
        cfg.write_text(with_transport(config_text, self.transport))
        mp = Path(mountpoint) if mountpoint is not None else self.base / f"mnt{self._n}"
        mp.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, **(env or {})}
        if foreground:
            proc = subprocess.Popen(
                [*KVFS, "mount", str(mp), "--config", str(cfg), "--foreground", *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=full_env,
            )
            self.foreground[mp] = proc
            self.mounts.append(mp)
            deadline = time.monotonic() + 30
            while _mount_type(mp) != "fuse.kvfs":
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = proc.stdout.read().decode() if proc.poll() is not None else ""
                    raise RuntimeError(f"kvfs mount --foreground did not mount {mp}: {out}")
                time.sleep(0.02)
            time.sleep(0.1)  # the control socket starts right after the mount
        else:
            res = subprocess.run(
                [*KVFS, "mount", str(mp), "--config", str(cfg), *args],
                capture_output=True,
                text=True,
                timeout=60,
                env=full_env,
            )
            if res.returncode != 0:
                raise RuntimeError(f"kvfs mount {mp} failed ({res.returncode}): {res.stderr}{res.stdout}")
            self.mounts.append(mp)
        self.config_files[mp] = cfg
        return mp

    def umount(self, mp: Path, timeout: float = 120) -> subprocess.CompletedProcess:
        """``kvfs umount MP`` (flushes DRAM-only blocks down); waits for a foreground daemon."""
        res = run_kvfs("umount", str(mp), timeout=timeout)
        proc = self.foreground.pop(mp, None)
        if proc is not None:
            proc.wait(timeout=timeout)
        return res

    def cleanup(self) -> None:
        for mp in self.mounts:
            if _mount_type(mp) == "fuse.kvfs":
                try:
                    self.umount(mp, timeout=60)
                except subprocess.TimeoutExpired:
                    pass
            if _mount_type(mp) == "fuse.kvfs":
                subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
        for proc in self.foreground.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


@pytest.fixture
def transport(request) -> str:
    """The FUSE transport of this test's mounts: "auto" unless parametrized (TRANSPORTS)."""
    return getattr(request, "param", "auto")


@pytest.fixture
def kvfs_mount(tmp_path, transport):
    """A factory that mounts real kvfs filesystems and unmounts them after the test.

    ``mp = kvfs_mount(config_text=None, *, dram="8MiB", disk="32MiB", allow_other=False,
    mountpoint=None, data=None, foreground=False, env=None, args=())`` mounts kvfs with
    ``kvfs mount`` in a subprocess and returns the mountpoint (a ``Path``) once it is ready.

    - *config_text*: a whole TOML config; by default a DRAM tier of *dram* over a disk
      tier of *disk* under *data* (default: a fresh directory in the test's tmp_path).
    - *mountpoint*/*data*: reuse a directory, e.g. to remount and find the same blocks.
    - *foreground*: run ``kvfs mount --foreground`` (the Popen is in
      ``kvfs_mount.foreground[mp]``) instead of the background daemon.
    - *env*: extra environment for the daemon (e.g. ``KVFS_FUSE_OPTIONS``); *args*: more
      ``kvfs mount`` flags.

    ``kvfs_mount.umount(mp)`` runs ``kvfs umount`` (flush, then unmount) and returns the
    completed process; ``kvfs_mount.config_files[mp]`` is the config used. Every mount
    still present at teardown is unmounted (``kvfs umount``, then ``fusermount3 -u -z``).
    """
    reason = fuse_missing()
    if reason:
        pytest.skip(reason)
    mounter = KvfsMounter(tmp_path, transport)
    try:
        yield mounter
    finally:
        mounter.cleanup()
