"""Namespaces on a real mount, with real second users (made with useradd when the tests
run as root): access per namespace through ``allow_other`` + ``default_permissions``,
renames between namespaces, quotas and retired namespaces at the seal, soft pins by
extended attribute. docs/SEMANTICS.md lines 38 to 41, docs/tenants.md.
"""

from __future__ import annotations

import errno
import grp
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from support.cli import run_kvfs
from support.configs import TENANTS_CONFIG, dram_over_disk
from support.deadlines import DEADLINE
from support.users import public_mountpoint, run_as, users  # noqa: F401  (fixtures)

# What a tenant's process tries, each step's outcome printed as "ok" or the errno's name.
TENANT_SCRIPT = r"""
import errno, json, os, sys
mp, mine, theirs = sys.argv[1:4]
out = {}
def attempt(label, fn):
    try:
        r = fn()
        out[label] = r if isinstance(r, str) else "ok"
    except OSError as exc:
        out[label] = errno.errorcode.get(exc.errno, str(exc.errno))
def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
def read(path):
    with open(path, "rb") as f:
        return "ok" if f.read() else "empty"
attempt("mkdir own", lambda: os.makedirs(f"{mp}/{mine}/ab", exist_ok=True))
attempt("write own", lambda: write(f"{mp}/{mine}/ab/blk", b"mine" * 1000))
attempt("read own", lambda: read(f"{mp}/{mine}/ab/blk"))
attempt("list own", lambda: "ok" if os.listdir(f"{mp}/{mine}/ab") == ["blk"] else "wrong")
attempt("pin own", lambda: os.setxattr(f"{mp}/{mine}/ab/blk", "user.kvfs.pinned", b"1"))
if theirs:
    t = f"{mp}/{theirs}/ab/blk"
    attempt("list theirs", lambda: os.listdir(f"{mp}/{theirs}"))
    attempt("list their shard", lambda: os.listdir(f"{mp}/{theirs}/ab"))
    attempt("stat theirs", lambda: os.stat(t))
    attempt("read theirs", lambda: read(t))
    attempt("pin theirs", lambda: os.setxattr(t, "user.kvfs.pinned", b"1"))
    attempt("unpin theirs", lambda: os.removexattr(t, "user.kvfs.pinned"))
    attempt("tiers of theirs", lambda: os.getxattr(t, "user.kvfs.tiers"))
    attempt("replace theirs", lambda: write(t, b"evil"))
    attempt("write into theirs", lambda: write(f"{mp}/{theirs}/ab/new", b"evil"))
    attempt("unlink theirs", lambda: os.unlink(t))
print(json.dumps(out))
"""


def as_user(user: tuple[int, int, str], mp: Path, mine: str, theirs: str = "") -> dict[str, str]:
    return run_as(user, TENANT_SCRIPT, str(mp), mine, theirs)


TIERS = dram_over_disk("{dram}", "32MiB", "{data}/disk")


def test_s36_s38_a_tenant_cannot_list_read_write_or_pin_another_tenants_blocks(
    kvfs_mount, users, public_mountpoint, tmp_path
):
    """Two real users, each owning a namespace; a third in the first one's group."""
    people = users("alice", "bob")
    alice, bob = people["alice"], people["bob"]
    carol = users("carol", groups={"carol": alice[2]})["carol"]
    cfg = TENANTS_CONFIG.format(data=tmp_path, a_uid=alice[0], a_gid=alice[1], b_uid=bob[0], b_gid=bob[1])
    mp = kvfs_mount(cfg, mountpoint=public_mountpoint)
    st = os.stat(mp / "a")  # the namespace directories exist from the start, owned by their tenants
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (alice[0], alice[1], 0o750)
    assert stat.S_IMODE(os.stat(mp / "b").st_mode) == 0o700

    b_side = as_user(bob, mp, "b")
    assert set(b_side.values()) == {"ok"}, b_side
    a_side = as_user(alice, mp, "a", "b")
    own = {k: v for k, v in a_side.items() if k.endswith("own")}
    assert set(own.values()) == {"ok"}, a_side
    theirs = {k: v for k, v in a_side.items() if not k.endswith("own")}
    assert set(theirs.values()) == {"EACCES"}, a_side  # list, stat, read, pin, unpin, xattrs, write, unlink

    blk = os.stat(mp / "a" / "ab" / "blk")  # a block: the namespace's owner, rw bits of its mode
    assert (blk.st_uid, blk.st_gid, stat.S_IMODE(blk.st_mode)) == (alice[0], alice[1], 0o640)
    assert (mp / "b" / "ab" / "blk").read_bytes() == b"mine" * 1000  # nothing of b changed
    assert os.getxattr(mp / "b" / "ab" / "blk", "user.kvfs.pinned") == b"1"  # pinned by bob only

    # carol is in alice's group (a supplementary group): she reads a (r-x), but may not
    # write or pin there (group bits r-x), and b is closed to her as to alice
    c = as_user(carol, mp, "c-none", "a")
    assert c["list their shard"] == "ok" and c["read theirs"] == "ok" and c["tiers of theirs"] == "ok"
    assert c["pin theirs"] == c["replace theirs"] == c["write into theirs"] == c["unlink theirs"] == "EACCES"
    assert c["mkdir own"] == "EACCES"  # the mount's root is the mounting user's (0755)
    c_b = as_user(carol, mp, "c-none", "b")
    assert c_b["read theirs"] == c_b["list theirs"] == "EACCES"

    # chown within the namespace's owner is accepted, to anyone else refused
    os.chown(mp / "a" / "ab" / "blk", alice[0], alice[1])
    with pytest.raises(PermissionError):
        os.chown(mp / "a" / "ab" / "blk", bob[0], -1)


