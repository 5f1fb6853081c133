"""Tenants on the batch client's socket, with real second users (made with useradd when the
tests run as root): per-name access on every request, per-name refusals inside a batch,
events filtered per namespace, and the copy path for a peer that may not map the arena
(docs/client.md, "Security"; docs/tenants.md, "Access").
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from kvfs.client import Client

from support.client_procs import CONFIG, MiB, Peer, blob, sha, statistics
from support.configs import TENANTS_CONFIG
from support.deadlines import wait_for
from support.users import public_mountpoint, run_as, users  # noqa: F401  (fixtures)

NOGROUP = 65534  # the group socket's group; both tenants are in it

TENANTS = """
[client]
socket = "{gsock}"
group = "nogroup"
group_writes = true
copy_buffer = "4MiB"

[mount]
allow_other = true

""" + TENANTS_CONFIG[TENANTS_CONFIG.index("[[namespaces]]") :]  # a: alice's, 0750; b: bob's, 0700


@pytest.fixture
def tenants(kvfs_mount, users, public_mountpoint, tmp_path):
    """A mount whose namespaces a (alice's, 0750) and b (bob's, 0700) belong to two real
    users, both reaching the daemon through the group socket (group nogroup, puts allowed)
    and the mount (``allow_other``); the dict of users is ``people[who] = (uid, gid, name)``."""
    people = users("alice", "bob", groups={"alice": "nogroup", "bob": "nogroup"})
    gdir = Path(tempfile.mkdtemp(prefix="kvfs-tenants-"))
    os.chmod(gdir, 0o755)
    gsock = gdir / "c.sock"
    alice, bob = people["alice"], people["bob"]
    more = TENANTS.format(gsock=gsock, a_uid=alice[0], a_gid=alice[1], b_uid=bob[0], b_gid=bob[1])
    data = tmp_path / "data"
    data.mkdir()
    mp = kvfs_mount(CONFIG.format(dram="16MiB", data=data, more=more), data=data, mountpoint=public_mountpoint)
    peers: list[Peer] = []

    def connect(who: str, *args: str) -> Peer:
        uid, gid, _ = people[who]
        p = Peer(gsock, *args, become=(uid, gid, NOGROUP))
        peers.append(p)
        return p

    yield mp, connect, people
    for p in peers:
        p.close()
    shutil.rmtree(gdir, ignore_errors=True)


def _refused(results: list, namespace: str) -> bool:
    """Every result is an AccessDenied that names *namespace* and says what to do."""
    return all(
        r != "ok" and r[0] == "AccessDenied" and f"namespace {namespace!r}" in r[1] and "ask its owner" in r[1]
        for r in results
    )


def test_a_tenant_reads_and_writes_its_namespace_and_nothing_of_anothers(tenants):
    mp, connect, people = tenants
    with Client(mp, write=True) as owner:
        owner.put(["b/00/x", "free/y"], [blob(1, MiB), blob(2, 4096)])
    alice = connect("alice", "write")
    assert alice.connected["ok"] and alice.connected["owner"] is False
    alice.ok("put a/00/mine 3 65536")
    assert alice.ok("read a/00/mine")["sha"] == sha(blob(3, 65536))
    assert alice.ok("view a/00/mine")["sha"] == sha(blob(3, 65536))
    alice.ok("release")
    assert alice.ok("read free/y")["sha"] == sha(blob(2, 4096))  # outside every namespace: as before

    # every request that carries a name of b is refused with a clear error, name by name
    mixed = "a/00/mine,b/00/x,free/y"
    for op in ("lookup", "read", "view", "lease"):
        res = alice.ok(f"each {op} {mixed}")["results"]
        assert res[0] == "ok" and res[2] == "ok" and _refused([res[1]], "b"), (op, res)
    res = alice.ok("each put a/00/new,b/00/evil,a/00/new2")["results"]
    assert res[0] == res[2] == "ok" and _refused([res[1]], "b"), res
    for op in ("stat", "ls", "du"):
        res = alice.ok(f"each {op} b/00/x,b,b/00")["results"]
        assert _refused(res, "b"), (op, res)
    for op in ("evict", "prefetch", "pin"):
        res = alice.ok(f"each {op} a/00/mine,b/00/x")["results"]
        assert res[0] == "ok" and _refused([res[1]], "b"), (op, res)
        res = alice.ok(f"each {op} b/00/x")["results"]  # all refused: the whole request is
        assert _refused(res, "b"), (op, res)
    res = alice.ok("each prefetch ,a")["results"]  # the root holds b: a directory above it is refused
    assert _refused([res[0]], "b") and res[1] == "ok", res
    res = alice.ok("each evict free/y")["results"]  # outside every namespace: the owner's, as before
    assert res[0][0] == "PermissionDenied" and "may not use the evict command" in res[0][1], res

    # a hint's reply counts the names held: one of b's refuses it whole
    res = alice.do('raw hint {"names": ["a/00/mine", "b/00/x"], "when": "ended"}')
    assert res["type"] == "AccessDenied" and "namespace 'b'" in res["error"], res
    assert alice.ok('raw hint {"names": ["a/00/mine"], "when": "soon"}')["reply"]["known"] == 1

    # the raw reply says the same per name: never a silent empty answer
    reply = alice.ok('raw lookup {"names": ["a/00/mine", "b/00/x"]}')["reply"]
    assert reply["sizes"][0] == 65536 and reply["sizes"][1] == -1 and reply["prefix"] == 1
    assert reply["errors"][0] is None and reply["errors"][1]["type"] == "AccessDenied"

    # nothing of b changed; what alice did in a stuck
    with Client(mp) as owner:
        st = owner.stat("b/00/x")
        assert st.size == MiB and not st.pinned and "dram" in st.tiers
        assert not owner.lookup(["b/00/evil"]).present(0)
        assert owner.lookup(["a/00/new", "a/00/new2"]).prefix == 2
        assert owner.stat("a/00/mine").pinned
    assert statistics(mp).leases == 0

    # bob may do everything in b, nothing in a (0750, and he is not in alice's group)
    bob = connect("bob", "write")
    assert bob.ok("read b/00/x")["sha"] == sha(blob(1, MiB))
    assert _refused(bob.ok("each read a/00/mine")["results"], "a")


MOUNT_WRITES = r"""
import errno, json, sys
mp = sys.argv[1]
out = {}
for name in sys.argv[2:]:
    try:
        with open(f"{mp}/{name}", "wb") as f:
            f.write(b"from the mount")
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""


