"""The former module paths of the mask functions still resolve, to the same functions, and warn."""

import importlib

import pytest

import fprune


@pytest.mark.parametrize("module", ["fprune.unstructured", "fprune.structured"])
def test_old_module_paths_give_the_same_functions_with_a_future_warning(module):
    old = importlib.import_module(module)  # importing alone is silent (doctest collection imports it)
    assert old.__all__
    for name in old.__all__:
        with pytest.warns(FutureWarning, match=rf"{module}\.{name} is deprecated: use fprune\.{name}"):
            assert getattr(old, name) is getattr(fprune, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        old.nope  # noqa: B018
