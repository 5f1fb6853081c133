"""Nothing is shared by accident: each daemon owns its arena and its disk directory, and
its runtime directory is its own.

- a second daemon on the same DRAM arena or disk directory is refused, naming the holder;
- a ``dram.path`` naming a file kvfs did not create (or a symlink) is refused, untouched;
- an arena larger than its filesystem's free space is a clear error at mount, not a SIGBUS;
- a runtime directory pre-created by another local user (``XDG_RUNTIME_DIR`` unset) is
  refused by ``kvfs mount`` and ``kvfs df``, and nothing is written through its symlinks
  (a second real user is created for this when the tests run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from kvfs.config import DiskConfig, DramConfig
from kvfs.errors import TierInUse, TierUnavailable
from kvfs.names import TierName
from kvfs.tiers.disk import DiskTier
from kvfs.tiers.dram import DramTier

from support.cli import KVFS
from support.deadlines import DEADLINE
from support.mounts import fuse_missing
from support.users import account


def dram_at(path: Path | None, capacity: int = 1 << 20) -> DramTier:
    return DramTier(DramConfig(name=TierName("dram"), capacity=capacity, path=path, mlock=False, prefault=False))


@pytest.fixture
def arena_path():
    p = Path(f"/dev/shm/kvfs-test-{uuid.uuid4().hex[:8]}")
    yield p
    if p.exists() or p.is_symlink():
        p.unlink()


def test_a_second_tier_on_one_arena_is_refused_naming_the_holder(arena_path):
    first = dram_at(arena_path)
    try:
        with pytest.raises(TierInUse, match=rf"{arena_path} is in use by pid {os.getpid()} \("):
            dram_at(arena_path)
        first.put("a", b"x" * 10, 1)
    finally:
        first.close()
    assert not arena_path.exists()  # ours: removed at close
    again = dram_at(arena_path)  # free again
    again.close()


def test_a_daemon_holding_an_arena_is_named_from_another_process(arena_path):
    code = (
        "import sys, time; from pathlib import Path; "
        "from kvfs.config import DramConfig; from kvfs.tiers.dram import DramTier; "
        f"t = DramTier(DramConfig(name='dram', capacity=1<<20, path=Path('{arena_path}'), mlock=False, prefault=False)); "
        "print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TierInUse, match=rf"in use by pid {holder.pid} \(.*kvfs\.tiers\.dram"):
            dram_at(arena_path)
    finally:
        holder.communicate("")
    assert holder.returncode == 0


def test_a_dram_path_that_is_not_a_kvfs_arena_is_refused_and_untouched(arena_path, tmp_path):
    arena_path.write_bytes(b"someone's data")
    with pytest.raises(TierInUse, match="exists and is not a kvfs arena; kvfs will not overwrite it"):
        dram_at(arena_path)
    assert arena_path.read_bytes() == b"someone's data"
    arena_path.unlink()
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    arena_path.symlink_to(target)
    with pytest.raises(TierInUse, match="exists and is not a kvfs arena"):
        dram_at(arena_path)
    assert target.read_bytes() == b"keep"


def test_an_arena_left_by_a_dead_daemon_is_reused(arena_path):
    t = dram_at(arena_path)
    os.link(arena_path, f"{arena_path}.keep")  # survive the close, as a killed daemon's would
    t.close()
    os.rename(f"{arena_path}.keep", arena_path)
    dram_at(arena_path).close()  # a kvfs arena nobody holds: taken over


def test_a_second_tier_on_one_disk_directory_is_refused(tmp_path):
    first = DiskTier(DiskConfig(name=TierName("disk"), capacity=1 << 20, path=tmp_path / "d"))
    (tmp_path / "d" / "tmp" / "in-flight").write_bytes(b"first's temporary")
    try:
        with pytest.raises(TierInUse, match=rf"{tmp_path / 'd'} is in use by pid {os.getpid()}"):
            DiskTier(DiskConfig(name=TierName("disk2"), capacity=1 << 20, path=tmp_path / "d"))
        assert (tmp_path / "d" / "tmp" / "in-flight").exists()  # the refused one cleaned nothing
    finally:
        first.close()


def test_an_arena_larger_than_free_space_is_a_clear_error(small_tmpfs):
    path = small_tmpfs / "arena"
    with pytest.raises(TierUnavailable, match=r"the arena needs 16 MiB but .* has only .* free; lower tiers\[0\]"):
        dram_at(path, capacity=16 << 20)
    assert not path.exists()
    t = dram_at(path, capacity=2 << 20)  # what fits: reserved as it is used, writing it never SIGBUSes
    t.put("a", b"y" * (2 << 20), 1)
    t.close()


# -- two daemons, through kvfs mount --------------------------------------------------------


def test_a_second_daemon_on_the_same_arena_and_directory_is_refused(kvfs_mount, tmp_path, arena_path):
    text = f"""