def test_a_put_through_the_socket_passes_exactly_the_rules_a_write_through_the_mount_passes(tenants):
    """Issue 20, item 1: with group_writes, alice put over the owner's block outside every
    namespace (the mount refused her the same write) and a third user read her bytes. Now
    each name is decided by the one rule that decides it on the mount: its namespace's, or
    outside every namespace with one the mount's default (its owner's, 0755)."""
    mp, connect, people = tenants
    owner_bytes = blob(2, 4096)
    with Client(mp, write=True) as owner:
        owner.put(["free/y", "b/00/x"], [owner_bytes, blob(1, 4096)])
    names = {  # name -> True when alice may write it
        "free/y": False,  # the owner's block outside every namespace: replace
        "free/new": False,  # a new block there
        "top": False,  # at the root
        "a/00/mine": True,  # her namespace (0750, hers)
        "b/00/x": False,  # bob's (0700)
        "b/00/new": False,
    }
    alice = connect("alice", "write")
    res = alice.ok(f"each put {','.join(names)}")["results"]
    by_socket = dict(zip(names, res))
    for name, allowed in names.items():
        r = by_socket[name]
        assert (r == "ok") is allowed, (name, r)
        if not allowed:
            assert r[0] == "AccessDenied" and f"uid {people['alice'][0]} may not write" in r[1], (name, r)
    assert "it lies outside every namespace with an access rule" in by_socket["free/y"][1]
    # the same names through the mount, as the same user: the same answers
    by_mount = run_as(people["alice"], MOUNT_WRITES, str(mp), *[f"{n}.m" if n.startswith("a/") else n for n in names])
    assert {n: by_mount[f"{n}.m" if n.startswith("a/") else n] == "ok" for n in names} == names, by_mount
    assert set(by_mount.values()) <= {"ok", "EACCES"}, by_mount
    # nothing of the owner's changed; bob (a third user) reads the owner's bytes
    bob = connect("bob")
    assert bob.ok("read free/y")["sha"] == sha(owner_bytes)
    assert (mp / "free" / "y").read_bytes() == owner_bytes
    with Client(mp) as owner:
        gone = owner.lookup(["free/new", "top", "b/00/new"])
        assert not any(gone.present(i) for i in range(3))
        assert owner.lookup(["a/00/mine"]).prefix == 1


