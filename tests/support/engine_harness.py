"""Real engine clients in the tests: each runs unchanged in its own virtualenv (built by
``.ci/engines``), as a subprocess, once on a kvfs mount and once on a plain local
directory, and the two runs must behave the same and leave the same bytes.

- ``kv_dirs`` (fixture): ``{"plain": <a local directory>, "kvfs": <a fresh kvfs mount>}``.
  Tests run the plain directory first and check what the engine did there (the reference,
  which also shows the harness works), then run kvfs and compare.
- :func:`need_client`: the client, or a skip saying how to build its virtualenv -- a
  failure instead when ``KVFS_REQUIRE_ENGINES=1`` (``.ci/run`` sets it: CI never skips
  these silently).
- :func:`run`: run a client script; a crash or a missing result line fails the test with
  the end of the client's output.
- :func:`assert_same`: the kvfs run's result equals the plain run's, key by key, with both
  values shown where they differ.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvfs.tools.engine_clients import (
    CLIENTS,
    Client,
    ClientFailed,
    ClientMissing,
    client_python,
    differences,
    run_client,
    without,
)

from support.deadlines import ENGINE_DEADLINE

__all__ = ["MOUNT", "REQUIRE", "assert_same", "kv_dirs", "need_client", "run", "without"]

REQUIRE = os.environ.get("KVFS_REQUIRE_ENGINES") == "1"

# Room for every client's files (LMCache's setups are the largest: ~16 MiB).
MOUNT = {"dram": "32MiB", "disk": "128MiB"}


def need_client(name: str) -> Client:
    client = CLIENTS[name]
    try:
        client_python(client)
    except ClientMissing as exc:
        if REQUIRE:
            pytest.fail(f"KVFS_REQUIRE_ENGINES=1 and {exc}", pytrace=False)
        pytest.skip(str(exc))
    return client


@pytest.fixture
def kv_dirs(kvfs_mount, tmp_path) -> dict[str, Path]:
    """A fresh kvfs mount (DRAM over disk) and a plain local directory, both empty."""
    plain = tmp_path / "plain"
    plain.mkdir()
    return {"plain": plain, "kvfs": kvfs_mount(**MOUNT)}


def run(client: Client | str, *args: str | Path, where: str, timeout: float = ENGINE_DEADLINE) -> dict:
    """``run_client`` for a test: *where* (``kvfs``/``plain``) names the run in a failure."""
    try:
        return run_client(client, *map(str, args), timeout=timeout)
    except ClientFailed as exc:
        pytest.fail(f"on the {where} directory: {exc}", pytrace=False)


def assert_same(kvfs: dict, plain: dict, what: str) -> None:
    """The kvfs run of *what* did exactly what the plain run did (same results, same files
    with the same bytes)."""
    diff = differences(kvfs, plain)
    if not diff:
        return
    lines = [f"{what}: the kvfs mount behaved differently from a plain directory"]
    for path in diff:
        a, b = _at(kvfs, path), _at(plain, path)
        lines.append(f"  {' / '.join(map(str, path)) or '(all)'}:\n    kvfs:  {_short(a)}\n    plain: {_short(b)}")
    pytest.fail("\n".join(lines), pytrace=False)


def _at(result: object, path: tuple) -> object:
    for part in path:
        if not isinstance(result, dict) or part not in result:
            return "<absent>"
        result = result[part]
    return result


def _short(value: object, limit: int = 1500) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + " ..."
