"""mount/workers.py: a hung tier's worker limit, full, holds no DRAM-only metadata and no
other kind of the daemon's work (docs/mount-internals.md, "Threads").

A posix tier whose ``stat`` is held on a ``threading.Event`` stands for a hung NFS
server: lookups of names this node does not know ask it (in threads under its limiter)
and stay there. Meanwhile a lookup of a DRAM-only block, and a call of each other kind of
work, must complete. Everything waits on conditions with generous deadlines."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from kvfs.config import DramConfig, PolicyConfig, PosixConfig
from kvfs.names import TierName
from kvfs.store import Store
from kvfs.tiers.dram import DramTier
from kvfs.tiers.posix import PosixTier

pytest.importorskip("pyfuse3")  # kvfs.mount's extra

from kvfs.mount.workers import Workers

DEADLINE = 120.0  # seconds: only a failure waits this long


class HeldPosix(PosixTier):
    """A posix tier whose stats, once :attr:`armed`, wait for :attr:`release` (a hung
    server); :attr:`on_full` runs when :attr:`limit` of them are held at once."""

    def __init__(self, config: PosixConfig) -> None:
        super().__init__(config)
        self.armed = False
        self.release = threading.Event()
        self.limit = 0
        self.on_full = lambda: None
        self._lock = threading.Lock()
        self.held = 0

    def stat(self, name: str):  # type: ignore[no-untyped-def]
        if self.armed:
            with self._lock:
                self.held += 1
                if self.held == self.limit:
                    self.on_full()
            try:
                self.release.wait(DEADLINE)
            finally:
                with self._lock:
                    self.held -= 1
        return super().stat(name)


@pytest.fixture
def store(tmp_path):
    nfs = HeldPosix(PosixConfig(name=TierName("nfs"), capacity=1 << 30, path=tmp_path / "nfs", concurrency=2))
    dram = DramTier(DramConfig(name=TierName("dram"), capacity=16 << 20, mlock=False, prefault=False))
    s = Store([dram, nfs], policy=PolicyConfig(eviction="lru"))
    yield s
    nfs.release.set()
    s.close()


def test_a_hung_tiers_full_limit_holds_no_dram_metadata_nor_other_work(store):
    nfs = store.tiers[1]
    assert isinstance(nfs, HeldPosix)
    store.put("local/a", b"x" * 4096)
    assert store.stat("local/a").tiers == ("dram",)  # written through to nfs later, by a background pass never run here

    async def main() -> None:
        workers = Workers(store)
        limiter = workers.limiter(1)
        full = trio.Event()
        token = trio.lowlevel.current_trio_token()
        nfs.limit = int(limiter.total_tokens)
        nfs.on_full = lambda: token.run_sync_soon(full.set)
        nfs.armed = True
        answers: list[object] = []

        async def ask(name: str) -> None:
            answers.append(await workers.meta(store.lookup, name))

        try:
            async with trio.open_nursery() as nursery:
                for i in range(nfs.limit + 1):  # one more than the tier's limit: it queues
                    nursery.start_soon(ask, f"remote/{i}")
                with trio.fail_after(DEADLINE):
                    await full.wait()
                await trio.testing.wait_all_tasks_blocked()
                assert limiter.borrowed_tokens == limiter.total_tokens == 2
                assert limiter.statistics().tasks_waiting == 1  # the third lookup waits for nfs's limit
                # DRAM-only metadata: answered (on the loop) while nfs holds its whole limit
                with trio.fail_after(DEADLINE):
                    st = await workers.meta(store.lookup, "local/a")
                assert st is not None and st.tiers == ("dram",)
                # so does every other kind of work, each under its own limiter
                for run in (
                    workers.cpu,
                    workers.client,
                    workers.control,
                    workers.kernel,
                    workers.background,
                    workers.events,
                ):
                    with trio.fail_after(DEADLINE):
                        assert (await run(store.stat, "local/a")).name == "local/a"
                with trio.fail_after(DEADLINE):  # the hottest tier's limiter is its own too
                    assert (await workers.tier(0, store.stat, "local/a")).name == "local/a"
                assert nfs.held == 2 and not answers  # all this while nfs still held both
                nfs.release.set()
            assert answers == [None] * 3  # released, the remote names were asked and are missing
        finally:
            nfs.release.set()

    trio.run(main)
