"""One namespace across nodes, through two real mounts sharing a posix directory and S3.

- ``mkdir -p`` under a directory only the other node created (known here only from the
  shared tiers) works;
- after a restart, a block whose local disk copy is corrupt reads byte-exact on the
  first try, from a shared copy (the record learns its shared copies).
"""

from __future__ import annotations

import os

from support.cli import run_kvfs
from support.s3server import FAKE_ENV, moto  # noqa: F401 - moto is a fixture
from support.two_mounts import (
    check,
    content,
    publish,
    two_mounts,  # noqa: F401  (a fixture)
    wait_for,
)


def test_mkdir_under_a_directory_the_other_node_created(two_mounts):
    a, b = two_mounts
    publish(a / "team" / "ab" / "blk", content("team/ab/blk"))
    wait_for(lambda: os.stat(b / "team" / "ab" / "blk"))
    os.makedirs(b / "team" / "ab" / "cd" / "ef", exist_ok=True)  # team/ab exists on B only in the shared tiers
    assert (b / "team" / "ab" / "cd" / "ef").is_dir()
    os.mkdir(b / "team" / "ab" / "gh")
    assert {"blk", "cd", "gh"} <= set(os.listdir(b / "team" / "ab"))
    publish(b / "team" / "ab" / "cd" / "ef" / "blk2", content("x"))
    assert (b / "team" / "ab" / "cd" / "ef" / "blk2").read_bytes() == content("x")


def test_a_corrupt_local_copy_after_restart_reads_from_a_shared_copy(two_mounts, kvfs_mount, tmp_path):
    a, _ = two_mounts
    name = "r/ab/blk"
    data = content(name)
    publish(a / name, data)
    wait_for(lambda: check(os.getxattr(a / name, "user.kvfs.tiers") == b"dram,posix,s3"))
    run_kvfs("prefetch", "--tier", "disk", str(a / name), check=True)  # a local disk copy too
    assert kvfs_mount.umount(a).returncode == 0
    f = tmp_path / "node-a" / "disk" / "blocks" / name
    raw = bytearray(f.read_bytes())
    raw[4096 + 1000] ^= 0x40  # a bad byte in the local copy, behind kvfs's back
    f.write_bytes(raw)
    mp = kvfs_mount(kvfs_mount.config_files[a].read_text(), mountpoint=a, env=dict(FAKE_ENV))
    assert os.getxattr(mp / name, "user.kvfs.tiers").startswith(b"disk")  # found on disk at start
    assert (mp / name).read_bytes() == data  # the first read: never ENOENT, never the bad bytes
    tiers = os.getxattr(mp / name, "user.kvfs.tiers").decode().split(",")
    assert "posix" in tiers and "disk" not in tiers  # the bad copy was dropped, and counted:
    from kvfs.protocol import Statistics
    from kvfs.tools.control_client import ControlClient, resolve

    with ControlClient(resolve(str(mp)).socket) as client:
        st = client.request(Statistics()).statistics
    assert {t.name: t.corrupt for t in st.tiers}["disk"] == 1
