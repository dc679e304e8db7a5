"""Property: every mask function gives the same masks eagerly (streaming select), under vmap and
compiled (stable-sort path), on tensors full of ties, NaN, -0.0 and prior masks."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import vmap

import fprune
from tests.helpers import same
from tests.strategies import matrix_shapes, prior_masks, tensors

FUNCTIONS = {
    "l1": lambda p, m, a, s: fprune.l1_unstructured(p, a, masks=m),
    "l1_scores": lambda p, m, a, s: fprune.l1_unstructured(
        p, a, masks=m, importance_scores={k: v.flip(-1) for k, v in p.items()}
    ),
    "global": lambda p, m, a, s: fprune.global_unstructured(p, a, masks=m),
    "global_l1_normalized": lambda p, m, a, s: fprune.global_unstructured(p, a, masks=m, normalize="l1"),
    "random": lambda p, m, a, s: fprune.random_unstructured(p, a, masks=m, generator=s),
    "ln": lambda p, m, a, s: fprune.ln_structured(p, a, 1, -1, masks=m),
    "random_structured": lambda p, m, a, s: fprune.random_structured(p, a, 0, masks=m, generator=s),
}


@st.composite
def problems(draw):
    shape = draw(matrix_shapes)
    params = {"a": draw(tensors(st.just(shape))), "b": draw(tensors(st.just(shape)))}
    masks = {"a": draw(prior_masks(shape)), "b": draw(prior_masks(shape))} if draw(st.booleans()) else None
    amount = draw(st.floats(0, 1))
    return params, masks, amount


@given(st.sampled_from(sorted(FUNCTIONS)), problems(), st.integers(0, 2**31 - 1))
def test_vmap_equals_eager(name, problem, seed):
    fn = FUNCTIONS[name]
    params, masks, amount = problem
    other = {k: v.flip(0) for k, v in params.items()}  # a second, different member
    stacked = {k: torch.stack([params[k], other[k]]) for k in params}
    seeds = torch.tensor([seed, seed + 1])
    if masks is None:
        batched = vmap(lambda p, s: fn(p, None, amount, s))(stacked, seeds)
    else:
        stacked_masks = {k: torch.stack([masks[k], masks[k]]) for k in masks}
        batched = vmap(lambda p, m, s: fn(p, m, amount, s))(stacked, stacked_masks, seeds)
    for i, member in enumerate((params, other)):
        alone = fn(member, masks, amount, seeds[i])
        assert same({k: v[i] for k, v in batched.items()}, alone), i


@settings(max_examples=12)
@given(st.sampled_from(sorted(FUNCTIONS)), problems())
def test_compiled_equals_eager(name, problem):
    fn = FUNCTIONS[name]
    params, masks, amount = problem
    torch._dynamo.reset()
    compiled = torch.compile(lambda p, m, s: fn(p, m, amount, s), fullgraph=True, backend="eager")
    seed = torch.tensor(3)
    assert same(compiled(params, masks, seed), fn(params, masks, amount, seed))
