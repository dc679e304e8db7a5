"""Sharding is a backend of the selection layer: no other module of fprune knows about DTensors.

Only the fprune/select package (its sharded executor hands DTensor leaves to the backend), the
fprune/distributed package and fprune/_torch.py (the torch internals, DTensor layouts among
them) may name DTensors in code: the methods, pruners, scores and everything above them never
test for them. Read from the code itself (names, attributes, string constants; docstrings and
comments may describe it), so this runs without any process group.
"""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
PACKAGE = ROOT / "fprune"
ALLOWED = {"_torch.py"}
# DTensor in any case of a name (holds_dtensor, _dtensor_pruners, DTensorSpec), not the "dTensor"
# inside other names (torch.sparse.SparseSemiStructuredTensor).
WORDS = re.compile(r"DTensor|(?<![A-Za-z])dtensor|torch\.distributed\.tensor")


def _docstrings(tree: ast.AST) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _mentions(path: pathlib.Path) -> list:
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, ast.alias):
            text = node.name
        elif isinstance(node, ast.ImportFrom):
            text = node.module or ""
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        else:
            continue
        if WORDS.search(text):
            found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}: {text[:60]!r}")
    return found


def test_only_the_selection_layer_and_the_distributed_package_know_dtensors():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("distributed", "select") or str(relative) in ALLOWED:
            continue
        offenders += _mentions(path)
    assert offenders == []


def test_the_check_sees_a_mention():
    probe = ROOT / "fprune" / "distributed" / "_layout.py"
    assert _mentions(probe), "the check must find the DTensor code of the backend"


def test_methods_and_pruners_do_not_import_the_distributed_package():
    names = ("methods/_unstructured.py", "methods/_structured.py", "scores.py", "calibration.py")
    names += tuple(str(p.relative_to(PACKAGE)) for p in sorted((PACKAGE / "pruners").glob("*.py")))
    for name in names:
        tree = ast.parse((PACKAGE / name).read_text())
        imported = {
            node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
        } | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert not any(m.startswith("fprune.distributed") for m in imported), name
