"""load_into: to_sparse's params in the module itself, run by its own forward and generate."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import fprune
from fprune.sparse import SparseWeight, from_state, layouts, load_into, sparse_weights, to_sparse, to_state
from sparse_helpers import assert_close, gpt2, llama, mlp, output, pruned

MODELS = {"gpt2": lambda: gpt2(lm_head=True), "llama": llama}


def _block_weights(name: str, p: torch.Tensor) -> bool:
    return p.dim() == 2 and (".h." in name or ".layers." in name)


def _pruned_blocks(model: torch.nn.Module, amount: float = 0.9) -> tuple[dict, dict]:
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.l1_unstructured(params, amount, where=_block_weights)
    return params, {k: m for k, m in masks.items() if _block_weights(k, params[k])}


def _masked_copy(model: torch.nn.Module, params: dict, masks: dict) -> torch.nn.Module:
    masked = copy.deepcopy(model)
    load_into(masked, fprune.apply_masks(params, masks))
    return masked


def _snapshot(module: torch.nn.Module) -> dict:
    return {
        "params": {
            k: (id(v), v.detach().clone()) for k, v in module.named_parameters(remove_duplicate=False)
        },
        "buffers": {k: id(v) for k, v in module.named_buffers(remove_duplicate=False)},
    }


def _unchanged(module: torch.nn.Module, snap: dict) -> bool:
    now = _snapshot(module)
    if now["buffers"] != snap["buffers"] or now["params"].keys() != snap["params"].keys():
        return False
    return all(
        now["params"][k][0] == i and torch.equal(now["params"][k][1], v)
        for k, (i, v) in snap["params"].items()
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_generate_on_sparse_weights_gives_the_masked_models_tokens(name):
    # float64: the sparse kernel sums in another order, and greedy decoding must not meet a near-tie
    model = MODELS[name]().double()
    params, masks = _pruned_blocks(model)
    masked = _masked_copy(model, params, masks)
    sparse = to_sparse(params, masks, layout="csr", module=model)
    load_into(model, sparse)
    installed = sparse_weights(model)
    assert sorted(installed) == sorted(masks) and all(installed[k] is sparse[k] for k in masks)
    assert not set(masks) & {k for k, _ in model.named_parameters()}
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    kwargs = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad(), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = model.generate(ids, **kwargs)
        want = masked.generate(ids, **kwargs)
        assert_close(output(model(got)), output(masked(got)), rtol=1e-10)
    assert not [w for w in record if "fprune.sparse" in str(w.message)]  # no op fell back to dense
    assert got.shape == (2, 17) and torch.equal(got, want)


def test_the_sparse_kernel_runs_in_the_modules_forward(monkeypatch):
    model = gpt2(lm_head=True)
    params, masks = _pruned_blocks(model)
    load_into(model, to_sparse(params, masks, layout="csr", module=model))
    calls = []
    real = torch.addmm

    def counting(*args, **kwargs):
        calls.append(any(isinstance(a, SparseWeight) for a in args))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "addmm", counting)
    with torch.no_grad():
        model(torch.randint(0, 64, (1, 4)))
    assert sum(calls) == len(masks)  # every Conv1D of the blocks multiplied by its SparseWeight


@pytest.mark.parametrize("name", sorted(MODELS))
def test_sparse_checkpoint_loads_back_into_a_fresh_module(name):
    model = MODELS[name]()
    params, masks = _pruned_blocks(model)
    load_into(model, to_sparse(params, masks, layout="csr", module=model))
    buffer = io.BytesIO()
    torch.save(to_state(model), buffer)
    buffer.seek(0)
    fresh = MODELS[name](seed=1) if name == "llama" else gpt2(seed=1, lm_head=True)
    load_into(fresh, from_state(torch.load(buffer, weights_only=True)))
    assert layouts(sparse_weights(fresh)) == layouts(sparse_weights(model))
    assert sorted(sparse_weights(fresh)) == sorted(masks)
    ids = torch.randint(0, 64, (2, 6))
    with torch.no_grad():
        assert torch.equal(output(fresh(ids)), output(model(ids)))
    # ties survive: GPT-2's LM head is its embedding
    if name == "gpt2":
        assert fresh.lm_head.weight is fresh.transformer.wte.weight


def test_load_state_dict_into_the_sparse_module_keeps_it_sparse():
    model, other = mlp(0, (64, 128, 32)), mlp(1, (64, 128, 32))
    for m in (model, other):
        params, masks = pruned(m, 0.9)
        load_into(m, to_sparse(params, masks, layout="csr", module=m))
    kept = model[0].weight
    model.load_state_dict(other.state_dict())  # SparseWeight into SparseWeight: its matrix
    assert model[0].weight is kept and torch.equal(kept.to_dense(), other[0].weight.to_dense())
    dense = torch.randn(128, 64) * (torch.rand(128, 64) > 0.8)
    model.load_state_dict({**model.state_dict(), "0.weight": dense})  # dense: sparsified
    assert isinstance(model[0].weight, SparseWeight) and model[0].weight.nnz() == int((dense != 0).sum())
    x = torch.randn(3, 64)
    with torch.no_grad():
        assert_close(F.linear(x, model[0].weight), F.linear(x, dense))


def test_load_state_dict_of_sparse_weights_into_a_dense_module_densifies_quietly(recwarn):
    model, dense = mlp(0), mlp(0)
    params, masks = pruned(model, 0.9)
    load_into(model, to_sparse(params, masks, layout="csr", module=model))
    dense.load_state_dict(model.state_dict())
    assert isinstance(dense[0].weight, torch.nn.Parameter)
    assert torch.equal(dense[0].weight.detach(), params["0.weight"] * masks["0.weight"])
    assert not [w for w in recwarn if "fprune.sparse" in str(w.message)]


def test_dense_values_are_copied_into_the_same_parameters_and_a_dense_value_undoes_a_sparse_one():
    model = mlp()
    params, masks = pruned(model, 0.9)
    params = {k: v.clone() for k, v in params.items()}  # not views of the parameters written below
    before = dict(model.named_parameters())
    load_into(model, fprune.apply_masks(params, masks))
    assert all(p is before[k] for k, p in model.named_parameters())
    assert torch.equal(model[0].weight.detach(), params["0.weight"] * masks["0.weight"])
    load_into(model, to_sparse(params, masks, layout="csr", module=model))
    assert isinstance(model[0].weight, SparseWeight)
    load_into(model, {"0.weight": params["0.weight"]})
    assert isinstance(model[0].weight, torch.nn.Parameter)
    assert torch.equal(model[0].weight.detach(), params["0.weight"])
    assert list(sparse_weights(model)) == ["2.weight"]


def test_module_to_converts_the_sparse_weights_and_keeps_them_sparse():
    model = mlp()
    params, masks = pruned(model, 0.9)
    load_into(model, to_sparse(params, masks, layout="csr", module=model))
    model.double()
    w = model[0].weight
    assert isinstance(w, SparseWeight) and w.dtype == torch.float64 and w.matrix.dtype == torch.float64
    x = torch.randn(2, 48, dtype=torch.float64)
    with torch.no_grad():
        assert_close(
            model(x),
            fprune.masked_call(mlp().double(), {k: v.double() for k, v in params.items()}, masks, (x,)),
        )


@settings(max_examples=20, deadline=None)
@given(amount=st.sampled_from([0.0, 0.5, 0.9, 0.99]), layout=st.sampled_from(["csr", "bsr", "dense"]))
def test_the_loaded_module_computes_what_functional_call_on_the_params_does(amount, layout):
    model = gpt2()
    params, masks = pruned(model, amount)
    sparse = to_sparse(params, masks, layout=layout, module=model, blocksize=(4, 4))
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = output(torch.func.functional_call(model, sparse, (ids,)))
        load_into(model, sparse)
        assert torch.equal(output(model(ids)), want)


# ------------------------------------------------------------------------------ bad input


def _sparse_gpt2():
    model = gpt2(lm_head=True)
    params, masks = _pruned_blocks(model)
    return model, params, masks, to_sparse(params, masks, layout="csr", module=model)


def test_bad_input_raises_and_leaves_the_module_unchanged():
    model, params, masks, sparse = _sparse_gpt2()
    snap = _snapshot(model)
    key = "transformer.h.0.mlp.c_fc.weight"
    linear_made = to_sparse({key: params[key]}, {key: masks[key]}, layout="csr")[key]  # (out, in) form
    cases = [
        (
            {**sparse, "transformer.h.0.mlp.c_fx.weight": params[key]},
            ValueError,
            (
                r"params\['transformer.h.0.mlp.c_fx.weight'\] names no parameter"
                r".*nearest: 'transformer.h.0.mlp.c_fc.weight'"
            ),
        ),
        (
            {**sparse, key: params[key].t()},
            ValueError,
            rf"Expected params\['{key}'\] to have the shape .*\(32, 128\), got \(128, 32\)",
        ),
        (
            {
                **sparse,
                "transformer.wpe.weight": to_sparse(
                    {"w": params["transformer.wpe.weight"]},
                    {"w": params["transformer.wpe.weight"] > 0},
                    layout="csr",
                )["w"],
            },
            ValueError,
            r"params\['transformer.wpe.weight'\], a sparse weight, to be for the weight of an nn.Linear",
        ),
        (
            {**sparse, key: linear_made},
            ValueError,
            rf"params\['{key}'\] to be a sparse weight made for a Conv1D",
        ),
        (
            {**sparse, "transformer.h.1.ln_1.weight": "ones"},
            TypeError,
            r"params\['transformer.h.1.ln_1.weight'\] to be a torch.Tensor, got str",
        ),
        ([("a", torch.ones(1))], TypeError, "Expected params to be a flat dict"),
    ]
    for bad, error, match in cases:
        with pytest.raises(error, match=match):
            load_into(model, bad)
        assert _unchanged(model, snap)
    with pytest.raises(TypeError, match=r"Expected module to be a torch\.nn\.Module, got dict"):
        load_into({}, sparse)


def test_a_sparse_value_for_a_tied_weight_or_two_values_for_one_raise_before_any_change():
    model = gpt2(lm_head=True)
    params = {k: v.detach() for k, v in model.named_parameters(remove_duplicate=False)}
    keep = params["lm_head.weight"].abs() > 0.02
    head = to_sparse(
        {"lm_head.weight": params["lm_head.weight"]}, {"lm_head.weight": keep}, layout="csr", module=model
    )
    snap = _snapshot(model)
    first = "transformer.h.0.attn.c_attn.weight"
    with pytest.raises(
        ValueError,
        match=r"params\['lm_head.weight'\], a sparse weight, to be for a weight of its own"
        r".*tied to 'transformer.wte.weight'",
    ):
        load_into(model, {first: params[first] * 0, **head})
    assert _unchanged(model, snap)
    with pytest.raises(
        ValueError,
        match=r"params\['lm_head.weight'\] and params\['transformer.wte.weight'\] name one tied weight",
    ):
        load_into(
            model,
            {
                "transformer.wte.weight": params["lm_head.weight"] * 2,
                "lm_head.weight": params["lm_head.weight"],
            },
        )
    assert _unchanged(model, snap)
    load_into(
        model,
        {
            "transformer.wte.weight": params["lm_head.weight"] * 2,
            "lm_head.weight": params["lm_head.weight"] * 2,
        },
    )
    assert model.lm_head.weight is model.transformer.wte.weight