REPLACE_SCRIPT = r"""
import errno, json, os, sys
d = sys.argv[1]
out = {}
def attempt(label, fn):
    try:
        out[label] = fn()
    except OSError as exc:
        out[label] = errno.errorcode.get(exc.errno, str(exc.errno))
def write(mode, data):
    with open(f"{d}/blk", mode) as f:
        if mode == "r+b":
            f.seek(0, 2)
        f.write(data)
    return "ok"
def read():
    with open(f"{d}/blk", "rb") as f:
        return f.read().decode()
os.makedirs(d, exist_ok=True)
attempt("create", lambda: write("wb", b"one"))
attempt("read 1", read)
attempt("replace", lambda: write("wb", b"two"))  # O_TRUNC over a sealed block
attempt("read 2", read)
attempt("append", lambda: write("r+b", b"+three"))  # a new version from the old bytes
attempt("read 3", read)
attempt("replace again", lambda: write("wb", b"four"))
attempt("read 4", read)
print(json.dumps(out))
"""


def test_s09_s10_s38_a_tenant_replaces_its_own_block_through_the_mount(kvfs_mount, users, public_mountpoint, tmp_path):
    """Issue 20, item 12: a tenant with write in its namespace replaces its block (with and
    without O_TRUNC) and reads it back at once: never EACCES (the inode set aside for the
    replace's retry reported the mounting user's 0644), never ESTALE."""
    people = users("alice", "bob")
    alice, bob = people["alice"], people["bob"]
    cfg = TENANTS_CONFIG.format(data=tmp_path, a_uid=alice[0], a_gid=alice[1], b_uid=bob[0], b_gid=bob[1])
    mp = kvfs_mount(cfg, mountpoint=public_mountpoint)
    seen = run_as(alice, REPLACE_SCRIPT, str(mp / "a" / "ab"))
    assert seen == {
        "create": "ok",
        "read 1": "one",
        "replace": "ok",
        "read 2": "two",
        "append": "ok",
        "read 3": "two+three",
        "replace again": "ok",
        "read 4": "four",
    }, seen
    st = os.stat(mp / "a" / "ab" / "blk")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (alice[0], alice[1], 0o640)
    assert (mp / "a" / "ab" / "blk").read_bytes() == b"four"


NS_CONFIG = (
    TIERS.replace("{dram}", "1MiB")
    + """
[[namespaces]]
path = "a"
quota = {{ dram = "256KiB", disk = "200KiB" }}

[[namespaces]]
path = "b"

[[namespaces]]
path = "old"
retired = true
"""
)


def test_s39_rename_between_namespaces_is_exdev_and_mv_copies(kvfs_mount, tmp_path):
    mp = kvfs_mount(NS_CONFIG.format(data=tmp_path))
    (mp / "a" / "x.tmp").write_bytes(b"x" * 5000)
    os.replace(mp / "a" / "x.tmp", mp / "a" / "x")  # within a namespace: as always
    with pytest.raises(OSError) as info:
        os.rename(mp / "a" / "x", mp / "b" / "x")
    assert info.value.errno == errno.EXDEV
    with pytest.raises(OSError) as info:
        os.rename(mp / "a" / "x", mp / "x")
    assert info.value.errno == errno.EXDEV
    subprocess.run(["mv", str(mp / "a" / "x"), str(mp / "b" / "x")], check=True)
    assert (mp / "b" / "x").read_bytes() == b"x" * 5000 and not (mp / "a" / "x").exists()