def test_a_tenant_gets_no_events_of_another_namespace(tenants):
    mp, connect, _ = tenants
    alice = connect("alice")
    alice.ok("events start")
    with Client(mp, write=True) as owner:
        owner.put(["b/00/e1", "a/00/e1", "free/e1"], [blob(1, 4096)] * 3)
        owner.evict(["b/00/e1"], tier="dram")
        os.unlink(mp / "b" / "00" / "e1")
        owner.put(["a/00/e2"], [blob(2, 4096)])
    names: list[str] = []

    def seen_last() -> bool:
        names[:] = alice.ok("events stop")["names"]
        return "a/00/e2" in names

    wait_for(seen_last)
    assert "a/00/e1" in names and "free/e1" in names
    assert not [n for n in names if n.startswith("b/")], names
    with Client(mp) as owner, owner.events() as ev:  # the owner still sees everything
        with Client(mp, write=True) as w:
            w.put(["b/00/e3"], [blob(3, 4096)])
        assert next(ev).name == "b/00/e3"


def _copy_buffers(pid: int) -> int:
    """Copy buffers the daemon *pid* has open now (by inode: a mapping holds a descriptor too)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:kvfs-copy"):
                found.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            pass
    return len(found)


def test_a_peer_a_rule_keeps_off_the_arena_reads_and_writes_through_its_copy_buffer(tenants):
    mp, connect, _ = tenants
    with Client(mp, write=True) as owner:
        pid = owner.welcome.pid
        owner.put([f"a/00/{i}" for i in range(6)], [blob(i, MiB) for i in range(6)])
        owner.evict(["a/00/5"], tier="dram")  # its only copy on disk: the daemon copies it from there
        [v] = owner.get(["a/00/1"])  # the owner keeps the zero-copy path
        with v:
            assert owner.welcome.copy_buffer == 0 and not owner.copying and v.kind == "arena"
            assert bytes(owner.arena[v.offset : v.offset + v.length]) == blob(1, MiB)
    assert _copy_buffers(pid) == 0
    alice = connect("alice", "write")
    # alice may not read b: no arena descriptor, a copy buffer of [client] copy_buffer
    assert alice.connected["arena"] is False and alice.connected["copy_buffer"] == 4 * MiB
    assert alice.connected["max_put"] == 4 * MiB
    assert _copy_buffers(pid) == 1
    # byte-exact through copies, in as many batches as the buffer holds
    names = ",".join(f"a/00/{i}" for i in range(6))
    assert alice.ok(f"readmany {names} {MiB}")["sha"] == [sha(blob(i, MiB)) for i in range(6)]
    got = alice.ok(f"views {names}")["results"]  # views hold slots: four fit
    assert got[:4] == [sha(blob(i, MiB)) for i in range(4)] and got[4:] == ["NoSpace", "NoSpace"], got
    alice.ok("release")
    again = alice.ok("views a/00/4,a/00/5")["results"]  # released slots are free again
    assert again == [sha(blob(4, MiB)), sha(blob(5, MiB))]
    alice.ok("release")
    alice.ok("put a/01/p 9 3000000")  # a put through the buffer, checked in the arena
    with Client(mp) as owner:
        buf = bytearray(3000000)
        owner.get_into(["a/01/p"], [buf])
        assert sha(buf) == sha(blob(9, 3000000))
    # the daemon maps the buffer: it is sealed against truncation
    assert alice.ok("shrink") == {"ok": True, "shrunk": False, "errno": 1}  # EPERM
    # a SIGKILLed copy client frees its slots, leases and reservations at once
    alice.ok("view a/00/0")
    alice.ok("reserve a/01/q 65536")
    assert statistics(mp).leases == 1 and statistics(mp).reserved > 0
    alice.kill()
    wait_for(lambda: statistics(mp).leases == 0 and statistics(mp).reserved == 0 and _copy_buffers(pid) == 0)


def test_a_bad_dram_copy_is_never_copied_to_a_copy_client(tenants):
    """A writer scribbles on a committed DRAM extent (what a trusted writer can do): the
    daemon's check of the copy it makes for a copy-buffer client catches it, drops that
    copy, and serves the block from its good copy on disk."""
    mp, connect, _ = tenants
    with Client(mp, write=True) as owner:
        owner.put(["a/00/z"], [blob(5, MiB)])
        owner.evict(["a/00/z"], tier="dram")
        owner.prefetch(["a/00/z"])  # now in DRAM and on disk
        [h] = owner.lease(["a/00/z"], promote="always")
        assert h.kind == "arena"
        owner.arena[h.offset + 1000] ^= 0xFF
        h.release()
    before = statistics(mp).tiers[0].corrupt
    alice = connect("alice")
    assert alice.ok("read a/00/z")["sha"] == sha(blob(5, MiB))
    assert alice.ok("view a/00/z")["sha"] == sha(blob(5, MiB))
    assert statistics(mp).tiers[0].corrupt == before + 1  # the DRAM copy, dropped once
