"""docs/store.md names functions to jump to ("Life of a write", "of a read", "of an
eviction"): every ``Class.member`` and ``kvfs.module.function`` it names in backticks exists.

A class is looked up in every module of kvfs/, tiers/ and mount/ (as installed: kvfs.tiers,
kvfs.mount); a member is a method, a property, a class attribute, a dataclass field or an
attribute the class sets on ``self``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import kvfs

DOC = Path(__file__).resolve().parents[2] / "docs" / "store.md"
PACKAGES = ("kvfs", "kvfs.tiers", "kvfs.mount")

_TICKED = re.compile(r"`([^`\n]+)`")
_MEMBER = re.compile(r"^([A-Z][A-Za-z0-9]*)\.([A-Za-z_][A-Za-z0-9_]*)$")
_DOTTED = re.compile(r"^kvfs(\.[a-z_][a-z0-9_]*)+$")


def _modules() -> list[object]:
    out = []
    for package in PACKAGES:
        try:
            pkg = importlib.import_module(package)
        except ImportError:  # the mount's extra (pyfuse3) is not installed: check the rest
            continue
        out.append(pkg)
        for info in pkgutil.walk_packages(pkg.__path__, f"{package}."):
            if package == "kvfs" and info.name.startswith(("kvfs.tiers", "kvfs.mount", "kvfs.gpu", "kvfs.tools")):
                continue
            try:
                out.append(importlib.import_module(info.name))
            except ImportError:
                continue
    return out


def _classes() -> dict[str, list[type]]:
    found: dict[str, list[type]] = {}
    for module in _modules():
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == getattr(module, "__name__", None):
                found.setdefault(name, []).append(obj)
    return found


def _has(cls: type, member: str) -> bool:
    for klass in cls.__mro__:
        if member in vars(klass) or member in getattr(klass, "__annotations__", {}):
            return True
        if member in getattr(klass, "__slots__", ()):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(member)}\s*(:[^=\n]*)?=", source):
            return True
    return False


def names_in_doc() -> tuple[list[tuple[str, str]], list[str]]:
    members: list[tuple[str, str]] = []
    dotted: list[str] = []
    for tick in _TICKED.findall(DOC.read_text()):
        call = tick.split("(")[0].strip()
        if m := _MEMBER.match(call):
            members.append((m.group(1), m.group(2)))
        elif _DOTTED.match(call):
            dotted.append(call)
    return sorted(set(members)), sorted(set(dotted))


def test_the_doc_names_functions():
    members, dotted = names_in_doc()
    assert len(members) > 40 and dotted  # the pattern found the page's call chains
    for cls, member in (("Store", "put"), ("Sealing", "seal_end"), ("Reading", "read_copies")):
        assert (cls, member) in members


def test_every_class_member_the_doc_names_exists():
    classes = _classes()
    members, _ = names_in_doc()
    missing = []
    for cls_name, member in members:
        candidates = classes.get(cls_name, [])
        if not any(_has(c, member) for c in candidates):
            missing.append(f"{cls_name}.{member}" + ("" if candidates else f" (no class {cls_name})"))
    assert not missing, f"docs/store.md names what does not exist: {', '.join(missing)}"


def test_every_dotted_name_the_doc_names_exists():
    _, dotted = names_in_doc()
    missing = []
    for name in dotted:
        module_name, obj = name, None
        while module_name:
            try:
                obj = importlib.import_module(module_name)
                break
            except ImportError:
                module_name = module_name.rpartition(".")[0]
        rest = name[len(module_name) :].lstrip(".")
        for part in rest.split(".") if rest else ():
            obj = getattr(obj, part, None)
        if obj is None:
            missing.append(name)
    assert not missing, f"docs/store.md names what does not exist: {', '.join(missing)}"


@pytest.mark.parametrize("bad", ["Store.no_such_method", "Sealing.nothing"])
def test_a_name_that_does_not_exist_is_caught(bad):
    cls_name, member = bad.split(".")
    assert not any(_has(c, member) for c in _classes().get(cls_name, []))


def test_kvfs_is_this_tree():
    assert Path(kvfs.__file__).resolve().parent == DOC.parent.parent / "kvfs"
