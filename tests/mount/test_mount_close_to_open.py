"""Close-to-open on a real mount without a timed wait (docs/SEMANTICS.md, "Close-to-open,
precisely"; docs/mount-internals.md, "Close-to-open").

A reader that opens a name after its writer's last ``close`` returned gets the new block,
however long the seal takes: the kernel queues the RELEASE before ``close`` returns, the
daemon reads requests in order and marks the version sealing before the RELEASE handler's
first await. Seals are held here by ``support/gated_seal.py`` until the test lets them
finish, so a reader read before the seal ends is certain to be waiting on it. A reader
after a duplicate's close (the original descriptor still open) is answered at once with
what the name held before, even with ``release_wait`` at ten minutes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from support import SUPPORT_DIR
from support.deadlines import DEADLINE
from support.files import blob
from support.mounts import TRANSPORTS

pytestmark = [pytest.mark.fuse, TRANSPORTS]

ROUNDS = 20
HOURS = json.dumps({"release_wait": 3600})  # a wait on a duplicate's close would hang the test


def readable(p: Path) -> bytes | None:
    try:
        with open(p, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


class Reader(threading.Thread):
    """Opens and reads *path* once, in another thread (another task for the kernel)."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.got: bytes | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.got = readable(self.path)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def result(self) -> bytes | None:
        self.join(DEADLINE)
        assert not self.is_alive(), f"the reader of {self.path} did not return within {DEADLINE:.0f}s"
        if self.error is not None:
            raise self.error
        return self.got


def test_s07_a_reader_after_the_last_close_sees_the_new_block_while_its_seal_is_held(kvfs_mount, tmp_path):
    """Each round rewrites one name and closes it; a reader in another thread opens it
    right after ``close`` returned, while the daemon's seal of that close is held (the
    first round: a name that did not exist). The reader is still waiting when the seal is
    let go, and gets this round's bytes, never the last round's or ENOENT."""
    gate = tmp_path / "gate"
    gate.mkdir()
    mp = kvfs_mount(
        dram="32MiB",
        disk="64MiB",
        foreground=True,
        env={"KVFS_FUSE_OPTIONS": HOURS},
        launcher=(sys.executable, str(SUPPORT_DIR / "gated_seal.py"), str(gate)),
    )
    path = mp / "f"
    for n in range(1, ROUNDS + 1):
        data = blob(64 * 1024 + n, n)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        os.write(fd, data)
        os.close(fd)  # the last close: its RELEASE is queued before this returns
        reader = Reader(path)
        reader.start()
        # a correct daemon holds the reader until the seal ends, so it cannot be done yet
        # (however the machine schedules it: this wait passes or fails the same way)
        reader.join(0.05)
        assert reader.is_alive(), f"round {n}: the reader returned while the seal of the close before it was held"
        (gate / str(n)).touch()  # let seal n finish
        got = reader.result()
        assert got is not None, f"round {n}: ENOENT after the writer's close returned"
        assert got == data, f"round {n}: the reader got {len(got)} bytes of another version"


def test_s07_a_reader_after_a_duplicates_close_is_answered_at_once(kvfs_mount):
    """A duplicate's close while the original descriptor stays open (idle) is not a last
    close: its RELEASE never comes. A reader opening the name then gets what the name held
    before (ENOENT for a new file, the old block for a rewrite) without waiting for one,
    here with ``release_wait`` at an hour; the last close then publishes every byte."""
    mp = kvfs_mount(dram="32MiB", disk="64MiB", env={"KVFS_FUSE_OPTIONS": HOURS})
    new, old = mp / "new", mp / "old"
    old.write_bytes(blob(4096, 1))
    for path, before in ((new, None), (old, blob(4096, 1))):
        first, second = blob(100_000, 2), blob(50_000, 3)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            os.write(fd, first)
            os.close(os.dup(fd))  # a FLUSH, no RELEASE: the file is still open
            reader = Reader(path)
            reader.start()
            assert reader.result() == before, f"{path.name}: a reader saw the file before its last close"
            os.write(fd, second)
        finally:
            os.close(fd)
        reader = Reader(path)
        reader.start()
        assert reader.result() == first + second
