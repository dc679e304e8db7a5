"""A module holding sparse weights is an ordinary module: it saves (save_pretrained, state_dict,
torch.save), loads back (from_pretrained, load_state_dict, to_state/from_state) and runs in
bfloat16 and float16; load_into refuses NaN or inf weights before writing anything."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F

import fprune
from fprune.sparse import SparseWeight, from_state, layouts, load_into, sparse_weights, to_sparse, to_state
from sparse_helpers import assert_close, gpt2, llama, mlp, output, pruned

MODELS = {"gpt2": lambda: gpt2(lm_head=True), "llama": llama}


def _blocks(name: str, p: torch.Tensor) -> bool:
    return p.dim() == 2 and (".h." in name or ".layers." in name)


def _sparse_and_masked(name: str, dtype: torch.dtype = torch.float32):
    """The model with sparse block weights (csr) and a dense copy holding the masked weights."""
    model = MODELS[name]().to(dtype)
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.l1_unstructured(params, 0.9, where=_blocks)
    masks = {k: m for k, m in masks.items() if _blocks(k, params[k])}
    masked = copy.deepcopy(model)
    load_into(masked, fprune.apply_masks(params, masks))
    f32 = {k: v.float() for k, v in params.items()}  # the CPU kernel builds from float32 weights
    load_into(model, to_sparse(f32, masks, layout="csr", module=model))
    return model, masked, masks


def _ids():
    return torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_save_pretrained_writes_the_dense_values_and_from_pretrained_loads_them(name, tmp_path):
    model, masked, masks = _sparse_and_masked(name)
    model.save_pretrained(tmp_path)
    assert sorted(sparse_weights(model)) == sorted(masks)  # saving changed nothing
    loaded = type(model).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        got, want, sparse = output(loaded(_ids())), output(masked(_ids())), output(model(_ids()))
    assert torch.equal(got, want)  # the masked model's weights, dense
    assert_close(sparse, want)
    for key in masks:
        assert torch.equal(loaded.get_parameter(key).detach(), masked.get_parameter(key).detach())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_state_dict_holds_dense_tensors_that_torch_load_weights_only_reads(name):
    model, masked, masks = _sparse_and_masked(name)
    state = model.state_dict()
    assert all(type(t) is torch.Tensor and t.layout == torch.strided for t in state.values())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    fresh = (gpt2(seed=1, lm_head=True) if name == "gpt2" else llama(seed=1)).eval()
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    with torch.no_grad():
        assert torch.equal(output(fresh(_ids())), output(masked(_ids())))
    # and back into the sparse module: each weight re-sparsified in its layout, values equal
    model.load_state_dict(fresh.state_dict())
    assert sorted(sparse_weights(model)) == sorted(masks)
    for key in masks:
        assert torch.equal(model.get_buffer(key).dense(), masked.get_parameter(key).detach())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_to_state_of_the_module_is_the_sparse_checkpoint(name):
    model, _, masks = _sparse_and_masked(name)
    buffer = io.BytesIO()
    torch.save(to_state(model), buffer)
    sparse_size = len(buffer.getvalue())
    buffer.seek(0)
    fresh = (gpt2(seed=1, lm_head=True) if name == "gpt2" else llama(seed=1)).eval()
    assert fprune.load_into(fresh, from_state(torch.load(buffer, weights_only=True))) is fresh
    assert layouts(sparse_weights(fresh)) == dict.fromkeys(masks, "csr")
    with torch.no_grad():
        assert torch.equal(output(fresh(_ids())), output(model(_ids())))
    dense = io.BytesIO()
    torch.save(model.state_dict(), dense)
    assert sparse_size < len(dense.getvalue())


def test_deepcopy_and_pickle_keep_the_sparse_weights_and_the_dense_state_dict():
    model, _, masks = _sparse_and_masked("gpt2")
    for other in (copy.deepcopy(model), torch.load(_saved(model), weights_only=False)):
        assert sorted(sparse_weights(other)) == sorted(masks)
        assert all(type(t) is torch.Tensor for t in other.state_dict().values())


def _saved(module: torch.nn.Module) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_low_precision_weight_multiplies_in_float32_and_rounds_once(dtype):
    # differential: the dense weight in dtype, multiplied in float32, the output rounded to dtype
    torch.manual_seed(0)
    w = torch.randn(48, 96) * (torch.rand(48, 96) > 0.8)
    b = torch.randn(48)
    sw = to_sparse({"w": w}, {"w": w != 0}, layout="csr")["w"].to(dtype)
    assert sw.dtype == dtype and sw.matrix.dtype == torch.float32
    assert torch.equal(sw.dense(), w.to(dtype))  # the values are dtype's
    for rows in (1, 5):
        x = torch.randn(rows, 96).to(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no dense fallback
            got = F.linear(x, sw, b.to(dtype))
            got_t = torch.addmm(b.to(dtype), x, SparseWeight(sw.matrix, transposed=True, dtype=dtype))
        want = F.linear(x.float(), w.to(dtype).float(), b.to(dtype).float())
        assert got.dtype == dtype and got_t.dtype == dtype
        assert_close(got.float(), want, rtol=1e-2)
        assert_close(got_t.float(), want, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_generate_after_to_low_precision_runs_like_the_dense_model(name, dtype):
    model, masked, masks = _sparse_and_masked(name)
    model, masked = model.to(dtype), masked.to(dtype)
    assert all(w.dtype == dtype for w in sparse_weights(model).values())
    ids = _ids()
    kwargs = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad(), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        tokens = model.generate(ids, **kwargs)
        got, want = output(model(ids)), output(masked(ids))
    assert tokens.shape == (2, 12)
    assert not [w for w in record if "fprune.sparse" in str(w.message)]  # the sparse kernel ran
    assert got.dtype == dtype
    assert_close(got.float(), want.float(), rtol=2e-2)
    # a bf16 model saves and loads back like any other
    state = model.state_dict()
    assert all(t.dtype == dtype for k, t in state.items() if k in masks)


def test_load_into_a_low_precision_module_converts_the_sparse_weights():
    model = mlp(0).to(torch.bfloat16)
    params, masks = pruned(mlp(0), 0.9)  # float32
    load_into(model, to_sparse(params, masks, layout="csr", module=model))
    assert {w.dtype for w in sparse_weights(model).values()} == {torch.bfloat16}
    x = torch.randn(3, 48)
    with torch.no_grad():
        got = model(x.bfloat16())
        want = fprune.masked_call(mlp(0), params, masks, (x,))
    assert got.dtype == torch.bfloat16
    assert_close(got.float(), want, rtol=2e-2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_load_into_refuses_non_finite_weights_before_any_write(bad):
    model = mlp(0)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    weight = model[0].weight.detach().clone()
    weight[1, 2] = bad
    with pytest.raises(ValueError, match=r"params\['0.weight'\] to hold finite values, got 1 NaN or inf"):
        fprune.load_into(model, {"2.bias": torch.zeros(32), "0.weight": weight})
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    # sparse values too: their stored (kept) values
    params, masks = pruned(mlp(0), 0.9)
    sparse = to_sparse(params, masks, layout="csr")
    sparse["2.weight"].matrix.values()[0] = bad
    with pytest.raises(ValueError, match=r"params\['2.weight'\] to hold finite values"):
        load_into(model, {"0.weight": sparse["0.weight"], "2.weight": sparse["2.weight"]})
    assert not sparse_weights(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_load_into_takes_buffers_as_given():
    model = torch.nn.BatchNorm1d(4)
    stats = torch.tensor([1.0, float("inf"), 3.0, 4.0])  # a buffer may hold inf on purpose
    assert fprune.load_into(model, {"running_var": stats}) is model
    assert torch.equal(model.running_var, stats)
