"""Two kvfs mounts on this machine as two nodes sharing a posix directory and a bucket on
moto's S3 server (the ``two_mounts`` fixture; import ``moto`` from support.s3server beside
it), and what their tests write and wait for."""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path

import pytest
import xxhash

from support.configs import dram_over_disk
from support.deadlines import DEADLINE
from support.s3server import FAKE_ENV

NEGATIVE_TTL = 0.5


def config(root: Path, bucket: str, endpoint: str, *, posix: Path | None) -> str:
    """Node *root*'s config: DRAM over its own disk, then the shared posix directory
    (unless None) and the shared bucket."""
    text = dram_over_disk("8MiB", "32MiB", str(root / "disk"))
    if posix is not None:
        text += f"""
[[tiers]]
kind = "posix"
capacity = "256MiB"
path = "{posix}"
timeout = "20s"
"""
    text += f"""
[[tiers]]
kind = "s3"
bucket = "{bucket}"
prefix = "kv"
endpoint_url = "{endpoint}"
timeout = "10s"
max_attempts = 2

[mount]
negative_ttl = "{NEGATIVE_TTL}s"
listing_ttl = "1s"
"""
    return text


@pytest.fixture
def two_mounts(kvfs_mount, moto, tmp_path, request):
    """Two mounts sharing a bucket and (unless parametrized False) a posix directory."""
    posix = getattr(request, "param", True)
    bucket = f"kvfs-{uuid.uuid4().hex[:12]}"
    moto.client().create_bucket(Bucket=bucket)
    shared = tmp_path / "lustre" if posix else None
    mps = []
    for node in ("a", "b"):
        text = config(tmp_path / f"node-{node}", bucket, moto.endpoint_url, posix=shared)
        mps.append(kvfs_mount(text, env=dict(FAKE_ENV)))
    return mps


def content(name: str, size: int = 300_000) -> bytes:
    """Deterministic bytes per name, as for a content-addressed block."""
    return random.Random(xxhash.xxh3_64_intdigest(name.encode())).randbytes(size)


def publish(path: Path, data: bytes) -> None:
    """The engines' pattern: write a temp name in the same directory, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def check(ok: bool) -> None:
    """Raise, for :func:`wait_for` to try again, unless *ok*."""
    if not ok:
        raise AssertionError("not yet")


def wait_for(fn, timeout: float = DEADLINE, interval: float = 0.1):
    """*fn()*'s result once it raises no OSError or AssertionError (the other node's view
    catching up); its last error after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (OSError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)
