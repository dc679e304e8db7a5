"""Every mask function under vmap, torch.compile (fullgraph) and grad gives the eager result."""

import pytest
import torch
from torch.func import functional_call, grad, stack_module_state, vmap

import fprune
from tests.helpers import eager_and_aot_eager

MEMBERS = 3


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _weights(name, p):
    return name.endswith("weight")


# Each case maps (params, prior masks, seed) -> masks; a seed tensor drives the random methods.
CASES = {
    "identity": lambda p, m, s: fprune.identity(p),
    "l1": lambda p, m, s: fprune.l1_unstructured(p, 0.4, masks=m),
    "l1_count_scores": lambda p, m, s: fprune.l1_unstructured(
        p, 2, masks=m, importance_scores={k: v * v for k, v in p.items()}
    ),
    "random": lambda p, m, s: fprune.random_unstructured(p, 0.5, masks=m, generator=s),
    "ln": lambda p, m, s: fprune.ln_structured(p, 0.4, 2, 0, masks=m, where=_weights),
    "ln_dim1_count": lambda p, m, s: fprune.ln_structured(p, 1, 1, 1, masks=m, where=_weights),
    "random_structured": lambda p, m, s: fprune.random_structured(
        p, 0.5, 0, masks=m, generator=s, where=_weights
    ),
    "global": lambda p, m, s: fprune.global_unstructured(p, 0.6, masks=m),
    "global_normalized": lambda p, m, s: fprune.global_unstructured(
        p, 0.6, masks=m, normalize="l2", where=_weights
    ),
}


def _ensemble():
    models = [_mlp(i) for i in range(MEMBERS)]
    params, _ = stack_module_state(models)
    params = {k: v.detach() for k, v in params.items()}
    prior = vmap(lambda p: fprune.l1_unstructured(p, 0.25))(params)
    return params, prior


def _member(tree, i):
    return {k: v[i] for k, v in tree.items()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == torch.bool and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_prior", [False, True])
def test_vmap_over_an_ensemble_equals_each_member_alone(case, with_prior):
    fn = CASES[case]
    params, prior = _ensemble()
    seeds = torch.arange(MEMBERS) + 10
    if with_prior:
        batched = vmap(fn)(params, prior, seeds)
    else:
        batched = vmap(lambda p, s: fn(p, None, s))(params, seeds)
    for i in range(MEMBERS):
        alone = fn(_member(params, i), _member(prior, i) if with_prior else None, seeds[i])
        _assert_same(_member(batched, i), alone)


@pytest.mark.parametrize("case", CASES)
def test_compiled_fullgraph_equals_eager(case):
    # One fullgraph trace of the call with prior masks and the call without, run by the backends
    # "eager" and "aot_eager" (eager_and_aot_eager checks that they agree).
    torch._dynamo.reset()
    fn = CASES[case]
    params, prior = _ensemble()
    p, m = _member(params, 0), _member(prior, 0)
    seed = torch.tensor(5)
    compiled = torch.compile(
        lambda p, m, s: (fn(p, m, s), fn(p, None, s)), fullgraph=True, backend=eager_and_aot_eager
    )
    with_prior, without = compiled(p, m, seed)
    _assert_same(with_prior, fn(p, m, seed))
    _assert_same(without, fn(p, None, seed))


def test_vmap_over_sparsity_levels_with_a_tensor_amount():
    w = torch.randn(7, 5)
    levels = torch.tensor([0.0, 0.1, 0.5, 0.93, 1.0])
    batched = vmap(lambda a: fprune.global_unstructured({"w": w, "v": w[0]}, a), in_dims=0)(levels)
    for i, level in enumerate(levels.tolist()):
        _assert_same(_member(batched, i), fprune.global_unstructured({"w": w, "v": w[0]}, level))


def test_tensor_amount_in_eager_code_equals_the_float():
    w = torch.randn(9)
    assert torch.equal(fprune.l1_unstructured(w, torch.tensor(0.5)), fprune.l1_unstructured(w, 0.5))


def test_random_methods_under_vmap_with_the_global_generator():
    params, _ = _ensemble()
    torch.manual_seed(0)
    masks = vmap(lambda p: fprune.random_unstructured(p, 0.5), randomness="different")(params)
    assert not torch.equal(masks["0.weight"][0], masks["0.weight"][1])
    with pytest.raises(RuntimeError, match="randomness"):
        vmap(lambda p: fprune.random_unstructured(p, 0.5))(params)


def _loss(model, params, masks, x, y):
    return torch.nn.functional.mse_loss(fprune.masked_call(model, params, masks, (x,)), y)


def test_grad_through_masked_call_is_zero_at_pruned_entries_and_dense_elsewhere():
    model = _mlp(0)
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.global_unstructured(params, 0.5, where=_weights)
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    grads = grad(_loss, argnums=1)(model, params, masks, x, y)
    pruned = fprune.apply_masks(params, masks)
    dense = grad(lambda p: torch.nn.functional.mse_loss(functional_call(model, p, (x,)), y))(pruned)
    for k in params:
        assert (grads[k][~masks[k]] == 0).all(), k
        assert torch.allclose(grads[k][masks[k]], dense[k][masks[k]]), k


def test_vmap_of_grad_over_an_ensemble_and_compiled_masked_call():
    model = _mlp(0)
    params, prior = _ensemble()
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    per_member = vmap(grad(_loss, argnums=1), in_dims=(None, 0, 0, None, None))(model, params, prior, x, y)
    for i in range(MEMBERS):
        alone = grad(_loss, argnums=1)(model, _member(params, i), _member(prior, i), x, y)
        for k in alone:
            assert torch.allclose(per_member[k][i], alone[k], atol=1e-6)
    compiled = torch.compile(
        lambda p, m: fprune.masked_call(model, p, m, (x,)), fullgraph=True, backend="aot_eager"
    )
    p0, m0 = _member(params, 0), _member(prior, 0)
    assert torch.allclose(compiled(p0, m0), fprune.masked_call(model, p0, m0, (x,)))


def test_masks_computed_inside_grad_do_not_break_it():
    model = _mlp(1)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(4, 6), torch.randn(4, 3)

    def loss(p):
        masks = fprune.l1_unstructured(p, 0.5, where=_weights)  # masks of the traced params
        return _loss(model, p, masks, x, y)

    g = grad(loss)(params)
    masks = fprune.l1_unstructured(params, 0.5, where=_weights)
    assert (g["0.weight"][~masks["0.weight"]] == 0).all()
