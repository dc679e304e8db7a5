"""fprune.compat has torch.nn.utils.prune's public names, signatures, classes and exception types."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune.compat as prune

FUNCTIONS = [
    "identity",
    "random_unstructured",
    "l1_unstructured",
    "random_structured",
    "ln_structured",
    "global_unstructured",
    "custom_from_mask",
    "remove",
    "is_pruned",
]
CLASSES = [
    "BasePruningMethod",
    "PruningContainer",
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
]
METHODS = ["__init__", "compute_mask", "apply", "apply_mask", "prune", "remove", "__call__"]


def _signature(function):
    """Parameter names, kinds and defaults; not annotations (fprune.compat's are for mypy)."""
    signature = inspect.signature(function)
    empty = inspect.Parameter.empty
    return signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=empty,
    )


BRIDGES = ["hooks_to_functional", "strip_pruning", "functional_to_hooks", "load_pruned_state_dict"]


def test_public_names_are_torchs_plus_the_bridges():
    torch_public = {
        n for n in dir(torch_prune) if (not n.startswith("_") and n[0].isupper()) or n in FUNCTIONS
    }
    torch_public -= {"ABC", "Iterable"}  # torch's imports, not its API
    assert torch_public == set(FUNCTIONS) | set(CLASSES)
    assert set(FUNCTIONS) | set(CLASSES) | set(BRIDGES) <= set(prune.__all__)
    for name in prune.__all__:
        assert getattr(prune, name).__doc__, name


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_signatures_match(name):
    assert _signature(getattr(prune, name)) == _signature(getattr(torch_prune, name))


@pytest.mark.parametrize("name", CLASSES)
def test_classes_subclass_torchs_with_the_same_signatures(name):
    ours, theirs = getattr(prune, name), getattr(torch_prune, name)
    assert issubclass(ours, theirs) or (
        name != "BasePruningMethod" and issubclass(ours, torch_prune.BasePruningMethod)
    )
    assert issubclass(ours, torch_prune.BasePruningMethod) and issubclass(ours, prune.BasePruningMethod)
    assert getattr(ours, "PRUNING_TYPE", None) == getattr(theirs, "PRUNING_TYPE", None)
    for method in METHODS:
        if hasattr(theirs, method):
            assert _signature(getattr(ours, method)) == _signature(getattr(theirs, method)), method


def test_container_is_torchs_container():
    assert issubclass(prune.PruningContainer, torch_prune.PruningContainer)


@pytest.mark.parametrize(
    "function, kwargs",
    [
        ("identity", {}),
        ("random_unstructured", {"amount": 2}),
        ("l1_unstructured", {"amount": 0.5}),
        ("random_structured", {"amount": 1, "dim": 0}),
        ("ln_structured", {"amount": 1, "n": 1, "dim": 0}),
        ("custom_from_mask", {"mask": torch.ones(3, 4)}),
    ],
)
def test_functions_return_the_module_and_apply_the_hook(function, kwargs):
    module = torch.nn.Linear(4, 3)
    assert getattr(prune, function)(module, "weight", **kwargs) is module
    assert prune.remove(module, "weight") is module
    cls = {
        "identity": prune.Identity,
        "random_unstructured": prune.RandomUnstructured,
        "l1_unstructured": prune.L1Unstructured,
        "random_structured": prune.RandomStructured,
        "ln_structured": prune.LnStructured,
        "custom_from_mask": prune.CustomFromMask,
    }[function]
    hook = cls.apply(
        module,
        "bias" if function in ("identity", "random_unstructured", "l1_unstructured") else "weight",
        **({"mask": torch.ones(3, 4)} if function == "custom_from_mask" else kwargs),
    )
    assert hook in module._forward_pre_hooks.values() and isinstance(hook, cls)
    assert prune.global_unstructured([(module, "weight")], prune.L1Unstructured, amount=1) is None


def test_exceptions_are_subclasses_of_torchs():
    module = torch.nn.Linear(4, 3)
    with pytest.raises(AssertionError) as info:
        prune.l1_unstructured(module, "weight", amount=1, importance_scores=torch.ones(4))
    assert isinstance(info.value, ValueError) and "importance_scores" in str(info.value)
    assert "(3, 4)" in str(info.value) and "(4,)" in str(info.value)
    with pytest.raises(AssertionError) as info:
        prune.custom_from_mask(module, "weight", mask=torch.ones(2))
    assert isinstance(info.value, ValueError) and "mask" in str(info.value)
    with pytest.raises(RuntimeError) as info:
        prune.ln_structured(module, "weight", amount=1, n="max", dim=0)
    assert isinstance(info.value, ValueError) and "'max'" in str(info.value)
    with pytest.raises(ValueError, match="amount=9 should be smaller"):
        prune.random_unstructured(module, "bias", amount=9)


def test_bool_amounts_are_refused():
    # torch reads True as 1 and then fails inside topk; False silently prunes nothing.
    for amount in (True, False):
        with pytest.raises(TypeError, match="amount"):
            prune.l1_unstructured(torch.nn.Linear(2, 2), "weight", amount=amount)


def test_container_of_several_methods_at_once():
    a, b = prune.L1Unstructured(1), prune.RandomUnstructured(1)
    a._tensor_name = b._tensor_name = "weight"
    container = prune.PruningContainer(a, b)
    assert list(container) == [a, b] and container._tensor_name == "weight"
    with pytest.raises(AttributeError):  # torch never sets _tensor_name in this case
        torch_prune.PruningContainer(a, b)


def test_torchs_private_helpers_are_reexported():
    for name in ("_compute_nparams_toprune", "_validate_pruning_amount_init", "_compute_norm"):
        assert getattr(prune, name) is getattr(torch_prune, name)
