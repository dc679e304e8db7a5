"""The layout of fprune.pruners: one private file per pruner with its state class beside it,
registered for ``torch.load(weights_only=True)`` in that file (no central list), an
``__init__`` that only re-exports, and no module over the size bar."""

from __future__ import annotations

import ast
import importlib
import io
from pathlib import Path

import torch

import fprune.pruners

PACKAGE = Path(fprune.pruners.__file__).resolve().parent
MAX_MODULE_LINES = 600


def _files() -> list[Path]:
    return sorted(PACKAGE.glob("*.py"))


def _state_classes(tree: ast.Module) -> list[str]:
    """The NamedTuple classes whose first fields are the shared core, masks and step."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "NamedTuple" for b in node.bases):
            fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)]
            if fields[:2] == ["masks", "step"]:
                found.append(node.name)
    return found


def _registered(tree: ast.Module) -> list[str]:
    """The names passed to add_safe_globals in a module."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_safe_globals":
            for arg in node.args:
                names += [e.id for e in getattr(arg, "elts", []) if isinstance(e, ast.Name)]
    return names


def test_every_state_class_is_registered_where_it_is_defined():
    states = {}
    for path in _files():
        tree = ast.parse(path.read_text())
        defined, registered = _state_classes(tree), _registered(tree)
        assert sorted(registered) == sorted(defined), f"{path.name} registers {registered}, defines {defined}"
        states.update(dict.fromkeys(defined, path.stem))
    assert set(states) == {"GradualState", "DynamicSparseState", "MovementState"}
    safe = torch.serialization.get_safe_globals()
    for name, module in states.items():
        cls = getattr(importlib.import_module(f"fprune.pruners.{module}"), name)
        assert cls in safe and getattr(fprune.pruners, name) is cls


def test_the_checks_see_a_state_class_and_its_registration():
    sample = ast.parse(
        "class S(NamedTuple):\n    masks: Any\n    step: Any\n    more: Any\n"
        "torch.serialization.add_safe_globals([S])\n"
        "class Other(NamedTuple):\n    step: Any\n    masks: Any\n"
    )
    assert _state_classes(sample) == ["S"] and _registered(sample) == ["S"]


def test_the_package_init_only_re_exports():
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body[1:]:  # after the docstring
        if isinstance(node, ast.ImportFrom):
            assert node.module.startswith("fprune.pruners._"), node.module
        else:
            assert isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["__all__"]
    assert all(hasattr(fprune.pruners, name) for name in fprune.pruners.__all__)


def test_no_module_of_the_package_over_the_bar():
    long = {p.name: n for p in _files() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long


def test_every_pruner_state_loads_with_weights_only():
    params = {"w": torch.randn(4, 6), "b": torch.randn(4)}
    grads = {k: torch.randn_like(v) for k, v in params.items()}
    pruners = [
        fprune.gradual_magnitude(lambda step: 0.5, every=1),
        fprune.rigl(0.5, distribution="uniform", drop_fraction=0.5, every=1, end=4),
        fprune.movement(lambda step: 0.5, every=1),
    ]
    for pruner in pruners:
        _, state = pruner.update(params, pruner.init(params), grads=grads)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=True)
        assert type(loaded) is type(state) and torch.equal(loaded.masks["w"], state.masks["w"])
