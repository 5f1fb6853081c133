"""The repository's layout rules that a linter cannot see on its own."""

from __future__ import annotations

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
