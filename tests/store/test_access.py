"""The access decision (kvfs/access.py) that the mount and the client socket share: the
rule's bits per operation and class, the arena decision, modes from config, and peer
credentials read from a real Unix socket connected by a real second user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid

import pytest

from kvfs.access import (
    AccessDenied,
    AccessRule,
    Operation,
    Peer,
    check,
    decide,
    may_map_arena,
    mode_of,
    parse_mode,
)

from support.users import account

OWNER, GROUP = 1001, 2001
READS = (Operation.LIST, Operation.READ)
CHANGES = (Operation.WRITE, Operation.EVICT, Operation.PIN)


def allowed(rule: AccessRule, peer: Peer) -> set[Operation]:
    return {op for op in Operation if decide(peer, rule, op)}


def test_owner_group_and_others_get_their_own_bits():
    rule = AccessRule(uid=OWNER, gid=GROUP, mode=0o750)
    owner, member, supplementary, other = (
        Peer(OWNER, 9),
        Peer(7, GROUP),
        Peer(7, 9, frozenset({GROUP})),
        Peer(7, 9),
    )
    assert allowed(rule, owner) == set(Operation)
    assert allowed(rule, member) == allowed(rule, supplementary) == set(READS)
    assert allowed(rule, other) == set()
    assert allowed(rule, Peer(0, 0)) == set(Operation)  # root


def test_the_class_decides_not_the_most_generous_bits():
    """As in the kernel: the owner gets the owner's bits even when the others' are wider,
    a member the group's."""
    rule = AccessRule(uid=OWNER, gid=GROUP, mode=0o057)
    assert allowed(rule, Peer(OWNER, GROUP)) == set()
    assert allowed(rule, Peer(7, GROUP)) == set(READS)
    assert allowed(rule, Peer(7, 9)) == set(Operation)


def test_every_operation_needs_search_on_the_directories():
    for mode in (0o600, 0o400, 0o200):
        assert allowed(AccessRule(uid=OWNER, gid=GROUP, mode=mode), Peer(OWNER, GROUP)) == set()
    assert allowed(AccessRule(uid=OWNER, gid=GROUP, mode=0o300), Peer(OWNER, 9)) == set(CHANGES)
    assert allowed(AccessRule(uid=OWNER, gid=GROUP, mode=0o500), Peer(OWNER, 9)) == set(READS)


def test_no_rule_is_the_mounts_defaults():
    assert allowed(None, Peer(7, 9)) == set(Operation)  # the kernel checks the mount's own modes


def test_check_says_who_what_where_and_what_to_do():
    rule = AccessRule(uid=OWNER, gid=GROUP, mode=0o700)
    check(Peer(OWNER, GROUP), rule, Operation.PIN, namespace="tenant-a")
    with pytest.raises(AccessDenied) as info:
        check(Peer(7, 9), rule, Operation.READ, namespace="tenant-a")
    assert str(info.value) == (
        "uid 7 may not read in namespace 'tenant-a' (owner uid 1001, group 2001, mode 0700); "
        "ask its owner to add you to its group, or use a namespace of your own"
    )
    assert isinstance(info.value, PermissionError)


def test_the_arena_is_mapped_only_by_who_may_read_every_namespace():
    a = AccessRule(uid=1, gid=10, mode=0o750)
    b = AccessRule(uid=2, gid=20, mode=0o700)
    assert may_map_arena(Peer(0, 0), [a, b])
    assert not may_map_arena(Peer(1, 10), [a, b])  # a's owner may not read b: copies for it
    assert may_map_arena(Peer(2, 20, frozenset({10})), [a, b])  # b's owner, in a's group
    assert may_map_arena(Peer(5, 5), [])  # no rules: every block is readable by everyone anyway


def test_modes_the_mount_reports():
    rule = AccessRule(uid=OWNER, gid=GROUP, mode=0o751)
    assert mode_of(rule, is_dir=True) == 0o040751
    assert mode_of(rule, is_dir=False) == 0o100640  # no execute bits on blocks


@pytest.mark.parametrize(("text", "mode"), [("0750", 0o750), ("750", 0o750), ("0o700", 0o700), (0o755, 0o755)])
def test_parse_mode(text, mode):
    assert parse_mode(text) == mode


