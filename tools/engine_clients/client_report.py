"""What every engine client script prints: the result line and the directory it left.

The client scripts in this folder run inside an engine's own virtualenv, where kvfs is not
installed; each is started by path, so this module is imported from the script's folder
(``sys.path[0]``). Only the standard library is used here.

A client prints any logs it likes and, last, one line ``KVFS-RESULT <json>`` with what it
did; ``kvfs.tools.engine_clients.run_client`` reads that line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RESULT_MARK = "KVFS-RESULT "


def emit(result: dict[str, Any]) -> None:
    """Print the result line (the last thing a client prints)."""
    sys.stdout.flush()
    sys.stderr.flush()
    print(RESULT_MARK + json.dumps(result, sort_keys=True), flush=True)


def tree(root: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Every file under *root* (dot files, temp files included): relative path -> size and
    sha256 of the bytes read back now. A file that vanishes while listed is left out."""
    out: dict[str, dict[str, Any]] = {}
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            h = hashlib.sha256()
            try:
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
            except FileNotFoundError:
                continue
            out[str(p.relative_to(root))] = {"size": p.stat().st_size, "sha256": h.hexdigest()}
    return out


def describe_error(exc: BaseException) -> str:
    """An exception as a stable string: type, errno name and message (no addresses)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"{type(exc).__name__}[{errno.errorcode.get(exc.errno, exc.errno)}]: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


def step(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> Any:
    """Run one step of a client; its value (or the error it raised, described) goes into
    ``results[name]``. Returns the value, or None after an error."""
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001  (the error is the result: the caller compares it)
        results[name] = {"error": describe_error(exc)}
        return None
    results[name] = value
    return value


@contextmanager
def timed(times: dict[str, Any], name: str) -> Iterator[None]:
    """Adds the wall seconds of the block to ``times[name]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        times[name] = times.get(name, 0.0) + time.perf_counter() - t0
