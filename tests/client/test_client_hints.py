"""``client.hint``: an engine's or router's advice reaches the mount's eviction policies.

A real daemon with a DRAM tier of eight 2 MiB blocks over a disk tier, the default policy
(session-arc): a chain said to have ended leaves DRAM first under pressure, ahead of an
older chain that would otherwise go; a chain said to be read soon stays. Advice never
moves or removes a block by itself, unknown names are ignored, a bad ``when`` is refused,
and every block still reads back byte-exact.
"""

from __future__ import annotations

import random

import pytest

from kvfs.client import Client
from kvfs.errors import InvalidName
from kvfs.protocol import ProtocolError

MiB = 1 << 20


def blob(seed: int) -> bytes:
    return random.Random(seed).randbytes(2 * MiB)


def chain(tag: str) -> list[str]:
    return [f"{tag}/{i:02x}/{tag}{i}" for i in range(4)]


def put_chain(c: Client, tag: str, seed: int) -> None:
    names = chain(tag)
    c.put(names, [blob(seed + i) for i in range(4)], parents=[None, *names[:-1]])


def in_dram(c: Client, names: list[str]) -> list[bool]:
    return [b is not None and "dram" in b.tiers for b in c.lookup(names)]


@pytest.fixture
def mp(kvfs_mount):
    return kvfs_mount(dram="16MiB", disk="256MiB")


@pytest.mark.parametrize("advice", [None, "ended", "soon"])
def test_advice_decides_which_chain_leaves_dram(mp, advice):
    with Client(mp, write=True) as c:
        put_chain(c, "old", 0)
        put_chain(c, "new", 10)
        assert all(in_dram(c, chain("old") + chain("new")))
        # Without advice the older chain leaves first. "ended" on the newer one sends it
        # first instead; "soon" on the older one keeps it.
        if advice is not None:
            target = "new" if advice == "ended" else "old"
            assert c.hint(chain(target) + ["nowhere/00/x"], advice) == 4
        assert all(in_dram(c, chain("old") + chain("new")))  # advice alone moves nothing
        put_chain(c, "more", 20)
        leaves, stays = ("old", "new") if advice is None else ("new", "old")
        assert not any(in_dram(c, chain(leaves))), c.lookup(chain(leaves))
        assert all(in_dram(c, chain(stays))), c.lookup(chain(stays))
    for tag, seed in (("old", 0), ("new", 10), ("more", 20)):
        for i, name in enumerate(chain(tag)):
            assert (mp / name).read_bytes() == blob(seed + i)


def test_bad_advice_is_refused_and_changes_nothing(mp):
    with Client(mp, write=True) as c:
        put_chain(c, "a", 0)
        with pytest.raises(ProtocolError, match="'later' is not one of soon, ended"):
            c.hint(chain("a"), "later")
        with pytest.raises(InvalidName, match="'..' are not allowed"):
            c.hint(["../escape"], "soon")
        assert all(in_dram(c, chain("a")))
