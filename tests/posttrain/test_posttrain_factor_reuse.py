"""sparsegpt reuses the factor of the hessian it factored last when the next call passes the same
hessian tensor, unchanged, with the same damp and dtype (q, k and v share one hessian): the
results are those of a fresh factorization, and anything else factors again."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

from fprune import _factor
from fprune.reconstruct import sparsegpt
from posttrain_helpers import correlated_inputs, hessian_of


@pytest.fixture
def counted(monkeypatch):
    calls = []
    original = _factor._damped_factor

    def damped_factor(H, damp, traced=False):
        calls.append(damp)
        return original(H, damp, traced)

    monkeypatch.setattr(_factor, "_damped_factor", damped_factor)
    _factor._LAST_FACTOR.clear()
    return calls


def _layer(seed: int, rows: int = 6, cols: int = 24):
    H = hessian_of(correlated_inputs(64, cols, seed=seed)).float()
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)), H


def test_the_same_hessian_is_factored_once_with_the_results_of_a_fresh_factor(counted):
    w, H = _layer(0)
    w2 = torch.randn(10, 24, generator=torch.Generator().manual_seed(1))
    first = sparsegpt(w, H, 0.5)
    second = sparsegpt(w2, H, 0.5, blocksize=8)
    assert len(counted) == 1
    fresh = sparsegpt(w2, H.clone(), 0.5, blocksize=8)  # another tensor: factored again
    assert len(counted) == 2
    for a, b in zip(second, fresh, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(sparsegpt(w, H.clone(), 0.5)[0], first[0])


def test_a_changed_hessian_another_damp_or_dtype_is_factored_again(counted):
    w, H = _layer(2)
    sparsegpt(w, H, 0.5)
    H.mul_(2.0)  # in place: its version counter moves
    changed = sparsegpt(w, H, 0.5)
    assert len(counted) == 2
    assert torch.equal(changed[0], sparsegpt(w, H.clone(), 0.5)[0])
    sparsegpt(w, H, 0.5, damp=0.05)
    sparsegpt(w.double(), H, 0.5)
    assert len(counted) == 5


def test_a_reused_factor_warns_as_its_factorization_did(counted):
    w = torch.randn(4, 8)
    H = torch.ones(8, 8)  # rank one: damp=1e-9 cannot factor it in float32
    for _ in range(2):
        with pytest.warns(UserWarning, match="could not be factored with damp=1e-09"):
            sparsegpt(w, H, 0.5, damp=1e-9)
    assert counted.count(1e-9) == 1


def test_the_factor_is_released_with_its_hessian(counted):
    w, H = _layer(3)
    sparsegpt(w, H, 0.5)
    assert _factor._LAST_FACTOR
    del H
    gc.collect()
    assert not _factor._LAST_FACTOR
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sparsegpt(w, _layer(3)[1], 0.5)
