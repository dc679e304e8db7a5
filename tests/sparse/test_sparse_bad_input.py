"""Bad input to fprune.sparse: a clear error naming the argument, and the inputs left as they were."""

from __future__ import annotations

import pytest
import torch

import fprune
from fprune.sparse import from_state, to_sparse
from sparse_helpers import gpt2, mlp, pruned


def test_unknown_layout():
    model = mlp()
    params, masks = pruned(model, 0.9)
    with pytest.raises(
        ValueError, match=r"layout to be one of 'auto', 'csr', 'bsr', 'semi_structured', 'dense', got 'coo'"
    ):
        to_sparse(params, masks, layout="coo")


def test_masks_keyed_differently():
    model = mlp()
    params, masks = pruned(model, 0.9)
    masks["2.wieght"] = masks.pop("2.weight")
    with pytest.raises(
        ValueError,
        match=r"masks\['2.wieght'\] has no matching entry in params.*nearest in params: params\['2.weight'\]",
    ):
        to_sparse(params, masks, module=model)


def test_mask_of_the_wrong_shape():
    model = mlp()
    params, masks = pruned(model, 0.9)
    masks["0.weight"] = masks["0.weight"].t()
    with pytest.raises(
        ValueError,
        match=r"masks\['0.weight'\] to have the shape of params\['0.weight'\], \(96, 48\), got \(48, 96\)",
    ):
        to_sparse(params, masks)


def test_params_key_the_module_lacks():
    model = mlp()
    params, masks = pruned(model, 0.9)
    params = {"model." + k: v for k, v in params.items()}
    masks = {"model." + k: v for k, v in masks.items()}
    with pytest.raises(
        ValueError,
        match=r"params\['model.0.bias'\] names no parameter or buffer of the Sequential module "
        r"\(nearest: '0.bias'",
    ):
        to_sparse(params, masks, module=model)


@pytest.mark.parametrize("layout", ["csr", "bsr", "auto", "semi_structured"])
def test_non_2d_weight_picked_by_where(layout):
    model = mlp()
    params, masks = pruned(model, 0.9)
    with pytest.raises(
        ValueError,
        match=r"params\['0.bias'\], picked by where, to be a 2-D weight of a linear layer, "
        r"got a 1-D tensor of shape \(96,\)",
    ):
        to_sparse(params, masks, layout=layout, where=lambda name, p: True)


def test_conv_weight_picked_by_where():
    conv = torch.nn.Conv2d(3, 8, 3)
    params = {k: v.detach() for k, v in conv.named_parameters()}
    masks = fprune.l1_unstructured(params, 0.9)
    with pytest.raises(
        ValueError, match=r"params\['weight'\], picked by where, to be a 2-D weight.*4-D tensor"
    ):
        to_sparse(params, masks, layout="csr", where=lambda name, p: name == "weight")


def test_embedding_weight_picked_by_where_with_module():
    model = gpt2(layers=1)
    params, masks = pruned(model, 0.9)
    masks["wte.weight"] = torch.rand(params["wte.weight"].shape) > 0.5
    with pytest.raises(
        ValueError,
        match=r"params\['wte.weight'\], picked by where, to be the weight of an nn.Linear "
        r"or a transformers Conv1D",
    ):
        to_sparse(params, masks, layout="csr", module=model, where=lambda name, p: name == "wte.weight")


def test_default_where_leaves_embeddings_and_unmasked_weights_dense():
    model = gpt2(layers=1)
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.l1_unstructured(params, 0.9, where=lambda name, p: p.dim() == 2)
    sparse = to_sparse(params, masks, layout="csr", module=model)
    kinds = fprune.sparse.layouts(sparse)
    assert kinds["wte.weight"] == kinds["wpe.weight"] == "dense"
    assert kinds["h.0.mlp.c_fc.weight"] == "csr"


