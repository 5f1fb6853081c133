"""The ``kvfs`` command, run with this interpreter in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support.deadlines import DEADLINE

KVFS = [sys.executable, "-m", "kvfs.tools.cli"]


def run_kvfs(
    *args: str, timeout: float = DEADLINE, env: dict | None = None, check: bool = False
) -> subprocess.CompletedProcess:
    """Run ``kvfs ARGS…`` with this interpreter; returns the completed process (text)."""
    return subprocess.run(
        [*KVFS, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
        check=check,
    )


def kvfs(capsys, *argv: str) -> tuple[int, str, str]:
    """``kvfs ARGV…`` in this process (``kvfs.tools.cli.main``): exit code, stdout, stderr."""
    from kvfs.tools.cli import main  # the CLI and all it imports, only for the tests that run it

    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def kvfs_json(capsys, *argv: str):
    """``kvfs ARGV… --json`` in this process, which must succeed: its parsed output."""
    rc, out, err = kvfs(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)
