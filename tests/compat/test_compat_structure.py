"""fprune.compat's structure: the hook protocol, one-way imports, one place for the names."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune.compat as prune
from fprune.compat import _hooks
from fprune.compat._protocol import CompatMethod

ROOT = pathlib.Path(prune.__file__).parent
# Each module may import only the ones listed after it (fprune.compat's own modules).
LAYERS = ["__init__", "bridges", "functions", "methods", "_protocol", "_hooks", "_checks", "_errors"]


def _compat_imports(path: pathlib.Path):
    """(module imported, inside a function?) for every import of an fprune.compat module."""
    tree = ast.parse(path.read_text())
    inside = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for n in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fprune.compat"):
            names = (
                [node.module.split(".")[-1]]
                if node.module != "fprune.compat"
                else [a.name for a in node.names]
            )
            found += [(name, id(node) in inside) for name in names]
    return found


@pytest.mark.parametrize("module", LAYERS)
def test_imports_point_down_and_none_is_lazy(module):
    allowed = set(LAYERS[LAYERS.index(module) + 1 :])
    for name, lazy in _compat_imports(ROOT / f"{module}.py"):
        assert not lazy, f"{module} imports {name} inside a function"
        assert name in allowed, f"{module} imports {name}, which is not below it"


def test_only_hooks_spells_the_orig_and_mask_suffixes():
    for path in ROOT.glob("*.py"):
        if path.name == "_hooks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and not node.value.count("\n"):
                assert node.value not in (_hooks.ORIG, _hooks.MASK), f"{path.name} spells {node.value!r}"


@pytest.mark.parametrize(
    "name",
    [
        "Identity",
        "RandomUnstructured",
        "L1Unstructured",
        "RandomStructured",
        "LnStructured",
        "CustomFromMask",
        "PruningContainer",
    ],
)
def test_every_compat_method_follows_the_protocol(name):
    if name == "PruningContainer":
        module = prune.identity(prune.identity(torch.nn.Linear(2, 2), "weight"), "weight")
        (method,) = module._forward_pre_hooks.values()
        assert isinstance(method, prune.PruningContainer) and isinstance(method, CompatMethod)
        return
    cls = getattr(prune, name)
    args = {
        "RandomUnstructured": (1,),
        "L1Unstructured": (1,),
        "RandomStructured": (1,),
        "LnStructured": (1, 2),
        "CustomFromMask": (torch.ones(2),),
    }.get(name, ())
    method = cls(*args)
    method._tensor_name = "weight"  # set by apply: the protocol describes an applied method
    assert isinstance(method, CompatMethod)
    assert method._core_backed == (name != "CustomFromMask")
    assert not isinstance(torch_prune.L1Unstructured(1), CompatMethod)


def test_a_user_compute_mask_is_not_core_backed():
    class Mine(prune.L1Unstructured):
        def compute_mask(self, t, default_mask):
            return default_mask

    assert not Mine(1)._core_backed and prune.L1Unstructured(1)._core_backed


def test_nothing_pruned_draws_nothing():
    # _select's None: no draw from the global generator, as torch skips rand when k == 0.
    t, w = torch.randn(5), torch.randn(3, 2)
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    assert prune.RandomUnstructured(0.0)._select(t, None) is None
    assert prune.RandomStructured(0, dim=0)._select(w, None) is None
    assert torch.equal(torch.rand(1), expected)
