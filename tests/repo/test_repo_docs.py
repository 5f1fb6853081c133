"""What a new operator reads before running anything (issue 24): the docs cite only files the
repository has, the package metadata installs without deprecation warnings, the README's
test command is the one CI runs, and the README says how to get torch's CPU build.

These read the checkout's own files; no mount, no daemon.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--", *patterns], capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / line for line in out.splitlines() if line]


def _pytest_args(command: str) -> list[str]:
    """The arguments after ``-m pytest`` in a shell line."""
    words = shlex.split(command)
    i = words.index("pytest")
    return words[i + 1 :]


def test_the_docs_cite_the_design_the_repository_has():
    design = ROOT / "docs" / "design.md"
    assert design in _tracked("docs/design.md"), "docs/design.md is not committed"
    files = _tracked("README.md", "docs/*.md", "tests/README.md", "pyproject.toml", ".ci/*")
    assert len(files) > 5
    citing = [str(f.relative_to(ROOT)) for f in files if "DESIGN.md" in f.read_text()]
    assert citing == [], f"cite a DESIGN.md that is not in the repository: {citing}"
    assert "docs/design.md" in (ROOT / ".ci" / "static").read_text()
    assert "docs/design.md" in (ROOT / "pyproject.toml").read_text()


def test_the_license_is_an_spdx_string_the_build_backend_takes():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"  # a table ({text = ...}) is deprecated
    assert "License" not in " ".join(meta["project"].get("classifiers", []))  # refused beside it
    (req,) = [r for r in meta["build-system"]["requires"] if r.startswith("setuptools")]
    m = re.fullmatch(r"setuptools>=(\d+)", req)
    assert m is not None and int(m.group(1)) >= 77, req  # 77 took SPDX expressions


def test_the_readme_runs_the_suite_as_ci_does_with_the_workers_it_installs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    readme_cmd = next(line for line in readme.splitlines() if "-m pytest" in line and line.startswith("apt-get"))
    ci_cmd = next(line for line in ci.splitlines() if "-m pytest" in line and not line.startswith("#"))
    assert _pytest_args(readme_cmd) == _pytest_args(ci_cmd)
    args = _pytest_args(ci_cmd)
    if "-n" in args:  # xdist workers: both install the extra that brings pytest-xdist
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        assert any(dep.startswith("pytest-xdist") for dep in extras["test"])
        assert "pip install -e '.[all,test,dev]'" in readme_cmd
        assert "pip install -q -e '.[all,test,dev]'" in ci


def test_the_readme_says_how_to_get_torchs_cpu_build_from_the_public_index():
    readme = (ROOT / "README.md").read_text()
    top = [line for line in readme.splitlines() if line.startswith("apt-get")]
    assert len(top) == 2 and all("pip install torch==2.13.0 &&" in line for line in top)
    prose = " ".join(readme.split())
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in prose
    assert "SUITE_TIMES" not in readme  # no placeholder left where figures belong


def test_every_test_path_the_repository_cites_exists():
    """Docs, scripts and docstrings name test files by path (``tests/mount/test_mount_files.py``,
    ``tests/gpu/test_gpu_*.py``); each names a file the checkout has, so a moved or renamed
    test cannot leave a stale pointer behind."""
    files = _tracked("README.md", "docs/*.md", "tests/README.md", "pyproject.toml", ".ci/*", "tools/*.sh", "*.py")
    stale = []
    for f in files:
        if not f.is_file():
            continue
        for cited in sorted(set(re.findall(r"\btests/[\w/*.-]*?\w\.py\b", f.read_text(errors="replace")))):
            if not any(ROOT.glob(cited)):
                stale.append(f"{f.relative_to(ROOT)}: {cited}")
    assert not stale, "cited test files that do not exist:\n" + "\n".join(stale)
