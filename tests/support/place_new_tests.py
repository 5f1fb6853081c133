"""Moves test files written for the flat tests/ of before into their area's folder and
rewrites what they imported from conftest.py, the old harness paths and other test modules
to the support/ modules that hold those names now (tests/README.md, "Layout"); then points
every test path the docs, scripts and docstrings cite at the flat tests/ to where that file
is now (the check of tests/repo/test_repo_docs.py).

Run at the repository root: ``python tests/support/place_new_tests.py FILE...`` (files at
tests/ root; none: only the citations), then ``ruff check --fix tests && ruff format tests``
(import order). A name it does not know (a helper another test module defined) stops it
with a KeyError: move that helper to support/ first.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_layout", Path(__file__).resolve().parents[1] / "repo" / "test_layout.py"
)
assert _spec is not None and _spec.loader is not None
_layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_layout)
AREAS: dict[str, tuple[str, ...]] = _layout.AREAS

HOME = {
    "DEADLINE": "deadlines",
    "ENGINE_DEADLINE": "deadlines",
    "TIER_TIMEOUT": "deadlines",
    "HANG": "deadlines",
    "wait_for": "deadlines",
    "KVFS": "cli",
    "run_kvfs": "cli",
    "account": "users",
    "fuse_missing": "mounts",
    "TRANSPORTS": "mounts",
    "with_transport": "mounts",
    "DEFAULT_CONFIG": "configs",
}
THOME = {
    "test_client": dict.fromkeys(["CONFIG", "MiB", "Peer", "blob", "sha", "statistics"], "client_procs"),
    "test_mount_tenants": {
        "TENANTS_CONFIG": "configs",
        "public_mountpoint": "users",
        "run_as": "users",
        "users": "users",
    },
    "test_mount_semantics": dict.fromkeys(["_renameat2", "blob", "err", "write"], "files"),
    "test_metrics": dict.fromkeys(["scrape", "tier"], "metrics"),
    "test_store": {"Clock": "stores"},
    "test_ingest": dict.fromkeys(["BLOCK", "blob", "make"], "stores"),
    "test_two_mounts": dict.fromkeys(["check", "content", "publish", "two_mounts", "wait_for"], "two_mounts"),
    "test_tools": dict.fromkeys(["kvfs", "kvfs_json"], "cli"),
}
FIXTURES = {"users", "public_mountpoint", "two_mounts"}
PAT = re.compile(r"^(\s*)from (conftest|test_\w+) import ([^#\n]+?)(\s*#.*)?$", re.MULTILINE)


def rewrite(src: str) -> str:
    """*src* with its old imports and paths replaced by their support/ ones."""

    def rep(m: re.Match[str]) -> str:
        ind, mod, names = m.group(1), m.group(2), [n.strip() for n in m.group(3).split(",") if n.strip()]
        table = HOME if mod == "conftest" else THOME[mod]  # KeyError: a helper of a test module not yet in support/
        groups: dict[str, list[str]] = {}
        for n in names:
            if n != "small_tmpfs":  # a conftest fixture: no import needed
                groups.setdefault(table[n], []).append(n.lstrip("_"))
        return "\n".join(
            f"{ind}from support.{k} import {', '.join(v)}" + ("  # noqa: F401  (fixtures)" if FIXTURES & set(v) else "")
            for k, v in sorted(groups.items())
        )

    src = re.sub(r"\b_renameat2\b", "renameat2", PAT.sub(rep, src))
    src = re.sub(
        r"^(\s*)from (control_harness|engine_harness|s3server) import",
        r"\1from support.\2 import",
        src,
        flags=re.MULTILINE,
    )
    src = re.sub(
        r'Path\(__file__\)\.with_name\("(client_peer|zmq_peer|stub_mount)\.py"\)', r'(SUPPORT_DIR / "\1.py")', src
    )
    if "SUPPORT_DIR" in src and "from support import SUPPORT_DIR" not in src:
        src = src.replace("\nfrom support.", "\nfrom support import SUPPORT_DIR\nfrom support.", 1)
    return src.replace("Path(__file__).resolve().parent.parent", "Path(__file__).resolve().parents[2]")


def place(path: str) -> str:
    """git mv *path* into its area, its imports rewritten; the new path."""
    stem = path.rsplit("/", 1)[-1][:-3]
    areas = [a for a, pats in AREAS.items() if any(fnmatch.fnmatchcase(stem, p) for p in pats)]
    if len(areas) != 1:
        raise SystemExit(
            f"{path}: no single area for its name ({areas}); pick one (tests/README.md, 'Layout') and add it to AREAS"
        )
    dest = f"tests/{areas[0]}/{stem}.py"
    subprocess.run(["git", "mv", path, dest], check=True)
    with open(dest) as f:
        src = f.read()
    with open(dest, "w") as f:
        f.write(rewrite(src))
    return dest


def fix_citations() -> list[str]:
    """Rewrite a cited test path at tests/ root wherever the repository cites it and it is not there, to
    the one file of that name under tests/; the files changed."""
    tracked = ["README.md", "docs/*.md", "tests/README.md", "pyproject.toml", ".ci/*", "tools/*.sh", "*.py"]
    files = subprocess.run(["git", "ls-files", "--", *tracked], capture_output=True, text=True, check=True).stdout
    changed = []
    for name in files.split():
        path = Path(name)
        if name == ".ci/run" or not path.is_file():
            continue
        text = path.read_text()

        def moved(m: re.Match[str]) -> str:
            found = list(Path("tests").glob(f"*/{m.group(1)}"))
            return str(found[0]) if not Path(m.group(0)).exists() and len(found) == 1 else m.group(0)

        new = re.sub(r"\btests/(\w+\.py)\b", moved, text)
        if new != text:
            path.write_text(new)
            changed.append(name)
    return changed


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg} -> {place(arg)}")
    for name in fix_citations():
        print(f"{name}: test paths updated")
