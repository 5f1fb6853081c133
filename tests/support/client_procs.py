"""Batch clients in other processes: :class:`Peer` drives ``client_peer.py`` (beside this
module) one command at a time, as another user where asked; the mount config they share."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

from kvfs.client.connection import Connection
from kvfs.protocol import Statistics
from kvfs.runtime import control_socket_path

from support.configs import dram_over_disk

PEER = Path(__file__).with_name("client_peer.py")
MiB = 1 << 20

CONFIG = dram_over_disk("{dram}", "256MiB", "{data}/disk") + "{more}\n"
"""A DRAM tier of ``dram`` over a 256 MiB disk tier under ``data``, then ``more``."""


def blob(seed: int, size: int) -> bytes:
    """*size* bytes, the same for the same *seed* in every process."""
    return random.Random(seed).randbytes(size)


def sha(data) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


class Peer:
    """A client process (tests/support/client_peer.py), one command and one JSON answer at a time."""

    def __init__(self, where: Path | str, *args: str, become: tuple[int, ...] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        if become is not None:  # uid, gid, supplementary groups
            groups = ",".join(str(g) for g in become[2:])
            self.ok(f"become {become[0]} {become[1]} {groups}".rstrip())
        self.connected = self.do(" ".join(["connect", str(where), *args]))

    def do(self, line: str) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        assert out, f"the peer died on {line!r} (exit {self.proc.poll()})"
        return json.loads(out)

    def ok(self, line: str) -> dict:
        res = self.do(line)
        assert res["ok"], res
        return res

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.do("exit")
            except (AssertionError, BrokenPipeError):
                pass
            self.proc.wait(10)


def statistics(mp: Path):
    """The daemon's ``Statistics`` over the client socket of the mount at *mp*."""
    with Connection(control_socket_path(mp)) as c:
        return c.request(Statistics()).statistics