@pytest.mark.parametrize("bad", ["rwx", "0999", "", 0o1777, -1, True])
def test_parse_mode_refuses(bad):
    with pytest.raises(ValueError, match="mode"):
        parse_mode(bad)


def test_a_rule_with_a_bad_mode_is_refused():
    with pytest.raises(ValueError, match="not a permission mode"):
        AccessRule(uid=1, gid=1, mode=0o4755)


def test_peer_of_this_process():
    me = Peer.of_process(os.getpid(), os.getuid(), os.getgid())
    assert me.uid == os.getuid() and me.groups == frozenset(os.getgroups())
    gone = Peer.of_process(2**22 + 12345, 5, 6)  # no such process: no supplementary groups
    assert gone.groups == frozenset()


@pytest.fixture
def second_user():
    if os.geteuid() != 0 or shutil.which("useradd") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root, useradd and /usr/bin/python3 to connect as a second real user")
    name = f"kvfsp{uuid.uuid4().hex[:6]}"
    res = account("useradd", "--no-create-home", "--shell", "/bin/false", "--user-group", "-G", "daemon", name)
    if res.returncode != 0:
        pytest.skip(f"useradd failed: {res.stderr.strip()}")
    yield pwd.getpwnam(name)
    account("userdel", name)
    account("groupdel", name)


def test_peer_credentials_from_a_socket_a_second_user_connected(second_user):
    """What the client server will call (issue 12): the kernel's record of who connected."""
    d = tempfile.mkdtemp(prefix="kvfs-peer-", dir="/tmp")
    os.chmod(d, 0o755)
    path = os.path.join(d, "s")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(path)
        os.chmod(path, 0o777)
        srv.listen(1)
        srv.settimeout(30)
        client = subprocess.Popen(
            [
                "/usr/bin/python3",
                "-c",
                "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)",
                path,
            ],
            user=second_user.pw_uid,
            group=second_user.pw_gid,
            extra_groups=[1],  # daemon
            cwd="/",
        )
        conn, _ = srv.accept()
        with conn:
            peer = Peer.of_socket(conn)
            conn.sendall(b"x")
        client.wait(30)
    finally:
        srv.close()
        shutil.rmtree(d, ignore_errors=True)
    assert (peer.uid, peer.gid, peer.pid) == (second_user.pw_uid, second_user.pw_gid, client.pid)
    assert 1 in peer.groups
    rule = AccessRule(uid=0, gid=1, mode=0o750)  # its supplementary group "daemon" lets it read
    assert decide(peer, rule, Operation.READ) and not decide(peer, rule, Operation.WRITE)


def test_the_store_answers_for_a_name(tmp_path):
    """What the client server asks: the rule over a name, and whether to hand out the arena."""
    from kvfs.config import DramConfig, NamespaceConfig
    from kvfs.store import Store
    from kvfs.tiers.dram import DramTier

    store = Store(
        [DramTier(DramConfig(name="dram", capacity=1 << 20, mlock=False, prefault=False))],
        namespaces=(NamespaceConfig(path="a", owner=OWNER, group=GROUP, mode=0o750), NamespaceConfig(path="b")),
    )
    try:
        store.check_access(Peer(OWNER, 1), "a/00/x", Operation.PIN)
        # b has no rule, elsewhere no namespace: the mount's default rule, its owner's 0755,
        # as the mount shows them: everyone reads, only the owner writes (issue 20, item 1)
        store.check_access(Peer(7, 9), "b/00/x", Operation.READ)
        store.check_access(Peer(7, 9), "elsewhere/x", Operation.READ)
        store.check_access(Peer(os.getuid(), os.getgid()), "elsewhere/x", Operation.WRITE)
        for name in ("b/00/x", "elsewhere/x"):
            for op in (Operation.WRITE, Operation.PIN, Operation.EVICT):
                with pytest.raises(AccessDenied, match=f"uid 7 may not {op.value} '{name}': it lies outside every"):
                    store.check_access(Peer(7, 9), name, op)
        with pytest.raises(AccessDenied, match="uid 7 may not list in namespace 'a'"):
            store.check_access(Peer(7, 9), "a", Operation.LIST)
        assert store.may_map_arena(Peer(0, 0)) and store.may_map_arena(Peer(7, GROUP))
        assert not store.may_map_arena(Peer(7, 9))
    finally:
        store.close()
