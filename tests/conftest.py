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

DEADLINE = float(os.environ.get("KVFS_TEST_DEADLINE", "180"))
"""Seconds a test waits for something that happens at once on an idle machine (a mount to
serve, a process to exit, a background copy to land) before it fails. Generous on
purpose: the suite must pass on a machine at load 10; waiting costs nothing when the
condition comes sooner. tests/README.md, "Writing tests"."""

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


ENGINE_DEADLINE = 10 * DEADLINE
"""Seconds a whole engine run or bench in a subprocess (vLLM, SGLang, LMCache loading a
model, generating, restarting) may take before it is taken for hung: they take minutes
on an idle machine, several times that at load 10."""

TIER_TIMEOUT = 60.0
"""The ``timeout`` of a tier in a test that does not test deadlines: a healthy call on a
loaded machine never reaches it. A test of a deadline gives the calls it stalls itself a
short one."""

HANG = 60.0
"""botocore's own connect and read timeouts (seconds): a call to a stopped or stalled S3
endpoint that kvfs's deadline (1-3 s in the tests) did not cut would wait at least this
long. "Bounded, not a hang" is asserted as ``elapsed < HANG``: it holds at any load a
test can pass at, and fails when the deadline is missing."""


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


def wait_for(cond, timeout: float = DEADLINE, interval: float = 0.02) -> None:
    """Poll *cond* until it is true; AssertionError after *timeout* seconds (default: the
    suite's :data:`DEADLINE`)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(interval)


def account(*argv: str) -> subprocess.CompletedProcess:
    """Run ``useradd``/``userdel``/``groupdel`` *argv*, again while another process holds
    the lock on /etc/passwd (tests in other workers, other suites on the machine make and
    remove users too); returns the last try."""
    deadline = time.monotonic() + DEADLINE
    while True:
        res = subprocess.run(list(argv), capture_output=True, text=True)
        busy = res.returncode != 0 and ("lock" in res.stderr.lower() or "try again" in res.stderr.lower())
        if not busy or time.monotonic() > deadline:
            return res
        time.sleep(0.1)


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


def run_kvfs(
    *args: str, timeout: float = DEADLINE, env: dict | None = None, check: bool = False
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


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs mounted in the test's tmp_path (a full /dev/shm, in small); skipped
    unless the tests run as root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mp = tmp_path / "small"
    mp.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mp)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield mp
    subprocess.run(["umount", "-l", str(mp)], capture_output=True)


# Files that take minutes (real engines loading models, benches) run first: with parallel
# workers (`-n 4 --dist loadfile`, each file on one worker) a long file that started last
# would leave the other workers idle while it runs.
_SLOW_FIRST = (
    "test_engine_sglang_backend",
    "test_bench_engines",
    "test_engine_vllm",
    "test_engine_",
    "test_kv_events",
    "test_bench_ttft",
    "test_prefix_cache",
    "test_gpu_agent",
    "test_faults",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return next((i for i, prefix in enumerate(_SLOW_FIRST) if name.startswith(prefix)), len(_SLOW_FIRST))

    items.sort(key=rank)  # stable: within a file, and among the rest, the collected order
