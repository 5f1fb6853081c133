"""``kvfs.client.link.Link``: an engine plug-in's session across the daemon going away.
A stopped daemon fails the call in flight after the client's timeout; every call after
that fails at once (the session was dropped, not waited on again), until the link
connects again after ``reconnect_s`` -- and then the blocks are there."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from kvfs.client import Client
from kvfs.client.link import Link
from kvfs.mount.paths import pid_path
from kvfs.protocol import DaemonNotAnswering
from kvfs.runtime import control_socket_path

from support.deadlines import wait_for

REPLY_S = 3
"""The client's reply timeout: what a stopped daemon is declared not answering after. Long
enough that the calls to the running daemon (the first put, the lookup once it is resumed)
get their answer on a loaded machine, which 1 s was not always; the stopped calls wait it
out (twice)."""


def test_a_stopped_daemon_is_dropped_once_and_found_again(kvfs_mount, caplog):
    mp = kvfs_mount(dram="8MiB", disk="32MiB")
    pid = int(pid_path(mp).read_text())
    sock = control_socket_path(mp)  # before the stop: a path lookup on the stopped mount would hang
    link = Link(lambda where: Client(where, write=True, timeout=REPLY_S), str(mp), reconnect_s=0.5, what="test plug-in")
    link.open()
    link.call(lambda c: c.put(["l/a"], [b"x" * 4096]))
    assert not link.down and link.lost == 0
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(DaemonNotAnswering, match=f"no reply within {REPLY_S} s"):
            link.call(lambda c: c.lookup(["l/a"]))
        assert link.lost == 1 and link.down
        # dropped: the next call does not wait on the daemon again
        with pytest.raises(DaemonNotAnswering, match="test plug-in: the kvfs daemon is not answering"):
            link.call(lambda c: c.lookup(["l/a"]))
        # once reconnect_s passed, a call tries again -- through the daemon's socket, not the
        # mountpoint, whose stat would hang on the stopped daemon: it times out, it does not hang
        wait_for(lambda: not link.down, timeout=30)
        refused = pytest.raises(DaemonNotAnswering, match="test plug-in: the kvfs daemon is not answering")
        with caplog.at_level(logging.WARNING, logger="kvfs.client"), refused:
            link.call(lambda c: c.lookup(["l/a"]))
        assert f"the kvfs daemon of {sock} is not answering (no reply within {REPLY_S} s" in caplog.text
        assert link.down
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: not link.down, timeout=30)
    assert link.call(lambda c: c.lookup(["l/a"])).prefix == 1  # connected again, the block is there
    assert link.lost == 1
    link.close()
    with pytest.raises(DaemonNotAnswering):  # closed for good
        link.call(lambda c: c.lookup(["l/a"]))
