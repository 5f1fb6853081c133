"""Who may do what in a namespace: the one access decision, for the mount and the client socket.

A namespace may carry an :class:`AccessRule`: an owner uid, a group gid and a Unix mode.
Outside every namespace with a rule the mount's default rule decides: the mounting
user's, mode ``0755`` (everyone lists and reads, the owner alone writes, pins and
evicts; :attr:`kvfs.namespaces.Namespaces.default`). Every name has exactly one rule
(:meth:`kvfs.namespaces.Namespaces.rule`), and every decision is
``Store.check_access(peer, name, op)`` over it, whoever asks.

The rule is enforced in two places that must agree, so both use this module:

- the FUSE mount (``allow_other`` + ``default_permissions``): the kernel checks every
  request against the attributes the mount reports, and the mount reports a namespace's
  directories with the rule's owner, group and *mode*, its blocks with the same owner
  and group and ``mode & 0o666`` (:func:`mode_of`). The kernel's checks then are exactly
  :func:`decide`'s, operation by operation (tests/store/test_access.py checks every mode);
  The mount also asks ``Store.check_access`` itself before it creates, replaces, removes,
  renames, lists or pins (so the decision is kvfs's own even where the kernel does not
  check, and the same as the socket's);
- the client socket: the server reads the peer's credentials (:meth:`Peer.of_socket`,
  ``SO_PEERCRED`` and ``SO_PEERGROUPS``) and asks ``Store.check_access`` before it
  lists, reads, writes, evicts or pins anything — inside a namespace or not.

Operations and the bits they need (every block lives in a sharded directory,
``<namespace>/<ab>/<hash>``, so each needs search, ``x``, on the namespace's directories):

=========  ================================================  =====
operation  what                                              bits
=========  ================================================  =====
list       the names of the namespace's blocks               r, x
read       a block's bytes or its kvfs attributes            r, x
write      create or replace a block, make a directory       w, x
evict      drop copies of a block                            w, x
pin        pin or unpin a block (``user.kvfs.pinned``)       w, x
=========  ================================================  =====

The owner's bits apply to the owner, the group's to members of the group (primary or
supplementary), the others' to everyone else, as in the kernel; uid 0 may do everything.

**The DRAM arena.** The arena is one shared-memory file holding every namespace's
blocks, so a client that maps it can read all of them. :func:`may_map_arena` allows the
mapping only to a peer that may read every namespace with a rule (root, the daemon's
user, an engine trusted with every tenant); any other peer's reads go through a copy
into a buffer of its own (``Store.read_into``), and its writes are copied in from its
buffer (``Store.put``). Per-tenant arenas were rejected: they split DRAM into fixed
shares (a quota is a cap that other tenants' blocks may use below it), and each would
be one more file to lock, size and pin. docs/tenants.md, "Access".
"""

from __future__ import annotations

import enum
import socket
import stat as stat_mod
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .errors import AccessDenied

__all__ = [
    "AccessRule",
    "Operation",
    "Peer",
    "check",
    "decide",
    "may_map_arena",
    "mode_of",
    "parse_mode",
]

_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13; Python does not export it everywhere
_GROUPS_BUF = 1024  # the most getsockopt reads: 256 groups (more: /proc/<pid>/status)


class Operation(enum.Enum):
    """What a peer asks to do to the blocks of a namespace."""

    LIST = "list"
    READ = "read"
    WRITE = "write"
    EVICT = "evict"
    PIN = "pin"


