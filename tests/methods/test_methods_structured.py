"""Structured masks: whole channels, exact channel counts, prior masks as torch's container does."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune
from tests import reference
from tests.strategies import matrix_shapes, prior_masks, tensors

NORMS = [1, 2, 3.5, math.inf, -math.inf, "fro"]


def _expected_ln(w, amount, n, dim, prior=None, scores=None):
    dim = dim % w.dim()
    others = [d for d in range(w.dim()) if d != dim]
    values = scores if scores is not None else (w if prior is None else torch.where(prior, w, 0.0))
    alive = None if prior is None else prior.any(dim=others)
    keep = reference.channel_lowest(torch.norm(values, p=n, dim=others), amount, alive)
    shape = [1] * w.dim()
    shape[dim] = -1
    full = keep.view(shape).expand(w.shape)
    return full if prior is None else full & prior


@given(st.data(), st.sampled_from(NORMS))
def test_ln_structured_matches_reference(data, n):
    w = data.draw(tensors(matrix_shapes))
    dim = data.draw(st.integers(-w.dim(), w.dim() - 1))
    with_prior = data.draw(st.booleans())
    prior = data.draw(prior_masks(w.shape)) if with_prior else None
    channels = w.shape[dim]
    alive = (
        channels
        if prior is None
        else int(prior.any(dim=[d for d in range(w.dim()) if d != dim % w.dim()]).sum())
    )
    amount = data.draw(st.one_of(st.floats(0, 1), st.integers(0, alive)))
    got = fprune.ln_structured({"w": w}, amount, n, dim, masks=None if prior is None else {"w": prior})["w"]
    assert torch.equal(got, _expected_ln(w, amount, n, dim, prior))
    if prior is not None:
        assert not (got & ~prior).any()


@given(st.data())
def test_ln_structured_importance_scores_are_used_raw(data):
    w = data.draw(tensors(matrix_shapes))
    scores = data.draw(tensors(st.just(w.shape)))
    prior = data.draw(prior_masks(w.shape))
    got = fprune.ln_structured(w, 0.5, 2, 0, importance_scores=scores, masks=prior)
    assert torch.equal(got, _expected_ln(w, 0.5, 2, 0, prior, scores))


@given(st.data())
def test_ln_structured_masks_nest_as_amount_grows(data):
    w = data.draw(tensors(matrix_shapes))
    lo, hi = sorted([data.draw(st.floats(0, 1)), data.draw(st.floats(0, 1))])
    small, large = fprune.ln_structured(w, lo, 1, 0), fprune.ln_structured(w, hi, 1, 0)
    assert not (large & ~small).any()


@given(st.data())
def test_random_structured_prunes_whole_channels_exactly(data):
    w = data.draw(tensors(matrix_shapes))
    dim = data.draw(st.integers(0, w.dim() - 1))
    amount = data.draw(st.one_of(st.floats(0, 1), st.integers(0, w.shape[dim])))
    seed = data.draw(st.integers(0, 1000))
    got = fprune.random_structured(w, amount, dim, generator=seed)
    others = [d for d in range(w.dim()) if d != dim]
    kept = got.all(dim=others)
    assert torch.equal(kept, got.any(dim=others)), "channels are pruned whole"
    assert int((~kept).sum()) == reference.count(amount, w.shape[dim])
    assert torch.equal(got, fprune.random_structured(w, amount, dim, generator=seed))


def test_random_structured_with_prior_only_prunes_alive_channels():
    w = torch.randn(6, 3)
    prior = torch.ones(6, 3, dtype=torch.bool)
    prior[1] = False
    prior[4, 0] = False
    for seed in range(20):
        got = fprune.random_structured(w, 2, 0, masks=prior, generator=seed)
        assert not (got & ~prior).any()
        assert int((~got.any(dim=1)).sum()) == 3  # the dead channel 1 and 2 of the 5 alive ones


def test_structured_where_skips_biases():
    params = {"weight": torch.randn(4, 3), "bias": torch.randn(4)}
    masks = fprune.ln_structured(params, 0.5, 2, 0, where=lambda n, p: p.dim() > 1)
    assert masks["bias"].all() and int((~masks["weight"].all(dim=1)).sum()) == 2
    masks = fprune.random_structured(params, 1, -1, generator=0, where=lambda n, p: n == "weight")
    assert int((~masks["weight"].all(dim=0)).sum()) == 1


def test_conv_weight_output_channels():
    w = torch.randn(8, 3, 3, 3)
    w[2] *= 0.01
    w[5] *= 0.01
    m = fprune.ln_structured(w, 2, 1, 0)
    assert torch.equal(m.all(dim=(1, 2, 3)), torch.tensor([True, True, False, True, True, False, True, True]))


@pytest.mark.parametrize("n", ["nuc"])
def test_nuclear_norm_on_matrices(n):
    w = torch.randn(5, 4, 3)
    got = fprune.ln_structured(w, 2, n, 0)
    assert torch.equal(got, _expected_ln(w, 2, n, 0))


def test_block_structured_refuses_a_tile_larger_than_the_whole_matrix():
    # One tile over the whole 8 x 8 weight prunes all of it or nothing: round(0.5 * 1) = 0 tiles,
    # round(0.6 * 1) = 1. The call names the argument and the layer instead, and changes nothing.
    params = {"fc.weight": torch.randn(8, 8), "head.weight": torch.randn(32, 32)}
    copies = {k: v.clone() for k, v in params.items()}
    for shape in [(16, 16), (8, 9), (9, 8)]:
        with pytest.raises(ValueError, match=r"shape \(the tile\) to fit in params\['fc\.weight'\]"):
            fprune.block_structured(params, 0.5, shape)
    assert all(torch.equal(params[k], copies[k]) for k in params)
    # A conv weight is its (out_channels, rest) matrix: 4 x 18 here.
    with pytest.raises(ValueError, match=r"4 x 18 as a matrix"):
        fprune.block_structured({"conv": torch.randn(4, 2, 3, 3)}, 0.5, (4, 32))
    # The fix the message gives leaves the small layer out; the big one is still cut in tiles.
    where = lambda name, p: p.dim() > 1 and (p.shape[0] > 16 or p[0].numel() > 16)
    masks = fprune.block_structured(params, 0.5, (16, 16), where=where)
    assert masks["fc.weight"].all() and int((~masks["head.weight"]).sum()) == 2 * 16 * 16


def test_block_structured_keeps_tiles_that_fit_in_one_dim_or_exactly():
    w = torch.arange(1.0, 65.0).reshape(8, 8)
    # A tile as tall as the matrix prunes whole columns of tiles; one exactly the matrix's size is
    # one tile, as asked.
    assert int((~fprune.block_structured(w, 0.5, (16, 2))).sum()) == 2 * 8 * 2
    assert not fprune.block_structured(w, 1.0, (8, 8)).any()
