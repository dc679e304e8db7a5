"""Structural bars of the package: what keeps it easy to extend.

* no function or class in ``fprune/`` is longer than 250 lines;
* the sharded backend (``fprune/distributed/``) defines no scope logic of its own: scopes live in
  ``fprune/select/`` and are executed there, locally or sharded;
* outside the selection package, at most two ``isinstance`` tests name a scope class (the
  scopes answer for themselves);
* the module paths that were folded into ``fprune.methods`` do not come back;
* exactly one function named ``load_into`` is defined in ``fprune/`` (dense and sparse values
  go into a module one way; the public paths re-export it).
* no scope module (a module of ``fprune/select/`` that defines a scope) imports
  ``fprune.distributed``: the executors run the scopes, the scopes know none;
* no module of ``fprune/`` is longer than 600 lines (:func:`long_modules` scans any folder);
* no import cycle among the modules of ``fprune/``, imports made only for type checking
  (``if TYPE_CHECKING:`` blocks) and inside functions included.
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
MAX_MODULE_LINES = 600
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


# ---------------------------------------------------------------------------------------------
# Imports: of scope modules, and cycles


def module_name(path: Path, root: Path) -> str:
    """``fprune.select._rows`` of ``root/fprune/select/_rows.py`` (a package by its __init__)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(
    source: str, name: str, is_package: bool = False, known: set[str] | None = None
) -> set[str]:
    """Every module ``source`` (the module ``name``) imports, anywhere: at the top, inside
    functions and in ``if TYPE_CHECKING:`` blocks. ``from a import b`` is ``a.b`` where that is
    one of the ``known`` modules, else ``a`` (both without ``known``)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if known is None:
                    found |= {base, full}
                else:
                    found.add(full if full in known else base)
    return found


def import_graph(folder: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``folder`` (a package) it imports, type-only imports included."""
    root = folder.parent
    paths = {module_name(p, root): p for p in sorted(folder.rglob("*.py"))}
    return {
        name: (imported_modules(p.read_text(), name, p.name == "__init__.py", set(paths)) & set(paths))
        - {name}
        for name, p in paths.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (``[a, b, ..., a]``), or ``None``. An edge from a module to
    the ``__init__`` of a package above it is left out: importing ``fprune.select._x`` runs
    ``fprune/select/__init__.py`` first, which is an order of loading, not a dependency."""
    state: dict[str, int] = {}

    def above(module: str, other: str) -> bool:
        return module.startswith(other + ".")

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if above(node, nxt):
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [nxt])
                if cycle:
                    return cycle
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name, [name])
            if cycle:
                return cycle
    return None


def scope_modules(folder: Path) -> list[Path]:
    """The modules of ``folder`` that define a scope (a class deriving from ``Scope``), and the
    module of ``Scope`` itself."""
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef) and (
                node.name == "Scope"
                or any((getattr(b, "id", None) or getattr(b, "attr", None)) == "Scope" for b in node.bases)
            ):
                found.append(path)
                break
    return found


def imports_of_package(path: Path, package: str) -> list[str]:
    """The imports of ``package`` (or its modules) anywhere in the module at ``path``."""
    name = module_name(path, PACKAGE.parent) if PACKAGE in path.parents else path.stem
    return sorted(
        m for m in imported_modules(path.read_text(), name) if m == package or m.startswith(package + ".")
    )


def long_modules(folder: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    """The modules under ``folder`` of more than ``limit`` lines, with their length."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out.append(f"{path.relative_to(folder.parent)} ({lines} lines)")
    return out


def test_no_scope_module_imports_the_sharded_backend():
    scopes = scope_modules(PACKAGE / "select")
    assert {p.stem for p in scopes} >= {"_scope", "_each", "_global", "_channels", "_rows", "_nm", "_blocks"}
    found = {p.name: imports_of_package(p, "fprune.distributed") for p in scopes}
    assert not any(found.values()), found


def test_no_module_over_the_bar():
    assert long_modules(PACKAGE) == []


def test_no_import_cycle_type_only_imports_included():
    assert find_cycle(import_graph(PACKAGE)) is None


def test_the_import_and_length_scanners_can_fail(tmp_path):
    # A scope module that imports the sharded backend, in each way an import can be written.
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    scope = package / "_scoped.py"
    for line in (
        "from fprune.distributed import _layout",
        "import fprune.distributed._backend",
        "if TYPE_CHECKING:\n    from fprune.distributed._backend import Call",
        "def f():\n    from fprune.distributed._radix import group_radix",
    ):
        scope.write_text(f"from fprune.select._scope import Scope\n{line}\nclass Mine(Scope):\n    pass\n")
        assert scope_modules(package) == [scope]
        assert imports_of_package(scope, "fprune.distributed"), line
    scope.write_text("from fprune.select._scope import Scope\nclass Mine(Scope):\n    pass\n")
    assert imports_of_package(scope, "fprune.distributed") == []
    # A module one line over the bar, and one at it.
    (package / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "fine.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert long_modules(package) == [f"pkg/long.py ({MAX_MODULE_LINES + 1} lines)"]
    # A cycle closed by a type-only import (relative, in a TYPE_CHECKING block), and none without it.
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    assert find_cycle(import_graph(package)) == ["pkg.a", "pkg.b", "pkg.a"]
    (package / "b.py").write_text("x = 1\n")
    assert find_cycle(import_graph(package)) is None
