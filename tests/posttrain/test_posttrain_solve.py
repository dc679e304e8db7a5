"""fprune.reconstruct.sparsegpt's blocked solve on wider layers: sub-blocks of the column sweep
and the triangular inverse by halves give the plain column-by-column reference's result."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fprune.reconstruct import sparsegpt
from posttrain_helpers import correlated_inputs, hessian_of, sparsegpt_columnwise


def layer(rows, cols, seed):
    x = correlated_inputs(4 * cols, cols, outliers=2, seed=seed)
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed + 1))
    return w, hessian_of(x).float()


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    cols=st.sampled_from([17, 40, 72]),
    blocksize=st.integers(1, 80),
    how=st.sampled_from(["amount", (2, 4), (1, 3), "mask"]),
)
def test_wide_layers_equal_the_columnwise_reference(seed, cols, blocksize, how):
    w, h = layer(10, cols, seed)
    if how == "amount":
        kwargs: dict = {"amount": 0.5}
    elif how == "mask":
        kwargs = {"mask": torch.rand(w.shape, generator=torch.Generator().manual_seed(seed)) > 0.5}
    else:
        if cols % how[1]:
            w, h = w[:, : cols - cols % how[1]], h[: cols - cols % how[1], : cols - cols % how[1]]
        kwargs = {"n_m": how}
    got, keep = sparsegpt(w, h, blocksize=blocksize, **kwargs)
    want, want_keep = sparsegpt_columnwise(w, h, blocksize=blocksize, **kwargs)
    assert torch.equal(keep, want_keep)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    assert got.is_contiguous() and keep.is_contiguous()


@pytest.mark.parametrize("cols", [255, 256, 257, 600])
def test_factor_of_a_hessian_wider_than_one_triangular_solve(cols):
    # Above 256 inputs the triangular factor is inverted by halves (products of the halves).
    w, h = layer(6, cols, seed=cols)
    got, keep = sparsegpt(w, h, 0.5)
    want, want_keep = sparsegpt_columnwise(w, h, amount=0.5)
    assert torch.equal(keep, want_keep)
    torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)


def test_bfloat16_weight_comes_back_contiguous_in_its_dtype():
    w, h = layer(8, 40, seed=3)
    got, keep = sparsegpt(w.bfloat16(), h, 0.5)
    assert got.dtype == torch.bfloat16 and got.is_contiguous() and got.shape == w.shape
    assert (got[~keep] == 0).all()