[[tiers]]
kind = "dram"
capacity = "8MiB"
path = "{arena_path}"
mlock = false
prefault = false

[[tiers]]
kind = "disk"
capacity = "32MiB"
path = "{tmp_path / "disk"}"
"""
    first = kvfs_mount(text)
    (first / "blk").write_bytes(b"from the first daemon")
    with pytest.raises(RuntimeError, match=rf"{arena_path} is in use by pid \d+ \(the kvfs daemon of {first}\)"):
        kvfs_mount(text)
    other_arena = text.replace(str(arena_path), f"{arena_path}-2")
    try:
        with pytest.raises(
            RuntimeError, match=rf"{tmp_path / 'disk'} is in use by pid \d+ \(the kvfs daemon of {first}"
        ):
            kvfs_mount(other_arena)
    finally:
        Path(f"{arena_path}-2").unlink(missing_ok=True)
    assert (first / "blk").read_bytes() == b"from the first daemon"


# -- the runtime directory --------------------------------------------------------------------


@pytest.fixture
def other_user():
    """A second local user, made for the test (root only)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("unshare") is None:
        pytest.skip("needs root, useradd and unshare to play a second local user")
    name = f"kvfst{uuid.uuid4().hex[:6]}"
    res = account("useradd", "--no-create-home", "--shell", "/bin/false", name)
    if res.returncode != 0:
        pytest.skip(f"useradd failed: {res.stderr.strip()}")
    yield name
    account("userdel", name)


SQUAT = r"""
set -eu
# In a private mount namespace, /tmp/kvfs-0 (root's runtime directory when XDG_RUNTIME_DIR
# is unset) becomes a fresh directory of the other user's, mode 0777: what a user who got
# there first leaves. Only that directory is covered, so the checkout, its interpreter and
# every other test's runtime files stay where they are, wherever the checkout lives.
mkdir -p /tmp/kvfs-0
mount -t tmpfs -o uid=$(id -u {user}),mode=0777,size=1m tmpfs /tmp/kvfs-0
cd {root}
mkdir -p mnt mnt2 victim safe
echo precious > victim/file
cfg={root}/kvfs.toml
printf '[[tiers]]\nkind = "dram"\ncapacity = "8MiB"\nmlock = false\nprefault = false\n' > $cfg
# a mount whose daemon keeps its socket in a safe runtime directory
XDG_RUNTIME_DIR={root}/safe {kvfs} mount {root}/mnt2 --config $cfg
trap 'XDG_RUNTIME_DIR={root}/safe {kvfs} umount {root}/mnt2 >/dev/null 2>&1 || fusermount3 -u -z {root}/mnt2' EXIT
# the other user plants symlinks and a fake socket where the daemons' files would go
for mp in {root}/mnt {root}/mnt2; do
    key=$({py} -c 'import sys; from kvfs.mount.paths import _key; print(_key(sys.argv[1]))' $mp)
    runuser -u {user} -- ln -s {root}/victim/file /tmp/kvfs-0/$key.pid
    runuser -u {user} -- ln -s {root}/victim/file /tmp/kvfs-0/$key.log
    {py} -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' /tmp/kvfs-0/$key.sock
    chown {user} /tmp/kvfs-0/$key.sock
done
unset XDG_RUNTIME_DIR
set +e
{kvfs} mount {root}/mnt --config $cfg > {root}/mount.out 2>&1; echo "mount=$?"
{kvfs} df {root}/mnt2 > {root}/df.out 2>&1; echo "df=$?"
set -e
echo "victim=$(cat {root}/victim/file)"
echo "mounted=$(grep -c ' {root}/mnt ' /proc/self/mountinfo || true)"
cat {root}/mount.out {root}/df.out
"""


def test_a_runtime_directory_squatted_by_another_user_is_refused(other_user):
    if fuse_missing():
        pytest.skip(fuse_missing())
    if os.getuid() != 0:
        pytest.skip("plays root, whose runtime directory is /tmp/kvfs-0")
    kvfs = " ".join(KVFS)
    root = Path(tempfile.mkdtemp(prefix="kvfs-sq-"))  # short: the sockets under it are limited to 107 bytes
    script = SQUAT.format(user=other_user, py=sys.executable, kvfs=kvfs, root=root)
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE,
    )
    shutil.rmtree(root, ignore_errors=True)
    out = res.stdout
    assert "mount=1" in out and "df=1" in out, out + res.stderr
    assert "victim=precious" in out  # nothing written through the planted symlinks
    assert "mounted=0" in out
    uid = pwd.getpwnam(other_user).pw_uid
    assert f"the runtime directory /tmp/kvfs-0 belongs to uid {uid}, not to you (uid 0)" in out
    assert out.count("belongs to uid") == 2  # kvfs mount and kvfs df both refuse
