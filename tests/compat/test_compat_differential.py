"""Random sequences of pruning calls through torch.nn.utils.prune and fprune.compat agree.

Two identical models (continuous random weights, so no ties) go through the same calls under
the same ``torch.manual_seed``: every method, int and float amounts, importance scores,
iterative pruning (containers), global pruning, custom masks and methods, ``remove``,
in-place weight updates and forward passes. After each call the state_dicts (keys, order,
dtypes, values), parameters, buffers, pruned attributes, hooks and container histories and the
forward outputs must be equal; a call that fails in torch must fail in fprune.compat with an
exception of the same type (or a subclass), and leave the fprune.compat model unchanged.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.compat.compat_calls import operations, outcome, run, structured_on_pruned_1d
from tests.compat.compat_helpers import LIBRARIES, TARGETS, assert_same_state, make_net, state


@settings(max_examples=int(os.environ.get("FPRUNE_COMPAT_EXAMPLES", "300")))
@given(st.integers(0, 1000), st.lists(operations(), min_size=1, max_size=7))
def test_random_call_sequences_match_torch(model_seed, ops):
    reference, candidate = make_net(model_seed), make_net(model_seed)
    assert_same_state(state(reference), state(candidate))
    for op in ops:
        before = state(candidate)
        if structured_on_pruned_1d(candidate, op):
            # ValueError, or the error of another bad argument in the same call.
            with pytest.raises((ValueError, TypeError, IndexError, RuntimeError)):
                run("compat", candidate, op)
            assert_same_state(before, state(candidate))
            return
        expected = outcome("torch", reference, op)
        actual = outcome("compat", candidate, op)
        if expected is not None:
            assert actual is not None, f"torch raised {expected!r} on {op}, fprune.compat did not"
            assert isinstance(actual, type(expected)), f"{op}: torch {expected!r}, fprune.compat {actual!r}"
            assert_same_state(before, state(candidate))  # all-or-nothing
            event(f"both raised {type(expected).__name__}")
            return  # torch may have left its model half-pruned: the sequences part here
        assert actual is None, f"fprune.compat raised {actual!r} on {op}, torch did not"
        assert_same_state(state(reference), state(candidate))
        event(f"compared {op[0]}")
    # Finally make everything permanent in both and compare the plain models.
    for target in TARGETS:
        module_t, module_c = getattr(reference, target[0]), getattr(candidate, target[0])
        if LIBRARIES["torch"].is_pruned(module_t) and hasattr(module_t, target[1] + "_orig"):
            LIBRARIES["torch"].remove(module_t, target[1])
            LIBRARIES["compat"].remove(module_c, target[1])
    assert_same_state(state(reference), state(candidate))


@pytest.mark.parametrize(
    "method", ["L1Unstructured", "RandomUnstructured", "RandomStructured", "LnStructured", "Identity"]
)
@pytest.mark.parametrize("seed", range(5))
def test_compute_mask_and_prune_match_torch(method, seed):
    """The methods' own compute_mask / prune (outside any module), with non-trivial default masks."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(6, 4, 3, generator=g)
    default = (torch.rand(t.shape, generator=g) > 0.3).float()
    scores = torch.randn(t.shape, generator=g)
    args = {
        "L1Unstructured": dict(amount=0.4),
        "RandomUnstructured": dict(amount=7),
        "RandomStructured": dict(amount=0.5, dim=1),
        "LnStructured": dict(amount=2, n=2, dim=0),
        "Identity": {},
    }[method]
    results = {}
    for library, prune in LIBRARIES.items():
        torch.manual_seed(seed)
        instance = getattr(prune, method)(**args)
        mask = instance.compute_mask(t, default_mask=default)
        pruned = instance.prune(t, default_mask=default, importance_scores=scores)
        results[library] = (mask.dtype, mask, pruned)
    assert results["torch"][0] == results["compat"][0]
    assert torch.equal(results["torch"][1], results["compat"][1])
    assert torch.equal(results["torch"][2], results["compat"][2])
