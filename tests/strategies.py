"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple)
matrix_shapes = st.lists(st.integers(1, 6), min_size=2, max_size=3).map(tuple)


@st.composite
def tensors(draw, shape_strategy=shapes, dtype=torch.float32, ties=None):
    """A tensor whose values often tie (few distinct levels), sometimes include 0, -0 and NaN."""
    shape = draw(shape_strategy)
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    levels = draw(st.sampled_from([2, 5, 1000])) if ties is None else ties
    values = torch.randint(-levels, levels + 1, shape, generator=gen).to(torch.float64) / levels
    if draw(st.booleans()):
        values = values + torch.randn(shape, generator=gen, dtype=torch.float64) * 1e-3
    if draw(st.integers(0, 9)) == 0:
        values.view(-1)[0] = float("nan")
    if draw(st.integers(0, 4)) == 0:
        values.view(-1)[-1] = -0.0
    return values.to(dtype)


def amounts(n: int):
    """A float fraction or an int count valid for ``n`` entries."""
    return st.one_of(st.floats(0.0, 1.0), st.integers(0, n))


@st.composite
def prior_masks(draw, shape):
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen) < draw(st.sampled_from([0.3, 0.7, 1.0]))
