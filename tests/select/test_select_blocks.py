"""The Blocks scope: the lowest-norm tiles of each matrix, against a plain reference written
here (tile by tile in Python), count-exact (hypothesis), and the same masks under vmap and
torch.compile."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.func import vmap

import fprune
from fprune.select import Blocks, select


def reference(scores, amount, tile, p=2, prior=None):
    """Prune mask by hand: each tile's p-norm (pruned entries as 0), a tile alive while any entry
    is, round(amount * alive) more tiles pruned, lowest first, ties to the first tile."""
    matrix = scores.reshape(scores.shape[0], -1).double()
    keep = None if prior is None else prior.reshape(matrix.shape)
    rows, cols = matrix.shape
    bh, bw = tile
    tiles = []
    for r in range(0, rows, bh):
        for c in range(0, cols, bw):
            block = matrix[r : r + bh, c : c + bw]
            alive = True if keep is None else bool(keep[r : r + bh, c : c + bw].any())
            if keep is not None:
                block = torch.where(keep[r : r + bh, c : c + bw], block, 0.0)
            norm = float((block.abs() ** p).sum())
            tiles.append((r, c, alive, norm))
    left = sum(alive for *_, alive, _ in tiles)
    count = amount if isinstance(amount, int) else round(amount * left)
    order = sorted(range(len(tiles)), key=lambda t: (tiles[t][2], tiles[t][3], t))  # dead first
    pruned = set(order[: count + (len(tiles) - left)])
    mask = torch.ones(rows, cols, dtype=torch.bool)
    for t in pruned:
        r, c, *_ = tiles[t]
        mask[r : r + bh, c : c + bw] = False
    if keep is not None:
        mask &= keep
    return mask.reshape(scores.shape)


@pytest.mark.parametrize("shape", [(8, 12), (5, 7), (6, 2, 3), (1, 9), (3, 3)])
@pytest.mark.parametrize("tile", [(2, 3), (4, 4), (1, 1), (5, 1)])
@pytest.mark.parametrize("amount", [0.0, 0.3, 0.5, 1.0, 2])
def test_blocks_equal_the_reference(shape, tile, amount):
    g = torch.Generator().manual_seed(sum(shape) + sum(tile))
    w = torch.randn(shape, generator=g)
    w.view(-1)[::5] = 0.0  # zero tiles tie: the first goes first
    tiles = math.ceil(shape[0] / tile[0]) * math.ceil(math.prod(shape[1:]) / tile[1])
    if isinstance(amount, int) and amount > tiles:
        amount = tiles
    rows, cols = shape[0], math.prod(shape[1:])
    if tile[0] >= rows and tile[1] >= cols and tile != (rows, cols):  # one tile larger than the matrix
        with pytest.raises(ValueError, match=r"Expected shape \(the tile\) to fit in scores\['w'\]"):
            select({"w": w}, amount, scope=Blocks(tile))
        return
    got = select({"w": w}, amount, scope=Blocks(tile))["w"]
    assert torch.equal(got, reference(w, amount, tile))


@pytest.mark.parametrize("p", [1, 2, 3.5])
def test_blocks_with_prior_masks_norm_orders_and_per_leaf_amounts(p):
    g = torch.Generator().manual_seed(1)
    params = {"a": torch.randn(6, 8, generator=g), "b": torch.randn(4, 2, 5, generator=g)}
    prior = {name: torch.rand(t.shape, generator=g) > 0.4 for name, t in params.items()}
    prior["a"][:2, :4] = False  # a dead tile: counted as pruned, the amount is of the others
    scope = Blocks((2, 4), p=p)
    got = fprune.select.select(params, {"a": 0.5, "b": 1}, scope=scope, masks=prior)
    assert torch.equal(got["a"], reference(params["a"], 0.5, (2, 4), p, prior["a"]))
    assert torch.equal(got["b"], reference(params["b"], 1, (2, 4), p, prior["b"]))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 9),
    cols=st.integers(1, 9),
    bh=st.integers(1, 4),
    bw=st.integers(1, 4),
    amount=st.floats(0.0, 1.0),
    ties=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_blocks_prune_exactly_round_amount_tiles_whole(rows, cols, bh, bw, amount, ties, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g)
    if ties:
        w = w.round()
    assume(bh < rows or bw < cols or (bh, bw) == (rows, cols))  # a tile larger than the matrix raises
    mask = select({"w": w}, amount, scope=Blocks((bh, bw)))["w"]
    tr, tc = -(-rows // bh), -(-cols // bw)
    padded = torch.zeros(tr * bh, tc * bw, dtype=torch.bool)
    padded[:rows, :cols] = mask
    per_tile = padded.view(tr, bh, tc, bw).permute(0, 2, 1, 3).reshape(tr, tc, -1)
    whole = torch.ones(tr * bh, tc * bw, dtype=torch.bool)
    whole[:rows, :cols] = False
    filler = whole.view(tr, bh, tc, bw).permute(0, 2, 1, 3).reshape(tr, tc, -1)
    kept = (per_tile & ~filler).any(-1)
    assert torch.equal((per_tile | filler).all(-1), kept)  # a tile is kept or pruned whole
    assert int((~kept).sum()) == round(amount * tr * tc)


def test_blocks_trace_under_vmap_and_compile():
    f = lambda x, a: select({"w": x}, a, scope=Blocks((2, 3)))["w"]
    xs = torch.randn(4, 6, 9, generator=torch.Generator().manual_seed(3))
    eager = torch.stack([f(x, 0.5) for x in xs])
    assert torch.equal(vmap(lambda x: f(x, 0.5))(xs), eager)
    assert torch.equal(torch.compile(f, backend="eager")(xs[0], 0.5), eager[0])
    assert torch.equal(f(xs[1], torch.tensor(0.5)), eager[1])  # a tensor amount: the traced path


def test_blocks_bad_arguments_raise_naming_them():
    with pytest.raises(TypeError, match="shape"):
        Blocks(4)
    with pytest.raises(ValueError, match="positive"):
        Blocks((0, 2))
    with pytest.raises(ValueError, match="p to be a positive"):
        Blocks((2, 2), p=0)
    with pytest.raises(ValueError, match=r"scores\['b'\] has shape \(4,\).*where="):
        select({"w": torch.ones(2, 2), "b": torch.ones(4)}, 0.5, scope=Blocks((2, 2)))
    with pytest.raises(ValueError, match="tiles"):
        select({"w": torch.ones(2, 2)}, 5, scope=Blocks((1, 1)))


def test_blocks_is_a_scope_that_takes_a_fraction():
    assert isinstance(Blocks((2, 2)), fprune.select.Scope) and Blocks((2, 2)).fractional
    assert not fprune.select.NM(2, 4).fractional
