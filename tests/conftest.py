"""Shared fixtures (helpers live in tests/support/, tests/README.md "Layout").

``kvfs_mount``: mounts real kvfs filesystems (a daemon in a subprocess, through the
``kvfs mount`` command) and always unmounts them. Skipped with a reason where /dev/fuse,
fusermount3 or pyfuse3/trio are missing.

``transport``: the ``[mount] transport`` those mounts use ("auto", the default, unless a
module parametrizes it: ``support.mounts.TRANSPORTS`` runs its tests on each transport).

``small_tmpfs``: a 4 MiB tmpfs (root only).
"""

from __future__ import annotations

import os
import subprocess

import pytest

pytest.register_assert_rewrite("support")  # helpers' asserts explain themselves as a test's do

from support.mounts import KvfsMounter, fuse_missing


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
