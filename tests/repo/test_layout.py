"""The repository's layout rules that a linter cannot see on its own."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contract_lists_every_core_module():
    """import-linter's "core imports none of ..." contract names the core modules one by
    one; a new module in kvfs/ must be added there, or the contract would not cover it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    core = next(c for c in contracts if c["type"] == "forbidden")
    listed = set(core["source_modules"])
    present = {f"kvfs.{p.stem}" for p in (ROOT / "kvfs").glob("*.py") if p.stem != "__init__"}
    present |= {f"kvfs.{p.name}" for p in (ROOT / "kvfs").iterdir() if (p / "__init__.py").exists()}
    assert listed == present


AREAS = {
    "mount": ("test_mount_*", "test_umount_*", "test_daemon_*", "test_write_buffer*", "test_metrics*"),
    "store": (
        "test_store*",
        "test_core_*",
        "test_ingest*",
        "test_namespaces*",
        "test_lifetimes*",
        "test_access*",
        "test_config*",
        "test_hashing*",
        "test_allocator*",
        "test_policies*",
        "test_replay*",
    ),
    "tiers": (
        "test_tier_*",
        "test_tiers_*",
        "test_shared_tiers*",
        "test_dram_*",
        "test_blockfile*",
        "test_ownership*",
        "test_faults*",
        "test_gc*",
    ),
    "cluster": ("test_cluster*", "test_peer*", "test_two_*"),
    "client": ("test_client*",),
    "protocol": ("test_protocol*", "test_fuzz_*", "test_socket_*"),
    "engines": ("test_engine_*", "test_engines_*", "test_kv_events*"),
    "gpu": ("test_gpu_*", "test_prefix_cache*"),
    "tools": ("test_bench_*", "test_tools*", "test_first_hour*"),
    "repo": ("test_repo_*", "test_layout*", "test_semantics_doc*"),
}
"""tests/ by area: folder -> the names of its files (tests/README.md, "Layout")."""


def _area_of(stem: str) -> list[str]:
    return [area for area, patterns in AREAS.items() if any(fnmatch.fnmatchcase(stem, p) for p in patterns)]


def test_every_test_file_is_in_the_folder_its_name_says():
    """A test file lies in tests/<area>/, the one area whose patterns match its name; a new
    file at tests/ root (or in a folder its name does not fit) fails here with where to put it."""
    tests = ROOT / "tests"
    wrong = []
    for path in sorted(tests.rglob("test_*.py")):
        rel = path.relative_to(tests)
        areas = _area_of(path.stem)
        if len(rel.parts) != 2 or rel.parts[0] not in AREAS or areas != [rel.parts[0]]:
            want = f"tests/{areas[0]}/" if len(areas) == 1 else "an area (tests/README.md, 'Layout'), its name in AREAS"
            wrong.append(f"tests/{rel}: move it to {want}")
    assert not wrong, "\n".join([*wrong, "(python tests/support/place_new_tests.py FILE... moves and fixes imports)"])


def test_the_readme_lists_the_areas_the_layout_checks():
    text = (ROOT / "tests" / "README.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)/` \|", text, re.MULTILINE))
    assert listed == set(AREAS)


def test_test_modules_share_helpers_only_through_support():
    """Test modules are imported by path (importlib mode): one test module cannot import
    another, and conftest.py holds fixtures only; shared code lives in tests/support/."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for line in path.read_text().splitlines():
            if re.match(r"\s*(from|import) (conftest|test_\w+)\b", line):
                bad.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    hint = "import from support.<module> instead (tests/README.md, 'Layout'; tests/support/place_new_tests.py)"
    assert not bad, hint + ":\n" + "\n".join(bad)
