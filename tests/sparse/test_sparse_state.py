"""The checkpoint form: to_state -> torch.save -> torch.load(weights_only=True) -> from_state."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch.func import functional_call

import fprune
from fprune.sparse import SparseWeight, from_state, layouts, to_sparse, to_state
from sparse_helpers import assert_close, gpt2, mlp, output, pruned


def _round_trip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    size = len(buffer.getvalue())
    buffer.seek(0)
    return torch.load(buffer, weights_only=True), size


@pytest.mark.parametrize("layout", ["csr", "bsr", "auto", "dense"])
def test_gpt2_round_trip_gives_the_same_outputs(layout):
    model = gpt2()
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout=layout, module=model)
    state, _ = _round_trip(to_state(sparse))
    loaded = from_state(state)
    assert layouts(loaded) == layouts(sparse)
    for k, v in sparse.items():
        if isinstance(v, SparseWeight):
            assert isinstance(loaded[k], SparseWeight) and loaded[k].transposed == v.transposed
            assert loaded[k].matrix.crow_indices().dtype == torch.int32
        assert torch.equal(loaded[k].to_dense(), v.to_dense())
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        assert_close(
            output(functional_call(model, loaded, (ids,))),
            output(fprune.masked_call(model, params, masks, (ids,))),
        )


def test_nested_params_round_trip():
    params = {"a": [torch.randn(64, 32), torch.randn(32)], "b": {"c": torch.randn(16, 64)}}
    masks = {
        "a": [torch.rand(64, 32) > 0.9, torch.ones(32, dtype=torch.bool)],
        "b": {"c": torch.rand(16, 64) > 0.9},
    }
    sparse = to_sparse(params, masks, layout="csr")
    loaded = from_state(_round_trip(to_state(sparse))[0])
    assert layouts(loaded) == {"a": ["csr", "dense"], "b": {"c": "csr"}}
    assert torch.equal(loaded["b"]["c"].to_dense(), sparse["b"]["c"].to_dense())


@pytest.mark.parametrize("amount, at_most", [(0.9, 0.25), (0.95, 0.13), (0.98, 0.06)])
def test_smaller_on_disk_at_high_sparsity(amount, at_most):
    model = mlp(sizes=(256, 512, 256))
    params, masks = pruned(model, amount)
    _, dense = _round_trip(params)
    _, csr = _round_trip(to_state(to_sparse(params, masks, layout="csr", module=model)))
    # int32 CSR: 8 bytes per kept float32 weight against 4 per weight, plus row pointers and biases
    assert csr / dense <= at_most


def test_state_holds_only_what_weights_only_loads():
    model = mlp()
    params, masks = pruned(model, 0.9)
    state = to_state(to_sparse(params, masks, layout="csr", module=model))
    assert set(state) == {"format", "version", "params", "transposed", "semi_structured"}
    assert all(type(v) is torch.Tensor for v in state["params"].values())


def test_sparse_params_pickle_and_deepcopy():
    model = mlp()
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout="csr", module=model)
    for copied in (copy.deepcopy(sparse), pickle.loads(pickle.dumps(sparse))):
        assert isinstance(copied["0.weight"], SparseWeight)
        assert torch.equal(copied["0.weight"].to_dense(), sparse["0.weight"].to_dense())
    buffer = io.BytesIO()
    torch.save(sparse, buffer)  # as it is: weights_only=True refuses the class, as torch says
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="SparseWeight"):
        torch.load(buffer, weights_only=True)
