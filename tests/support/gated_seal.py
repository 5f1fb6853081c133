"""``kvfs`` with every seal held until the test lets it finish: a script the tests run.

Run as ``python gated_seal.py GATE_DIR kvfs-args...`` (e.g. ``mount MP --config C
--foreground``). The daemon's *n*-th seal (counted from 1) stops inside its store call —
after the RELEASE marked the version sealing, before the block is published — until the
file ``GATE_DIR/<n>`` exists. A test thus holds a seal open as long as it likes, with no
timing: whatever reads the name meanwhile must wait for that seal (close-to-open).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import trio

from kvfs.mount.storecalls import StoreCalls
from kvfs.tools.cli import main


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.005)


def _gate(directory: str) -> None:
    put = StoreCalls.put
    seals = 0

    async def gated_put(self: StoreCalls, name: str, data: Any, parent: Any, promise: Any = None) -> Any:
        nonlocal seals
        seals += 1
        await trio.to_thread.run_sync(_wait_for, os.path.join(directory, str(seals)))
        return await put(self, name, data, parent, promise)

    StoreCalls.put = gated_put  # type: ignore[method-assign]


if __name__ == "__main__":
    _gate(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