def test_cpu_dtype_the_kernel_lacks():
    w = torch.randn(8, 8, dtype=torch.bfloat16)
    keep = torch.rand(8, 8) > 0.5
    # csr: the weight's values in a float32 matrix, the outputs in bfloat16
    made = to_sparse({"w": w}, {"w": keep}, layout="csr")["w"]
    assert made.dtype == torch.bfloat16 and made.matrix.dtype == torch.float32
    assert torch.equal(made.dense(), w * keep)
    # auto keeps it dense instead (its timings and table are float32's)
    assert type(to_sparse({"w": w}, {"w": keep})["w"]) is torch.Tensor
    with pytest.raises(
        ValueError, match=r"params\['i'\] to be a floating tensor for layout='csr'.*torch.int32"
    ):
        to_sparse(
            {"i": torch.ones(4, 4, dtype=torch.int32)},
            {"i": torch.ones(4, 4, dtype=torch.bool)},
            layout="csr",
        )


def test_bsr_blocksize_that_does_not_divide():
    w, keep = torch.randn(10, 8), torch.rand(10, 8) > 0.5
    with pytest.raises(
        ValueError,
        match=r"\(out, in\) matrix of params\['w'\], \(10, 8\), to be a multiple of blocksize \(4, 4\)",
    ):
        to_sparse({"w": w}, {"w": keep}, layout="bsr")
    with pytest.raises(ValueError, match=r"blocksize to be a tuple of two positive ints, got \(0, 4\)"):
        to_sparse({"w": w}, {"w": keep}, layout="bsr", blocksize=(0, 4))


@pytest.mark.parametrize("rows", [0, -1, 2.5, True, "8", (), [8, 0], (1, None)])
def test_rows_must_be_positive_ints(rows):
    with pytest.raises(ValueError, match="rows to be None, a positive int or a non-empty sequence"):
        to_sparse({"w": torch.ones(2, 2)}, {"w": torch.ones(2, 2, dtype=torch.bool)}, rows=rows)


def test_module_that_is_not_a_module_and_params_that_are_not_tensors():
    with pytest.raises(TypeError, match=r"module to be None or a torch\.nn\.Module, got dict"):
        to_sparse({"w": torch.ones(2, 2)}, {}, module={})
    with pytest.raises(
        TypeError, match=r"every leaf of params to be a torch.Tensor, got int at params\['w'\]"
    ):
        to_sparse({"w": 3}, {})
    with pytest.raises(TypeError, match=r"dense \(strided\) tensor, got a sparse_csr tensor"):
        to_sparse({"w": torch.eye(3).to_sparse_csr()}, {})


def test_where_that_is_not_callable():
    with pytest.raises(TypeError, match="where to be None or a callable"):
        to_sparse({"w": torch.ones(2, 2)}, {}, where="w")


def test_from_state_of_something_else():
    with pytest.raises(
        ValueError, match=r"a state made by fprune.sparse.to_state .*got dict with keys \['w'\]"
    ):
        from_state({"w": torch.ones(2)})
    with pytest.raises(ValueError, match="got list"):
        from_state([torch.ones(2)])


def test_non_finite_pruned_weights_warn():
    w = torch.tensor([[1.0, float("inf")], [float("nan"), 2.0]])
    keep = torch.tensor([[True, False], [False, True]])
    with pytest.warns(UserWarning, match=r"params\['w'\] has 2 non-finite weights among its pruned entries"):
        sw = to_sparse({"w": w}, {"w": keep}, layout="csr")["w"]
    assert torch.equal(sw.to_dense(), torch.tensor([[1.0, 0.0], [0.0, 2.0]]))


def test_errors_leave_inputs_unchanged():
    model = mlp()
    params, masks = pruned(model, 0.9)
    snapshot = {k: v.clone() for k, v in params.items()}, {k: m.clone() for k, m in masks.items()}
    with pytest.raises(ValueError):
        to_sparse(params, masks, layout="bsr", blocksize=(5, 5), module=model)
    assert all(torch.equal(params[k], snapshot[0][k]) for k in params)
    assert all(torch.equal(masks[k], snapshot[1][k]) for k in masks)
