"""The batch client shared by threads, as an engine's prefetch and backup threads share
one: reads (whose releases are sent without waiting) beside puts (whose commits are
pipelined) on one connection, every reply matched to its request, every byte right."""

from __future__ import annotations

import threading

from kvfs.client import Client

KiB = 1 << 10


def _blob(seed: int, n: int) -> bytes:
    return bytes((seed * 31 + i) % 251 for i in range(256)) * (n // 256)


def test_gets_and_puts_from_two_threads_on_one_client(kvfs_mount):
    mp = kvfs_mount(dram="32MiB", disk="64MiB")
    errors: list[BaseException] = []
    with Client(mp, write=True) as c:
        names = [f"t/base/{i}" for i in range(8)]
        c.put(names, [_blob(i, 64 * KiB) for i in range(8)])
        good = []

        def reader() -> None:
            try:
                for _ in range(200):
                    bufs = [bytearray(64 * KiB) for _ in names]
                    assert c.get_into(names, bufs) == [64 * KiB] * 8
                    good.append(all(bytes(b) == _blob(i, 64 * KiB) for i, b in enumerate(bufs)))
            except BaseException as exc:
                errors.append(exc)

        def writer() -> None:
            try:
                for r in range(200):
                    c.put([f"t/new/{r}/{i}" for i in range(4)], [_blob(100 + i, 64 * KiB) for i in range(4)])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert good == [True] * 200
        assert c.lookup([f"t/new/{r}/{i}" for r in range(200) for i in range(4)]).prefix == 800