def test_s40_a_namespace_full_of_pinned_blocks_refuses_the_seal_and_only_it(kvfs_mount, tmp_path):
    mp = kvfs_mount(NS_CONFIG.format(data=tmp_path))
    block = os.urandom(60 << 10)

    def seal(n: int) -> None:
        fd = os.open(mp / "a" / f"p{n}", os.O_CREAT | os.O_WRONLY)
        try:
            os.write(fd, block)
            os.fsync(fd)  # the seal: its errors come back here
        finally:
            os.close(fd)

    for n in range(4):  # a's DRAM quota: 4 blocks
        seal(n)
    run_kvfs("pin", str(mp / "a"), check=True)
    for n in range(4, 7):  # its disk quota: 3 more
        seal(n)
    run_kvfs("pin", str(mp / "a"), check=True)
    with pytest.raises(OSError) as info:
        seal(n := 7)
    assert info.value.errno == errno.ENOSPC
    with pytest.raises(FileNotFoundError):  # never published (a stat may show it for the entry timeout)
        (mp / "a" / f"p{n}").read_bytes()
    (mp / "b" / "free").write_bytes(block)  # b is not affected
    assert (mp / "b" / "free").read_bytes() == block
    res = run_kvfs("quota", "show", str(mp), "--json", check=True)
    a = {ns["path"]: ns for ns in json.loads(res.stdout)["namespaces"]}["a"]
    assert a["refused"] >= 1 and a["tiers"]["dram"]["used"] <= 256 << 10 and a["tiers"]["disk"]["used"] <= 200 << 10
    fd = os.open(mp / "old" / "y", os.O_CREAT | os.O_WRONLY)
    os.write(fd, b"stale")
    for call in (os.fsync, os.close):  # the seal, and the room its close promises (line 43)
        with pytest.raises(OSError) as info:
            call(fd)
        assert info.value.errno == errno.EROFS


HELD_CONFIG = (
    TIERS.replace("{dram}", "16MiB")
    + """
[[namespaces]]
path = "a"
quota = {{ dram = "4MiB" }}

[[namespaces]]
path = "b"
"""
)


def test_s33_s40_old_versions_held_open_count_against_the_quota_and_df(kvfs_mount, tmp_path):
    """Issue 20, item 3, on a real mount: a tenant within its DRAM quota writes version
    after version of one block while holding every old one open. Their DRAM stays taken
    until closed, so it counts: df shows it used, the quota holds it, and the other
    tenant's blocks stay in DRAM (before, they were pushed out and df showed the room
    free)."""
    mp = kvfs_mount(HELD_CONFIG.format(data=tmp_path))
    block = 1 << 20
    for i in range(8):
        (mp / "b" / f"{i}").write_bytes(bytes([i]) * block)
    held = []
    try:
        for v in range(10):
            (mp / "a" / "x").write_bytes(bytes([100 + v]) * block)
            f = open(mp / "a" / "x", "rb")  # held open on purpose
            held.append(f)
            assert f.read(1) == bytes([100 + v])
            tiers = {i: os.getxattr(mp / "b" / f"{i}", "user.kvfs.tiers") for i in range(8)}
            assert set(tiers.values()) == {b"dram"}, (v, tiers)
        res = json.loads(run_kvfs("quota", "show", str(mp), "--json", check=True).stdout)
        a = {ns["path"]: ns for ns in res["namespaces"]}["a"]
        assert a["tiers"]["dram"]["used"] <= 4 * block, a
        df = json.loads(run_kvfs("df", str(mp), "--json", check=True).stdout)
        dram = {t["name"]: t for t in df["tiers"]}["dram"]
        assert dram["used"] >= 8 * block + 3 * block, dram  # b's blocks and a's versions held open
        st = os.statvfs(mp)
        assert (st.f_blocks - st.f_bfree) * st.f_frsize >= dram["used"]
        for v, f in enumerate(held):  # every reader kept its version, whole
            f.seek(0)
            assert f.read() == bytes([100 + v]) * block
    finally:
        for f in held:
            f.close()

    def released() -> bool:
        df = json.loads(run_kvfs("df", str(mp), "--json", check=True).stdout)
        return {t["name"]: t for t in df["tiers"]}["dram"]["used"] <= 8 * block + block

    deadline = time.monotonic() + 30  # the releases follow the closes
    while not released():
        assert time.monotonic() < deadline, "the held versions' room did not come back"
        time.sleep(0.1)


