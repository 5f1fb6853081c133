"""Prefix ARC that knows conversations: dead tails first, hints, learned admission below.

The order is ``prefix-arc``'s (:mod:`kvfs.policies.prefix_arc`): ARC's T1 (blocks seen
once) and T2 (seen twice or more), the target size ``p`` adapted by ghost hits, and in
each list a block placed just older than its parent, so chains leave leaf first. On top
of it, what a KV cache knows about conversations:

- **A turn extends the deepest block.** A conversation's next request resends the
  conversation and continues it under the last *full* block of the previous one; the
  previous request's partial last block is then never read again. When a block gets a
  new child, its previous child, if it was never read and never got a child, is *dead*.
  Dead blocks are evicted before anything else. If dead blocks come back (more than
  one in eight, as in workloads that re-read old branches), the rule switches itself
  off for a while.
- **Hints** (:class:`~kvfs.policies.base.Hint`). ``SOON``: the named blocks are kept
  out of the eviction order until they are read or ``hint_ttl`` passes (then they go
  back into their list as if read when hinted); a dead one is revived. ``ENDED``: walking up from
  the deepest named block, every block whose last child is gone or dead and that is not
  a branch point (a shared prompt, a document) becomes dead; the walk stops at the
  first one that does not. ``SOON`` wins over ``ENDED``.
- **Admission** (:mod:`kvfs.policies.admission`) when this is a colder tier: the store
  asks :meth:`SessionARC.admit` before writing a block down; kinds of blocks that are
  almost never read here are refused, learned per namespace from this tier's own hits.

The tier's capacity ``c`` is not passed in: it is the most blocks held at once. Every
call is O(1) (amortized for ``victim`` when hints expire); no call reads the clock but
``hint`` and ``victim`` while ``SOON`` hints are pending.

Representation: one list object per resident block, ``[older, newer, key, list,
parent, last child, branching children]``, linked into one of four circular lists with
a sentinel each. A block's last child is the last one inserted under it while it was
resident (a child that arrives before its parent, as chains do in a colder tier, which
gets their leaves first, is remembered until the parent comes); a *branch point* is a
block two of whose children got children of their own while it was resident.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .admission import Admission
from .arc import remember_evicted
from .base import EvictionPolicy, Hint, PolicyContext

__all__ = ["SessionARC"]

# node fields
_OLDER, _NEWER, _KEY, _LIST, _PARENT, _LAST, _FAN = range(7)
# lists
_T1, _T2, _DEAD, _SOON = 1, 2, 3, 4

_REGRET_WINDOW = 256  # dead evictions between looks at how many came back


def _sentinel() -> list:
    s: list = [None, None, None, 0, None, None, 0]
    s[_OLDER] = s[_NEWER] = s
    return s


class SessionARC(EvictionPolicy):
    """``prefix-arc`` plus dead tails, ``SOON``/``ENDED`` hints and colder-tier admission.

    See the module docstring for the rules; ``victim`` order: dead blocks (oldest dead
    first), then ARC over T1/T2, then blocks held by a ``SOON`` hint.
    """

    name = "session-arc"
    takes_context = True

    def __init__(self, context: PolicyContext | None = None) -> None:
        ctx = context or PolicyContext()
        self._clock = ctx.clock
        self._ttl = ctx.hint_ttl
        # list ends by list number (0 is unused; a sentinel keeps the tuple one type)
        self._ends: tuple[list[Any], ...] = tuple(_sentinel() for _ in range(5))
        self._n = [0, 0, 0, 0, 0]  # blocks per list
        self._d: dict = {}  # key -> node
        self._waiting: OrderedDict = OrderedDict()  # absent parent -> its child that arrived first
        self._b1: OrderedDict = OrderedDict()
        self._b2: OrderedDict = OrderedDict()
        self._p = 0.0
        self._c = 0
        self._pending = None
        self._soon: dict = {}  # key held by SOON -> (deadline, the list it goes back to)
        self._supersede = True
        self._dead_gone: OrderedDict = OrderedDict()  # dead blocks evicted lately
        self._dead_evicted = 0
        self._dead_back = 0
        self._off_until = 0  # inserts left before superseding is tried again
        self._admission = Admission(
            threshold=ctx.admit_threshold, capacity=self._capacity, namespace_of=ctx.namespace_of
        )
        self._adm_pending = self._admission._pending

    def _capacity(self) -> int:
        return self._c

    # -- list primitives -------------------------------------------------------------

    def _link(self, node: list, lst: int, anchor: list | None = None) -> None:
        """Put *node* into *lst*: just older than *anchor* if it is in *lst*, else newest."""
        a = anchor if anchor is not None and anchor[_LIST] == lst else self._ends[lst]
        older = a[_OLDER]
        node[_OLDER] = older
        node[_NEWER] = a
        older[_NEWER] = node
        a[_OLDER] = node
        node[_LIST] = lst
        self._n[lst] += 1

    def _unlink(self, node: list) -> None:
        older, newer = node[_OLDER], node[_NEWER]
        older[_NEWER] = newer
        newer[_OLDER] = older
        self._n[node[_LIST]] -= 1

    def _kill(self, node: list) -> None:
        self._unlink(node)
        self._link(node, _DEAD)

    def _revive(self, node: list, lst: int) -> None:
        self._unlink(node)
        parent = node[_PARENT]
        self._link(node, lst, self._d.get(parent) if parent is not None else None)

    def _has_live_child(self, node: list) -> bool:
        last = node[_LAST]
        if last is None:
            return False
        child = self._d.get(last)
        return child is not None and child[_LIST] != _DEAD

    # -- the interface -----------------------------------------------------------------

    def insert(self, key, size: int = 0, parent=None) -> None:
        d = self._d
        if key in d:
            self.touch(key)
            return
        b1 = self._b1
        if key in b1:
            b2 = self._b2
            self._p = min(float(self._c), self._p + max(len(b2) / len(b1), 1.0))
            del b1[key]
            lst = _T2
        elif key in self._b2:
            b2 = self._b2
            self._p = max(0.0, self._p - max(len(b1) / len(b2), 1.0))
            del b2[key]
            lst = _T2
        else:
            lst = _T1
            if self._dead_gone and self._dead_gone.pop(key, 0) is None:
                self._dead_back += 1
        if parent == key:
            parent = None
        pn = d.get(parent) if parent is not None else None
        a = pn if pn is not None and pn[_LIST] == lst else self._ends[lst]
        older = a[_OLDER]  # link just older than the parent, or as the newest
        node = [older, a, key, lst, parent, None, 0]
        older[_NEWER] = node
        a[_OLDER] = node
        self._n[lst] += 1
        d[key] = node
        if self._waiting:
            first = self._waiting.pop(key, None)
            if first is not None:
                node[_LAST] = first  # a colder tier gets a chain's leaf before its parent
        if pn is None:
            if parent is not None:
                self._waiting[parent] = key
                if len(self._waiting) > max(64, self._c):
                    self._waiting.popitem(last=False)
        else:
            prev = pn[_LAST]
            pn[_LAST] = key
            if prev is None:
                gp = pn[_PARENT]
                gn = d.get(gp) if gp is not None else None
                if gn is not None:
                    gn[_FAN] += 1  # the parent got its first child: it is a branch of gp
            elif self._supersede and prev != key:
                s = d.get(prev)
                if s is not None and s[_LIST] == _T1 and s[_LAST] is None:
                    self._kill(s)  # never read, never extended: the previous turn's partial last block
        self._c = max(self._c, len(d))
        if self._off_until and not self._supersede:
            self._off_until -= 1
            if not self._off_until:
                self._supersede = True

    def touch(self, key) -> None:
        d = self._d
        node = d.get(key)
        if node is None:
            return
        if self._adm_pending and key in self._adm_pending:
            self._admission.hit(key)
        lst = node[_LIST]
        if lst == _DEAD:
            self._revive(node, _T2)
            return
        if lst == _SOON:
            del self._soon[key]
        n = self._n
        older, newer = node[_OLDER], node[_NEWER]  # unlink
        older[_NEWER] = newer
        newer[_OLDER] = older
        n[lst] -= 1
        parent = node[_PARENT]
        a = d.get(parent) if parent is not None else None
        if a is None or a[_LIST] != _T2:
            a = self._ends[_T2]
        older = a[_OLDER]  # link just older than the anchor
        node[_OLDER] = older
        node[_NEWER] = a
        older[_NEWER] = node
        a[_OLDER] = node
        node[_LIST] = _T2
        n[_T2] += 1

    def remove(self, key) -> None:
        d = self._d
        node = d.pop(key, None)
        if node is None:
            return
        if self._adm_pending and key in self._adm_pending:
            self._admission.left(key)
        lst = node[_LIST]
        older, newer = node[_OLDER], node[_NEWER]  # unlink
        older[_NEWER] = newer
        newer[_OLDER] = older
        n = self._n
        n[lst] -= 1
        if lst == _SOON:
            del self._soon[key]
        if self._pending is not None and self._pending == key:
            self._pending = None
            if lst == _T1:
                remember_evicted(self._b1, key, self._b1, self._b2, n[_T1], n[_T2], self._c)
            elif lst == _T2:
                remember_evicted(self._b2, key, self._b1, self._b2, n[_T1], n[_T2], self._c)
            elif lst == _DEAD:
                self._dead_evicted_one(key)

    def _dead_evicted_one(self, key) -> None:
        gone = self._dead_gone
        gone[key] = None
        while len(gone) > max(16, self._c // 4):
            gone.popitem(last=False)
        self._dead_evicted += 1
        if self._dead_evicted >= _REGRET_WINDOW:
            if self._dead_back * 8 > self._dead_evicted and self._supersede:
                self._supersede = False  # dead blocks come back: this workload re-reads old branches
                self._off_until = max(1024, 4 * self._c)
            self._dead_evicted = self._dead_back = 0

    def victim(self):
        n = self._n
        if n[_DEAD]:
            key = self._ends[_DEAD][_NEWER][_KEY]
        else:
            if n[_SOON]:
                self._expire()
            n1 = n[_T1]
            if n1 and (n1 > self._p or not n[_T2]):
                key = self._ends[_T1][_NEWER][_KEY]
            elif n[_T2]:
                key = self._ends[_T2][_NEWER][_KEY]
            elif n[_SOON]:
                key = self._ends[_SOON][_NEWER][_KEY]
            else:
                return None
        self._pending = key
        return key

    def _expire(self) -> None:
        """Hand blocks whose ``SOON`` hint ran out back to their list, as if read when hinted.

        Not to its old end: a tier whose copy was not read may simply not have served the
        read (a hotter copy did), which says nothing against the block."""
        now = self._clock()
        end = self._ends[_SOON]
        d = self._d
        while self._n[_SOON]:
            node = end[_NEWER]
            deadline, home = self._soon[node[_KEY]]
            if deadline > now:
                return
            del self._soon[node[_KEY]]
            self._unlink(node)
            parent = node[_PARENT]
            self._link(node, home, d.get(parent) if parent is not None else None)

    def hint(self, keys, when: Hint) -> None:
        d = self._d
        if when is Hint.SOON:
            deadline = self._clock() + self._ttl
            for k in keys:
                node = d.get(k)
                if node is None:
                    continue
                lst = node[_LIST]
                if lst == _SOON:
                    home = self._soon[k][1]
                elif lst == _DEAD:
                    self._revive(node, _T1)
                    home = _T1
                else:
                    home = lst
                self._unlink(node)
                if self._ttl > 0:
                    self._link(node, _SOON)
                    self._soon[k] = (deadline, home)
                else:
                    parent = node[_PARENT]
                    self._link(node, home, d.get(parent) if parent is not None else None)
        elif when is Hint.ENDED:
            keys = list(keys)
            self._admission.ended(keys, d.__contains__)
            for k in reversed(keys):
                node = d.get(k)
                if node is None or node[_LIST] == _DEAD:
                    continue
                if node[_LIST] == _SOON or node[_FAN] >= 2 or self._has_live_child(node):
                    break  # still wanted, or shared by other sessions
                self._kill(node)

    def admit(self, key, parent=None, *, hits: int = 0, idle: float | None = None) -> bool:
        return self._admission.offer(key, parent, hits, idle)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key) -> bool:
        return key in self._d
