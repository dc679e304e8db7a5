"""to_sparse's params give the masked model's outputs: nn.Linear and GPT-2's Conv1D, every layout."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.func import functional_call

import fprune
from fprune.sparse import SparseWeight, layouts, to_sparse
from sparse_helpers import assert_close, gpt2, mlp, output, pruned

SPARSITIES = [0.0, 0.5, 0.9, 0.98, 1.0]


@pytest.mark.parametrize("layout", ["csr", "bsr", "auto", "dense"])
@pytest.mark.parametrize("amount", SPARSITIES)
@pytest.mark.parametrize("shape", [(5, 48), (2, 3, 48), (48,), (1, 48)])
def test_mlp_equals_masked_call(layout, amount, shape):
    model = mlp(sizes=(48, 96, 32))
    params, masks = pruned(model, amount)
    sparse = to_sparse(params, masks, layout=layout, module=model)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close(functional_call(model, sparse, (x,)), fprune.masked_call(model, params, masks, (x,)))
    want = {"csr": "csr", "bsr": "bsr", "dense": "dense"}.get(layout)
    if want:
        assert all(layouts(sparse)[k] == want for k in masks)


@pytest.mark.parametrize("layout", ["csr", "bsr", "auto"])
@pytest.mark.parametrize("amount", [0.5, 0.9, 0.98])
@pytest.mark.parametrize("batch, length", [(1, 1), (3, 7), (2, 16)])
def test_gpt2_conv1d_equals_masked_call(layout, amount, batch, length):
    model = gpt2()
    params, masks = pruned(model, amount)
    sparse = to_sparse(params, masks, layout=layout, module=model)
    if layout != "auto":
        assert all(isinstance(sparse[k], SparseWeight) and sparse[k].transposed for k in masks)
        assert all(sparse[k].shape == params[k].shape for k in masks)
    ids = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = output(functional_call(model, sparse, (ids,)))
        want = output(fprune.masked_call(model, params, masks, (ids,)))
    assert_close(got, want)


def test_gpt2_lm_head_model_with_tied_embeddings():
    model = gpt2(lm_head=True)
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout="csr", module=model)
    assert layouts(sparse)["transformer.wte.weight"] == "dense"  # an nn.Embedding's: never converted
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_close(
            output(functional_call(model, sparse, (ids,))),
            output(fprune.masked_call(model, params, masks, (ids,))),
        )


def test_without_module_every_2d_masked_leaf_is_an_f_linear_weight():
    model = mlp()
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout="csr")
    assert all(not sparse[k].transposed for k in masks)
    x = torch.randn(4, 48)
    with torch.no_grad():
        assert_close(functional_call(model, sparse, (x,)), fprune.masked_call(model, params, masks, (x,)))


def test_conv1d_weight_without_module_is_right_on_a_dense_copy():
    model = gpt2(layers=1)
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout="csr")  # taken as (out, in): x @ W has no kernel
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close(
            output(functional_call(model, sparse, (ids,))),
            output(fprune.masked_call(model, params, masks, (ids,))),
        )


@given(
    out_features=st.integers(1, 40),
    in_features=st.integers(1, 40),
    rows=st.integers(1, 9),
    amount=st.floats(0.0, 1.0),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_linear_ops_equal_a_plain_reference(out_features, in_features, rows, amount, transposed, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g, dtype=torch.float64)
    keep = torch.rand(out_features, in_features, generator=g) >= amount
    b = torch.randn(out_features, generator=g, dtype=torch.float64)
    x = torch.randn(rows, in_features, generator=g, dtype=torch.float64)
    dense = w * keep  # the reference: plain dense arithmetic on the masked weight
    params = {"w": w.t() if transposed else w}
    masks = {"w": keep.t() if transposed else keep}
    sw = to_sparse(params, masks, layout="csr", where=lambda n, p: True)["w"]
    assert sw.shape == params["w"].shape
    with torch.no_grad():
        if transposed:  # the Conv1D use: (in, out) weight on the right of addmm / mm / matmul
            assert_close(torch.addmm(b, x, sw), x @ dense.t() + b, 1e-12)
            assert_close(torch.addmm(b, x, sw, beta=0.5, alpha=2.0), 2.0 * (x @ dense.t()) + 0.5 * b, 1e-12)
            assert_close(x @ sw, x @ dense.t(), 1e-12)
            assert_close(torch.mm(x, sw), x @ dense.t(), 1e-12)
        else:  # the nn.Linear use
            assert_close(F.linear(x, sw, b), x @ dense.t() + b, 1e-12)
            assert_close(F.linear(x, sw), x @ dense.t(), 1e-12)
            assert_close(x @ sw.t(), x @ dense.t(), 1e-12)
            assert_close(sw @ x.t(), dense @ x.t(), 1e-12)
            assert_close(sw @ x[0], dense @ x[0], 1e-12)


def test_inputs_are_left_as_they_were():
    model = gpt2(layers=1)
    params = dict(model.named_parameters())
    masks = fprune.l1_unstructured(params, 0.9, where=lambda n, p: p.dim() == 2)
    before = {k: (v, v.clone(), v.requires_grad) for k, v in params.items()}
    masks_before = {k: m.clone() for k, m in masks.items()}
    for layout in ("auto", "csr", "bsr", "dense"):
        to_sparse(params, masks, layout=layout, module=model)
    assert list(params) == list(before)
    for k, (obj, value, grad) in before.items():
        assert params[k] is obj and torch.equal(obj, value) and obj.requires_grad == grad and obj.grad is None
    assert all(torch.equal(masks[k], masks_before[k]) for k in masks)
    assert all(p is model.get_parameter(k) for k, p in params.items())


def test_masks_may_be_packed_or_0_1_floats():
    model = mlp()
    params, masks = pruned(model, 0.9)
    want = to_sparse(params, masks, layout="csr", module=model)
    for other in (fprune.pack_masks(masks), {k: m.float() for k, m in masks.items()}):
        got = to_sparse(params, other, layout="csr", module=model)
        assert all(torch.equal(got[k].to_dense(), want[k].to_dense()) for k in masks)


def test_unconverted_leaves_are_masked_like_apply_masks():
    model = mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.l1_unstructured(params, 0.5)  # biases too
    sparse = to_sparse(params, masks, layout="csr", module=model)
    applied = fprune.apply_masks(params, masks)
    for k in params:
        if k.endswith("bias"):
            assert torch.equal(sparse[k], applied[k])
        else:
            assert torch.equal(sparse[k].to_dense(), applied[k])


def test_other_ops_run_on_a_dense_copy_with_a_warning():
    w = torch.randn(6, 4)
    keep = torch.rand(6, 4) > 0.5
    sw = to_sparse({"w": w}, {"w": keep}, layout="csr")["w"]
    with pytest.warns(UserWarning, match="aten.add.Tensor has no sparse kernel"):
        got = sw + 1
    assert type(got) is torch.Tensor and torch.equal(got, w * keep + 1)
    assert torch.equal(sw.to_dense(), w * keep)
    assert torch.equal(sw.t().to_dense(), (w * keep).t())
    assert sw.to(torch.float64).dtype == torch.float64 and isinstance(sw.to(torch.float64), SparseWeight)
    assert "layout=csr" in repr(sw)


def test_sparse_weight_rejects_what_it_cannot_hold():
    with pytest.raises(TypeError, match=r"2-D torch\.sparse_csr or torch\.sparse_bsr"):
        SparseWeight(torch.ones(2, 2))
