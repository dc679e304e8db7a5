"""Shared helpers of the post-training tests: plain references and calibration data.

The references are written for clarity, in float64, independently of fprune's code.
"""

from __future__ import annotations

import torch


def correlated_inputs(rows: int, features: int, *, outliers: int = 0, seed: int = 0) -> torch.Tensor:
    """Inputs with correlated features (a random mixing of a few latent factors plus noise) and
    ``outliers`` features scaled up 20x, a stand-in for the outlier features of language models."""
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(rows, max(2, features // 4), generator=g)
    x = latent @ torch.randn(latent.shape[1], features, generator=g) + 0.3 * torch.randn(
        rows, features, generator=g
    )
    if outliers:
        chosen = torch.randperm(features, generator=g)[:outliers]
        x[:, chosen] *= 20.0
    return x


def hessian_of(x: torch.Tensor) -> torch.Tensor:
    """2/n sum x x^T in float64."""
    x = x.double().reshape(-1, x.shape[-1])
    return 2.0 / x.shape[0] * x.T @ x


def relative_error(x: torch.Tensor, dense: torch.Tensor, pruned: torch.Tensor) -> float:
    """||x W^T - x W'^T||^2 / ||x W^T||^2 (weights (out, in)), in float64."""
    x, dense, pruned = x.double(), dense.double(), pruned.double()
    return float(((x @ (dense - pruned).T) ** 2).sum() / ((x @ dense.T) ** 2).sum())


def lowest_first(scores: torch.Tensor, k: int) -> torch.Tensor:
    """True at the k lowest of ``scores`` (flattened row-major), ties: the earlier first."""
    flat = scores.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda i: (flat[i], i))
    prune = torch.zeros(len(flat), dtype=torch.bool)
    prune[order[:k]] = True
    return prune.view(scores.shape)


def sparsegpt_columnwise(weight, hessian, amount=None, n_m=None, mask=None, blocksize=128, damp=0.01):
    """SparseGPT without lazy batch updates: every column's error goes into every later column
    at once (float64). The unstructured mask is chosen per block of ``blocksize`` columns from
    the weights as they are when the block starts; N:M masks at every m-th column."""
    W = weight.double().clone()
    H = hessian.double().clone()
    cols = W.shape[1]
    dead = torch.diag(H) == 0
    for j in torch.nonzero(dead).flatten().tolist():
        H[j, j] = 1.0
        W[:, j] = 0.0
    H += damp * torch.diag(H).mean() * torch.eye(cols, dtype=torch.float64)
    U = torch.linalg.cholesky(torch.linalg.inv(H), upper=True)
    if n_m is not None:
        blocksize = -(-blocksize // n_m[1]) * n_m[1]
    prune = torch.zeros_like(W, dtype=torch.bool)
    for start in range(0, cols, blocksize):
        stop = min(start + blocksize, cols)
        if mask is not None:
            prune[:, start:stop] = ~mask[:, start:stop]
        elif amount is not None:
            block = W[:, start:stop] ** 2 / torch.diag(U)[start:stop] ** 2
            prune[:, start:stop] = lowest_first(block, round(amount * block.numel()))
        for j in range(start, stop):
            if n_m is not None and (j - start) % n_m[1] == 0:
                n, m = n_m
                group = W[:, j : j + m] ** 2 / torch.diag(U)[j : j + m] ** 2
                for r in range(W.shape[0]):
                    prune[r, j : j + m] = lowest_first(group[r : r + 1], m - n)[0]
            q = torch.where(prune[:, j], 0.0, W[:, j])
            err = (W[:, j] - q) / U[j, j]
            W[:, j:] -= err[:, None] * U[j, j:][None, :]
            W[:, j] = q
    return W, ~prune
