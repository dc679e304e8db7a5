"""Structural bars of the package: what keeps it easy to extend.

* no function or class in ``fprune/`` is longer than 250 lines;
* the sharded backend (``fprune/distributed/``) defines no scope logic of its own: scopes live in
  ``fprune/select/`` and are executed there, locally or sharded;
* outside the selection package, at most two ``isinstance`` tests name a scope class (the
  scopes answer for themselves);
* the module paths that were folded into ``fprune.methods`` do not come back;
* exactly one function named ``load_into`` is defined in ``fprune/`` (dense and sparse values
  go into a module one way; the public paths re-export it).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

import fprune.select

PACKAGE = Path(fprune.__file__).resolve().parent
MAX_LINES = 250
SCOPE_CLASSES = {"Scope", "Each", "Global", "Channels", "Rows", "NM", "Blocks"}
SCOPE_LOGIC = re.compile(
    r"^_?(global_?|each|channels|rows|n_m|blocks|floors|norm_scales|scaled|normali[sz]ed?\w*)$"
)


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_no_function_or_class_over_the_bar():
    long = []
    for path in _modules():
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(
                        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({lines} lines)"
                    )
    assert not long, long


def test_the_sharded_backend_defines_no_scope_logic():
    found = []
    for path in sorted((PACKAGE / "distributed").rglob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and SCOPE_LOGIC.match(node.name):
                found.append(f"{path.name}:{node.lineno} {node.name}")
    assert not found, found


def _scope_isinstance_tests(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            if len(node.args) != 2:
                continue
            target = node.args[1]
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            for name in names:
                ident = name.attr if isinstance(name, ast.Attribute) else getattr(name, "id", None)
                if ident in SCOPE_CLASSES:
                    lines.append(node.lineno)
                    break
    return lines


def test_scopes_are_rarely_asked_what_they_are_outside_the_selection_package():
    selection = PACKAGE / "select"
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in _modules()
        if selection not in path.parents
        for line in _scope_isinstance_tests(path)
    ]
    assert len(found) <= 2, found


def _definitions(path: Path, name: str) -> list[int]:
    """The lines where ``path`` defines a function (or method) called ``name``."""
    return [
        node.lineno
        for node in ast.walk(_tree(path))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
    ]


def test_exactly_one_load_into_is_defined():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in _modules()
        for line in _definitions(path, "load_into")
    ]
    assert len(found) == 1, found


def test_the_checks_see_what_they_look_for(tmp_path):
    # The scanners find what they are meant to find (so the bars above could fail).
    sample = tmp_path / "sample.py"
    sample.write_text("def global_():\n    return isinstance(s, (Global, Rows))\n")
    assert _scope_isinstance_tests(sample) == [2]
    assert (
        SCOPE_LOGIC.match("global_") and SCOPE_LOGIC.match("_floors") and not SCOPE_LOGIC.match("all_reduce")
    )
    two = tmp_path / "two.py"
    two.write_text(
        "def load_into(m, p):\n    return m\n\n\n"
        "class Loader:\n    def load_into(self, m, p):\n        return m\n\n\n"
        "load = load_into  # a re-export is no definition\n"
    )
    assert _definitions(two, "load_into") == [1, 6]


@pytest.mark.parametrize("name", ["fprune.structured", "fprune.unstructured", "fprune.methods._moved"])
def test_no_second_module_path_for_the_mask_functions(name):
    assert importlib.util.find_spec(name) is None