# operation -> the permission bit it needs besides search (x), in the "other" position
_NEEDS: dict[Operation, int] = {
    Operation.LIST: 0o4,
    Operation.READ: 0o4,
    Operation.WRITE: 0o2,
    Operation.EVICT: 0o2,
    Operation.PIN: 0o2,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class AccessRule:
    """The owner, group and mode of a namespace (``mode``: permission bits, ``0o750``)."""

    uid: int
    gid: int
    mode: int = 0o750

    def __post_init__(self) -> None:
        if not 0 <= self.mode <= 0o777:
            raise ValueError(f"mode {self.mode:#o} is not a permission mode (0 to 0777)")

    def describe(self) -> str:
        return f"owner uid {self.uid}, group {self.gid}, mode {self.mode:04o}"


@dataclass(frozen=True, slots=True)
class Peer:
    """Who asks: a process's uid, primary gid and supplementary groups."""

    uid: int
    gid: int
    groups: frozenset[int] = frozenset()
    pid: int | None = None

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups

    @classmethod
    def of_socket(cls, sock: socket.socket) -> Peer:
        """The credentials of the process at the other end of the connected Unix socket
        *sock*, as the kernel recorded them when it connected (``SO_PEERCRED``) with its
        supplementary groups (``SO_PEERGROUPS``; from ``/proc/<pid>/status`` where the
        kernel lacks it or the peer has more than 256)."""
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", raw)
        try:
            buf = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, _GROUPS_BUF)
        except OSError:
            return cls(uid, gid, _proc_groups(pid), pid)
        n = len(buf) // 4
        return cls(uid, gid, frozenset(struct.unpack(f"{n}I", buf[: 4 * n])), pid)

    @classmethod
    def of_process(cls, pid: int, uid: int, gid: int) -> Peer:
        """A peer known by its pid, uid and gid (a FUSE request's context), its
        supplementary groups read from ``/proc/<pid>/status`` (none if it is gone)."""
        return cls(uid, gid, _proc_groups(pid), pid)


def _proc_groups(pid: int) -> frozenset[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()


def _bits(uid: int, in_group: Callable[[int], bool], rule: AccessRule) -> int:
    """The rule's permission bits that apply to *uid* (owner, else group, else other)."""
    if uid == rule.uid:
        return (rule.mode >> 6) & 0o7
    if in_group(rule.gid):
        return (rule.mode >> 3) & 0o7
    return rule.mode & 0o7


def decide(peer: Peer, rule: AccessRule | None, op: Operation) -> bool:
    """True when *peer* may do *op* in a namespace with *rule* (``None``: allowed; callers
    pass the mount's default rule for names outside every namespace with one,
    :meth:`kvfs.namespaces.Namespaces.rule`)."""
    if rule is None or peer.uid == 0:
        return True
    bits = _bits(peer.uid, peer.in_group, rule)
    need = _NEEDS[op] | 0o1
    return bits & need == need


def check(peer: Peer, rule: AccessRule | None, op: Operation, *, namespace: str | None, name: str = "") -> None:
    """Raise :class:`AccessDenied` unless *peer* may do *op* in *namespace* (see
    :func:`decide`). ``namespace=None``: *name* lies outside every namespace with a rule,
    where *rule* is the mount's default (its owner's, ``0755``)."""
    if decide(peer, rule, op):
        return
    assert rule is not None
    if namespace is None:
        raise AccessDenied(
            f"uid {peer.uid} may not {op.value} {name or '/'!r}: it lies outside every namespace with an access "
            f"rule, where the mount's owner (uid {rule.uid}) alone may write, pin or evict ({rule.describe()}); "
            "use a namespace whose rule lets you, or run it as the mount's owner"
        )
    raise AccessDenied(
        f"uid {peer.uid} may not {op.value} in namespace {namespace!r} ({rule.describe()}); "
        "ask its owner to add you to its group, or use a namespace of your own"
    )


def may_map_arena(peer: Peer, rules: Iterable[AccessRule]) -> bool:
    """Whether *peer* may map the whole DRAM arena: only when it may read every namespace
    that has a rule (the arena holds them all). Others read through copies."""
    return all(decide(peer, r, Operation.READ) for r in rules)


def mode_of(rule: AccessRule, *, is_dir: bool) -> int:
    """``st_mode`` the mount reports under a namespace with *rule*: directories with the
    rule's mode, blocks with its read and write bits (blocks are never executable)."""
    if is_dir:
        return stat_mod.S_IFDIR | rule.mode
    return stat_mod.S_IFREG | (rule.mode & 0o666)


def parse_mode(value: int | str) -> int:
    """A permission mode from config or a flag: an int (TOML ``0o750``) or an octal string
    (``"750"``, ``"0750"``, ``"0o750"``). Raises ``ValueError`` saying what is wrong."""
    if isinstance(value, bool):
        raise ValueError('expected a permission mode like 0o750 or "0750"')
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("0o")
        if not text or any(c not in "01234567" for c in text):
            raise ValueError(f'{value!r} is not an octal permission mode like "0750"')
        value = int(text, 8)
    if not isinstance(value, int) or not 0 <= value <= 0o777:
        raise ValueError(f'{value!r} is not a permission mode from 0 to 0777 (write it as 0o750 or "0750")')
    return value
