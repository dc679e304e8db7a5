"""Private: the factor of SparseGPT's inverse hessian (:func:`fprune.reconstruct.sparsegpt`).

* :func:`eager_factor`: the upper Cholesky factor of the damped inverse hessian in an eager
  call, with more damping where the factorization fails (and a warning), reused for the next
  call given the same hessian tensor;
* :func:`traced_factor`: the same under a transform, where nothing can be read to retry;
* :func:`finite`: whether every entry of a tensor is finite, in two reductions.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

from fprune import _torch

# The damping tried, after the one asked for, when the damped hessian cannot be factored.
_RETRY_DAMPING = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
# Under a transform nothing can be read to retry: a failed factorization takes this one.
_TRACED_FALLBACK = 1.0


# The factor of the hessian an eager call factored last, for the next call with the same hessian
# (the q, k and v projections of a block share one, as do gate and up): (a weak reference to
# the hessian, its version counter, damp, dtype, the factor, the dead columns, the damping used).
# Dropped when that hessian is freed, so it holds no memory past the layers that use it.
_LAST_FACTOR: dict[str, tuple] = {}


def eager_factor(hessian: torch.Tensor, dtype: torch.dtype, damp: float, what: str) -> tuple:
    """``(U, dead)`` for an eager call: the inverse factor of the damped hessian with its zero
    columns set to 1 and those columns, reused from the last call when that factored the same
    hessian tensor, unchanged since (its version counter), with the same damp and dtype."""
    version = _torch.tensor_version(hessian)
    entry = _LAST_FACTOR.get("last")
    if (
        entry is not None
        and version is not None
        and entry[0]() is hessian
        and entry[1:4] == (version, damp, dtype)
    ):
        U, dead, used = entry[4:]
        if used != damp:
            warnings.warn(_damping_message(what, damp, used), UserWarning, stacklevel=4)
        return U, dead
    _LAST_FACTOR.clear()
    H = hessian.detach().to(dtype, copy=True)
    dead = H.diagonal() == 0
    H.diagonal().add_(dead.to(dtype))  # H[dead, dead] = 1 (H is a copy)
    U, used = _eager_inverse_factor(H, damp, what)
    del H
    if version is not None:

        def drop(ref: Any) -> None:
            if _LAST_FACTOR.get("last", (None,))[0] is ref:
                _LAST_FACTOR.clear()

        _LAST_FACTOR["last"] = (weakref.ref(hessian, drop), version, damp, dtype, U, dead, used)
    return U, dead


def _damping_message(what: str, damp: float, used: float) -> str:
    return (
        f"sparsegpt: the hessian of the {what} could not be factored with damp={damp}; "
        f"damp={used} was used. Calibrate with more rows, or pass damp={used} to silence this."
    )


def _eager_inverse_factor(H: torch.Tensor, damp: float, what: str) -> tuple[torch.Tensor, float]:
    """The upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1`` in an eager call,
    with more damping where that fails (see :func:`fprune.reconstruct.sparsegpt`), and the damping used."""
    tried = []
    for d in (damp, *[r for r in _RETRY_DAMPING if r > damp]):
        tried.append(d)
        U, ok = _damped_factor(H, d)
        if bool(ok):
            if d != damp:
                # past _eager_inverse_factor, eager_factor, sparsegpt and torch.no_grad's wrapper
                warnings.warn(_damping_message(what, damp, d), UserWarning, stacklevel=5)
            return U, d
    raise ValueError(
        f"sparsegpt: the Cholesky factorization of the damped hessian of the {what} failed with "
        f"every damping tried ({', '.join(map(str, tried))}): the hessian is not positive "
        f"semi-definite. Check it (hessians() gives 2/n sum x x^T), or raise damp above {tried[-1]}."
    )


def traced_factor(H: torch.Tensor, damp: float) -> torch.Tensor:
    """The upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1`` under a transform, where
    nothing can be read to retry: where the factorization fails, the one with ``damp`` raised to
    ``_TRACED_FALLBACK`` (see :func:`fprune.reconstruct.sparsegpt`)."""
    U, ok = _damped_factor(H, damp, True)
    V, _ = _damped_factor(H, max(damp, _TRACED_FALLBACK), True)
    return torch.where(ok, U, V)


def _damped_factor(H: torch.Tensor, damp: float, traced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1`` and whether it worked.

    With ``A = R R^T``, ``R`` upper triangular (the Cholesky factorization of ``A`` with the
    order of its inputs reversed), ``A^-1 = R^-T R^-1``, so the wanted factor is ``U = R^-1``:
    :func:`_inverse_of_reversed_factor` computes it directly, mostly in matrix products, where
    inverting ``A`` and factoring the inverse take two factorizations and LAPACK's ``potri``,
    several times slower on CPUs. Two ``(in, in)`` matrices besides ``H`` and a quarter's
    temporaries."""
    A = H.clone()
    A.diagonal(dim1=-2, dim2=-1).add_(damp * H.diagonal(dim1=-2, dim2=-1).mean(-1, keepdim=True))
    U = torch.zeros_like(A)
    failed = _inverse_of_reversed_factor(A, U, traced)
    del A
    ok = ~failed & finite(U)
    return U, ok


# Below this size the factor is one Cholesky factorization and one triangular solve.
_FACTOR_LEAF = 256


def _inverse_of_reversed_factor(A: torch.Tensor, out: torch.Tensor, traced: bool) -> torch.Tensor:
    """Write ``R^-1`` into ``out`` (zero below its diagonal), ``A = R R^T`` with ``R`` upper
    triangular; ``A`` is overwritten. Returns whether a Cholesky factorization failed (a 0-dim
    bool tensor). By halves: with ``R = [[R11, R12], [0, R22]]``, ``A22 = R22 R22^T``,
    ``R12 = A12 R22^-T`` and ``A11 - R12 R12^T = R11 R11^T``, and ``R^-1 = [[R11^-1,
    -R11^-1 R12 R22^-1], [0, R22^-1]]``: four products of halves a level."""
    n = A.shape[-1]
    if n <= _FACTOR_LEAF:
        L, info = torch.linalg.cholesky_ex(A.flip(-2, -1))  # J A J = L L^T, so R = J L J
        eye = torch.eye(n, dtype=A.dtype, device=A.device).expand_as(L)
        out.copy_(torch.linalg.solve_triangular(L, eye, upper=False).flip(-2, -1))
        return info != 0
    h = n // 2
    failed = _inverse_of_reversed_factor(A[..., h:, h:], out[..., h:, h:], traced)
    Y22 = out[..., h:, h:]
    R12 = A[..., :h, h:] @ Y22.mT
    if traced:
        A[..., :h, :h] -= R12 @ R12.mT
    else:
        A[:h, :h].addmm_(R12, R12.T, alpha=-1.0)
    failed = failed | _inverse_of_reversed_factor(A[..., :h, :h], out[..., :h, :h], traced)
    out[..., :h, h:] = (out[..., :h, :h] @ R12).neg_() @ Y22
    return failed


def finite(t: torch.Tensor) -> torch.Tensor:
    """Whether every entry of ``t`` is finite (a 0-dim bool tensor): its largest and smallest
    entries are (NaN propagates through both), two reductions and no ``t``-sized mask."""
    if t.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=t.device)
    return torch.isfinite(t.amax((-2, -1))) & torch.isfinite(t.amin((-2, -1)))
