"""Real second users for the tests that check access (root only): made with ``useradd``,
removed after the test, and scripts run as them."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from support.deadlines import DEADLINE

TENANT_PY = "/usr/bin/python3"  # an interpreter every user may run (the tests' own may be in /root)


def account(*argv: str) -> subprocess.CompletedProcess:
    """Run ``useradd``/``userdel``/``groupdel`` *argv*, again while another process holds
    the lock on /etc/passwd (tests in other workers, other suites on the machine make and
    remove users too); returns the last try."""
    deadline = time.monotonic() + DEADLINE
    while True:
        res = subprocess.run(list(argv), capture_output=True, text=True)
        busy = res.returncode != 0 and ("lock" in res.stderr.lower() or "try again" in res.stderr.lower())
        if not busy or time.monotonic() > deadline:
            return res
        time.sleep(0.1)


@pytest.fixture
def users():
    """Make local users for the test (root only): ``users("alice", "bob")`` returns
    ``{name: (uid, gid, user name)}``; ``groups={name: group}`` adds a supplementary group."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or not os.path.exists(TENANT_PY):
        pytest.skip("needs root, useradd and /usr/bin/python3 to play tenants as real users")
    made: list[str] = []

    def make(*names: str, groups: dict[str, str] | None = None) -> dict[str, tuple[int, int]]:
        out = {}
        for n in names:
            real = f"kvfs{n[:4]}{uuid.uuid4().hex[:6]}"
            cmd = ["useradd", "--no-create-home", "--shell", "/bin/false", "--user-group"]
            if groups and n in groups:
                cmd += ["-G", groups[n]]
            res = account(*cmd, real)
            if res.returncode != 0:
                pytest.skip(f"useradd failed: {res.stderr.strip()}")
            made.append(real)
            pw = pwd.getpwnam(real)
            out[n] = (pw.pw_uid, pw.pw_gid, real)
        return out

    yield make
    for real in made:
        account("userdel", real)
        account("groupdel", real)


@pytest.fixture
def public_mountpoint():
    """A mountpoint every user can reach (pytest's tmp_path is root's alone)."""
    d = tempfile.mkdtemp(prefix="kvfs-tenants-", dir="/tmp")
    os.chmod(d, 0o755)
    mp = Path(d) / "mnt"
    mp.mkdir()
    yield mp
    shutil.rmtree(d, ignore_errors=True)


def run_as(user: tuple[int, int, str], script: str, *args: str) -> dict:
    """Run *script* as the real *user* (with its supplementary groups); its JSON output."""
    uid, gid, name = user
    groups = [g.gr_gid for g in grp.getgrall() if name in g.gr_mem]
    res = subprocess.run(
        [TENANT_PY, "-c", script, *args],
        capture_output=True,
        text=True,
        user=uid,
        group=gid,
        extra_groups=groups,
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        timeout=DEADLINE,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)
