"""Real kvfs mounts for a test: :class:`KvfsMounter` (behind the ``kvfs_mount`` fixture in
conftest.py), why a mount cannot run here, and the FUSE transports a module runs on."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support.cli import KVFS, run_kvfs
from support.configs import DEFAULT_CONFIG
from support.deadlines import DEADLINE

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


def _serving(mp: Path) -> bool:
    """Whether the daemon of the mount at *mp* answers on its control socket."""
    from kvfs.mount.paths import control_socket_path
    from kvfs.protocol import DaemonNotAnswering, Ping
    from kvfs.tools.control_client import ControlClient

    try:
        with ControlClient(control_socket_path(mp), timeout=DEADLINE) as c:
            c.request(Ping())
        return True
    except DaemonNotAnswering:
        return False


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
            deadline = time.monotonic() + DEADLINE
            while _mount_type(mp) != "fuse.kvfs" or not _serving(mp):  # the socket starts right after the mount
                if proc.poll() is not None or time.monotonic() > deadline:
                    out = proc.stdout.read().decode() if proc.poll() is not None else ""
                    raise RuntimeError(f"kvfs mount --foreground did not mount {mp}: {out}")
                time.sleep(0.02)
        else:
            res = subprocess.run(
                [*KVFS, "mount", str(mp), "--config", str(cfg), *args],
                capture_output=True,
                text=True,
                timeout=DEADLINE,
                env=full_env,
            )
            if res.returncode != 0:
                raise RuntimeError(f"kvfs mount {mp} failed ({res.returncode}): {res.stderr}{res.stdout}")
            self.mounts.append(mp)
        self.config_files[mp] = cfg
        return mp

    def umount(self, mp: Path, timeout: float = DEADLINE) -> subprocess.CompletedProcess:
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
                    self.umount(mp)
                except subprocess.TimeoutExpired:
                    pass
            if _mount_type(mp) == "fuse.kvfs":
                subprocess.run(["fusermount3", "-u", "-z", str(mp)], capture_output=True)
        for proc in self.foreground.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=DEADLINE)
                except subprocess.TimeoutExpired:
                    proc.kill()