def test_s27_s41_a_soft_pin_by_extended_attribute_ends_by_itself(kvfs_mount, tmp_path):
    mp = kvfs_mount(NS_CONFIG.format(data=tmp_path))
    (mp / "b" / "x").write_bytes(b"y" * 1000)
    # a soft pin long enough that a loaded machine cannot see it end before it is looked at
    os.setxattr(mp / "b" / "x", "user.kvfs.pinned", b"1h")
    assert os.getxattr(mp / "b" / "x", "user.kvfs.pinned") == b"1"
    res = json.loads(run_kvfs("stat", str(mp / "b" / "x"), "--json", check=True).stdout)
    assert res["pinned"] and time.time() + 3000 < res["pin_expires"] < time.time() + 3700
    for bad in (b"soon", b"0s", b"-5m"):
        with pytest.raises(OSError) as info:
            os.setxattr(mp / "b" / "x", "user.kvfs.pinned", bad)
        assert info.value.errno == errno.EINVAL
    os.setxattr(mp / "b" / "x", "user.kvfs.pinned", b"1s")  # a short one replaces it, and ends by itself
    deadline = time.monotonic() + DEADLINE
    while os.getxattr(mp / "b" / "x", "user.kvfs.pinned") != b"0":
        assert time.monotonic() < deadline, "the soft pin did not end"
        time.sleep(0.1)


MODES = (0o700, 0o750, 0o755, 0o770, 0o705, 0o711, 0o740, 0o057, 0o500, 0o300, 0o070, 0o000)

PROBE_SCRIPT = r"""
import json, os, sys
mp, who = sys.argv[1], sys.argv[2]
out = {}
for ns in sys.argv[3:]:
    d = f"{mp}/{ns}/ab"
    def ok(fn):
        try:
            fn()
            return True
        except PermissionError:
            return False
    def read():
        with open(f"{d}/blk", "rb") as f:
            f.read()
    def write():
        with open(f"{d}/new-{who}", "wb") as f:
            f.write(b"x")
    out[ns] = {
        "list": ok(lambda: os.listdir(d)),
        "read": ok(read),
        "write": ok(write),
        "pin": ok(lambda: os.setxattr(f"{d}/blk", "user.kvfs.pinned", b"1")),
    }
print(json.dumps(out))
"""


def test_s38_the_kernel_decides_as_kvfs_access_does(kvfs_mount, users, public_mountpoint, tmp_path):
    """For a dozen modes, as the owner, a member of the group (a supplementary one) and
    anyone else: what the kernel lets each do on the mount is what kvfs.access.decide says,
    operation by operation (the client socket will ask decide itself)."""
    from kvfs.access import AccessRule, Operation, Peer, decide

    owner = users("owner")["owner"]
    member = users("member", groups={"member": owner[2]})["member"]
    other = users("other")["other"]
    spaces = {f"m{mode:03o}": mode for mode in MODES}
    cfg = TIERS.replace("{dram}", "8MiB").format(data=tmp_path) + "\n[mount]\nallow_other = true\n"
    for path, mode in spaces.items():
        cfg += f'\n[[namespaces]]\npath = "{path}"\nowner = {owner[0]}\ngroup = {owner[1]}\nmode = "{mode:04o}"\n'
    mp = kvfs_mount(cfg, mountpoint=public_mountpoint)
    for path in spaces:  # root may do everything: a block in each
        (mp / path / "ab").mkdir()
        (mp / path / "ab" / "blk").write_bytes(b"k" * 100)
    ops = {"list": Operation.LIST, "read": Operation.READ, "write": Operation.WRITE, "pin": Operation.PIN}
    for who, user in (("owner", owner), ("member", member), ("other", other)):
        seen = run_as(user, PROBE_SCRIPT, str(mp), who, *spaces)
        uid, gid, name = user
        groups = [g.gr_gid for g in grp.getgrall() if name in g.gr_mem]
        peer = Peer(uid, gid, frozenset(groups))
        for path, mode in spaces.items():
            rule = AccessRule(uid=owner[0], gid=owner[1], mode=mode)
            expected = {op: decide(peer, rule, o) for op, o in ops.items()}
            assert seen[path] == expected, (who, f"{mode:04o}")
