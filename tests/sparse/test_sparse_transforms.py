"""Gradients, vmap and torch.compile with sparse params: what docs/sparse.md says they do."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad, vmap

import fprune
from fprune.sparse import SparseWeight, to_sparse
from sparse_helpers import assert_close, gpt2, mlp, output, pruned


@pytest.mark.parametrize("build", [mlp, gpt2])
def test_gradients_reach_inputs_and_dense_params_as_with_masked_call(build):
    model = build()
    params, masks = pruned(model, 0.9)
    dense = {k: v.clone().requires_grad_() for k, v in params.items()}
    sparse = to_sparse(dense, masks, layout="csr", module=model)
    x = torch.randn(3, 48) if build is mlp else torch.randint(0, 64, (2, 5))
    output(functional_call(model, sparse, (x,))).square().sum().backward()
    got = {k: v.grad for k, v in dense.items() if v.grad is not None}
    ref = {k: v.clone().requires_grad_() for k, v in params.items()}
    output(fprune.masked_call(model, ref, masks, (x,))).square().sum().backward()
    assert set(got) == {k for k in params if k not in masks}  # the sparse weights are constants
    for k, value in got.items():
        assert_close(value, ref[k].grad, 1e-5)


def test_input_gradient_under_torch_func_grad():
    model = mlp()
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout="csr", module=model)
    x = torch.randn(4, 48)
    got = grad(lambda x: functional_call(model, sparse, (x,)).square().sum())(x)
    want = grad(lambda x: fprune.masked_call(model, params, masks, (x,)).square().sum())(x)
    assert_close(got, want)


def test_a_sparse_weight_never_requires_grad():
    sparse = to_sparse({"w": torch.randn(4, 4)}, {"w": torch.rand(4, 4) > 0.5}, layout="csr")
    with pytest.raises(RuntimeError, match=r"constant for inference.*fprune.masked_call"):
        sparse["w"].requires_grad_()
    assert not sparse["w"].requires_grad


def test_torch_func_grad_with_respect_to_sparse_params_is_the_straight_through_gradient():
    model = mlp()
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout="csr", module=model)
    x = torch.randn(4, 48)
    got = grad(lambda p: functional_call(model, p, (x,)).square().sum())(sparse)
    ref = {k: v.clone().requires_grad_() for k, v in params.items()}
    fprune.masked_call(model, ref, masks, (x,), straight_through=True).square().sum().backward()
    for k in params:
        assert type(got[k]) is torch.Tensor  # dense: every entry's gradient, pruned ones too
        assert_close(got[k], ref[k].grad)


def test_vmap_over_inputs():
    model = gpt2()
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout="csr", module=model)
    ids = torch.randint(0, 64, (4, 2, 5))
    with torch.no_grad():
        got = vmap(lambda i: output(functional_call(model, sparse, (i,))))(ids)
        want = torch.stack([output(fprune.masked_call(model, params, masks, (i,))) for i in ids])
    assert_close(got, want)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_breaks_the_graph_at_each_sparse_weight_and_is_right(backend):
    torch._dynamo.reset()
    model = mlp()
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout="csr", module=model)
    x = torch.randn(5, 48)
    compiled = torch.compile(lambda x, p: functional_call(model, p, (x,)), backend=backend)
    with torch.no_grad():
        assert_close(compiled(x, sparse), fprune.masked_call(model, params, masks, (x,)))
    explained = torch._dynamo.explain(lambda x, p: functional_call(model, p, (x,)))(x, sparse)
    assert explained.graph_break_count >= 1 or explained.graph_count == 0


def test_torch_compile_fullgraph_refuses_a_sparse_weight():
    torch._dynamo.reset()
    model = mlp()
    params, masks = pruned(model, 0.9)
    sparse = to_sparse(params, masks, layout="csr", module=model)
    compiled = torch.compile(lambda x, p: functional_call(model, p, (x,)), backend="eager", fullgraph=True)
    with torch.no_grad(), pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(torch.randn(2, 48), sparse)


def test_dense_layers_of_auto_compile_as_usual():
    torch._dynamo.reset()
    model = mlp()
    params, masks = pruned(model, 0.5)  # small and 50%: auto keeps every weight dense
    sparse = to_sparse(params, masks, module=model)
    assert not any(isinstance(v, SparseWeight) for v in sparse.values())
    compiled = torch.compile(lambda x, p: functional_call(model, p, (x,)), backend="eager", fullgraph=True)
    x = torch.randn(2, 48)
    with torch.no_grad():
        assert_close(compiled(x, sparse), fprune.masked_call(model, params, masks, (x,)))
