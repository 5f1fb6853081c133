"""Where the daemon's work leaves the trio loop is decided in one module,
mount/workers.py (docs/mount-internals.md, "Threads"): no other module of the packages
hands work to a thread with ``trio.to_thread`` or makes a ``trio.CapacityLimiter`` of its
own. Each part is handed the method of the kind of work it does instead."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvfs", "mount", "gpu", "tiers", "tools")
OWNER = Path("mount/workers.py")
ALLOWED: dict[Path, str] = {}
"""Modules that may call trio.to_thread or make a CapacityLimiter anyway: path -> why.
(None today; an entry needs a reason the workers' kinds cannot serve.)"""


def _offences(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each use of ``trio.to_thread`` or ``trio.CapacityLimiter``, however
    it is spelled (``trio.to_thread.run_sync``, ``from trio import to_thread``,
    ``from trio.to_thread import run_sync``, ``import trio.to_thread``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("to_thread", "CapacityLimiter"):
            if isinstance(node.value, ast.Name) and node.value.id == "trio":
                found.append((node.lineno, f"trio.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == "trio":
                found += [
                    (node.lineno, f"from trio import {a.name}")
                    for a in node.names
                    if a.name in ("to_thread", "CapacityLimiter")
                ]
            elif node.module.startswith("trio.to_thread"):
                found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith("trio.to_thread")]
    return found


def test_only_the_workers_module_hands_work_to_threads():
    bad = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel == OWNER or rel in ALLOWED:
                continue
            for line, what in _offences(ast.parse(path.read_text(), str(rel))):
                bad.append(f"{rel}:{line}: {what}")
    assert not bad, (
        "work handed to threads outside mount/workers.py; take the Workers method of its kind "
        "(tier, meta, loop_or_tier, cpu, client, control, kernel, background, events) in the constructor:\n"
        + "\n".join(bad)
    )


def test_the_check_sees_every_spelling():
    """The check above finds what it looks for (it would pass vacuously otherwise)."""
    source = """
import trio
import trio.to_thread
from trio import to_thread, CapacityLimiter
from trio.to_thread import run_sync
async def f():
    await trio.to_thread.run_sync(print, limiter=trio.CapacityLimiter(2))
"""
    whats = sorted(what for _, what in _offences(ast.parse(source)))
    assert whats == sorted(
        [
            "import trio.to_thread",
            "from trio import to_thread",
            "from trio import CapacityLimiter",
            "from trio.to_thread import ...",
            "trio.to_thread",
            "trio.CapacityLimiter",
        ]
    )
    assert _offences(ast.parse((ROOT / OWNER).read_text()))  # the owner is seen, and let through


def test_the_bounds_table_of_the_doc_and_the_module_agree():
    """mount/workers.py's BOUNDS is what its docstring's table and docs/mount-internals.md state."""
    from kvfs.mount import workers

    doc = workers.__doc__ or ""
    page = (ROOT / "docs" / "mount-internals.md").read_text()
    threads = page[page.index("## Threads") :]
    for kind, bound in workers.BOUNDS.items():
        row = next((line for line in doc.splitlines() if line.startswith(kind + " ")), "")
        assert row.split()[2].rstrip(",") == str(bound), (kind, row)
        cells = next((line for line in threads.splitlines() if line.startswith(f"| {kind} |")), "")
        assert cells.split("|")[3].strip().split()[0] == str(bound), (kind, cells)
