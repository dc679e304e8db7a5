"""Layer reconstruction after pruning: SparseGPT's mask-and-update, and least squares on a mask.

A linear layer with weight ``W`` (``(out, in)``) sees calibration inputs ``x`` (rows of ``in``
features). Pruning it to ``W'`` costs, in each output row ``i``, the squared error
``sum_x (x . (W_i - W'_i))^2 / n = (W_i - W'_i) H (W_i - W'_i)^T / 2`` with ``H = 2/n sum x x^T``
(:func:`fprune.calibration.hessians`). Both functions here lower that error by changing the
weights that are kept:

* :func:`sparsegpt` (Frantar & Alistarh 2023, IST-DASLab/sparsegpt ``sparsegpt.py``) chooses
  the mask and updates the kept weights column by column with the inverse hessian (optimal
  brain surgeon updates made cheap by one Cholesky factor shared by all rows);
* :func:`refine` solves the least-squares problem on a fixed mask exactly (preconditioned
  conjugate gradient on the kept entries of every row, as ALPS does after its ADMM,
  mazumder-lab/ALPS ``alps.py``), so it can only lower the error of the weights it starts from.

Both are pure functions of tensors: nothing given is modified, and they run under
``torch.func.vmap`` (over stacked weights and hessians of layers of one shape).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from fprune import _amount, _factor, _torch
from fprune.select import lowest

__all__ = ["refine", "sparsegpt"]


@torch.no_grad()
def sparsegpt(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    amount: float | torch.Tensor | None = None,
    *,
    n_m: tuple[int, int] | None = None,
    mask: torch.Tensor | None = None,
    blocksize: int = 128,
    damp: float = 0.01,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT: prune a layer's weight and update the kept entries to reconstruct its output.

    The algorithm of IST-DASLab/sparsegpt's ``SparseGPT.fasterprune``:

    1. Inputs whose ``H_jj == 0`` are dead (never nonzero in calibration): their weights are
       zeroed and ``H_jj`` set to 1.
    2. ``H += damp * mean(diag H) * I``; ``U`` is the upper Cholesky factor of ``H^-1``.
    3. Columns are taken in blocks of ``blocksize``. At the start of a block the mask of the
       block is chosen from the current weights: the lowest ``w^2 / U_jj^2`` are pruned. For
       N:M the choice is made at every ``m``-th column instead, in each row's next ``m``
       columns. Then column by column: the pruned entries' error ``err = (w - q) / U_jj``
       (``q``: the column with its pruned entries zeroed) is pushed into the block's later
       columns (``W[:, j:] -= err U[j, j:]``), and after the block into all later columns at
       once (``W[:, end:] -= Err U[block, end:]``, the lazy batch update).

    Counts (the library's rule): with ``amount``, each block of ``rows x width`` entries prunes
    ``round(amount * rows * width)`` (Python's ``round``, half to even), the lowest scores first
    and, among equal scores, the earlier entry (row-major within the block) first, so the total
    is within half an entry per block of ``amount * weight.numel()``. The reference prunes
    every entry at or below the score of rank ``int(amount * n)``: one entry more per block,
    and ties. With ``n_m=(n, m)`` every group of ``m`` consecutive inputs of a row keeps its
    ``n`` highest (ties: the earlier is pruned first); 2:4 is ``n_m=(2, 4)`` (the reference's
    ``prunen`` is the number pruned, ``m - n``). Blocks are then widened to a multiple of
    ``m`` so that no group straddles two. The result equals the column-by-column update without
    lazy batches for every ``blocksize`` (to rounding).

    A ``Conv1D`` weight (transformers, GPT-2) is stored ``(in, out)``: pass ``weight.T`` and
    transpose both results back. Work is done in float32 (float64 for float64 inputs); the
    weight comes back in its own dtype, pruned entries exactly zero.

    When the damped hessian cannot be factored (it is singular, or nearly: too few calibration
    rows for the layer's width), eager calls retry with more damping, in ten-fold steps up to
    ``damp=100``, and warn with the damping that worked; if none does, a ``ValueError`` says
    what was tried. Under ``vmap`` or ``torch.compile`` nothing can be read back to retry: a
    failed factorization silently takes ``damp=1``. Never NaN weights from a failure.

    Layers that read one input share one hessian (a block's q, k and v projections): an eager
    call given the same hessian tensor as the call before it, unchanged since (its version
    counter) and with the same ``damp`` and dtype, reuses that call's factor instead of factoring
    again, with the same results (and the same warning). The factor is held only while that
    hessian tensor lives and until another hessian is factored.

    Args:
        weight: ``(out, in)`` floating-point weight.
        hessian: ``(in, in)`` symmetric positive semi-definite hessian of the layer's inputs
            (:func:`fprune.calibration.hessians`; any positive multiple gives the same result).
        amount: the fraction of each block to prune, a float in [0, 1] (or a 0-dim float tensor,
            to ``vmap`` over sparsity levels).
        n_m: ``(n, m)``: keep ``n`` of every ``m`` consecutive inputs of each row.
        mask: a fixed keep-mask of ``weight``'s shape (``True`` = kept): only the update for it.
        blocksize: columns per block (the reference's 128).
        damp: the damping, a fraction of the mean of ``diag H`` (the reference's ``percdamp``).

    Exactly one of ``amount``, ``n_m`` and ``mask`` is given.

    Returns:
        ``(weight, mask)``: the updated weight (``weight``'s shape and dtype, zero where pruned)
        and its ``torch.bool`` keep-mask.

    Raises:
        TypeError / ValueError: bad shapes, dtypes or arguments; a non-finite weight or hessian
            (eager calls); a hessian that cannot be factored with any damping tried.

    Warns:
        UserWarning: the hessian needed more damping than ``damp`` (naming the damping used).

    Example:
        >>> import torch, fprune
        >>> x = torch.tensor([[1.0, 2.0, 0.5, 0.0], [0.0, 1.0, 1.0, 1.0], [2.0, 0.0, 1.0, 3.0],
        ...                   [1.0, 1.0, 0.0, 2.0], [0.5, 3.0, 1.0, 0.0]])
        >>> h = 2 / 5 * x.T @ x
        >>> w = torch.tensor([[0.25, -2.0, 0.5, 1.0]])
        >>> new, keep = fprune.reconstruct.sparsegpt(w, h, 0.5)
        >>> keep
        tensor([[False,  True, False,  True]])
        >>> new                               # the kept weights absorb the pruned ones' share
        tensor([[ 0.0000, -1.9465,  0.0000,  1.2724]])
        >>> err = lambda v: float(((x @ (v - w).T) ** 2).sum())
        >>> round(err(new), 3), round(err(w * keep), 3)     # squared error vs zeroing alone
        (0.555, 1.953)
    """
    traced = _torch.is_traced([t for t in (weight, hessian, amount, mask) if isinstance(t, torch.Tensor)])
    rows, cols = _check_layer(weight, hessian, traced)
    chosen = [name for name, v in (("amount", amount), ("n_m", n_m), ("mask", mask)) if v is not None]
    if len(chosen) != 1:
        raise ValueError(
            f"Expected exactly one of amount (a fraction per block), n_m ((n, m)) and mask (a fixed "
            f"keep-mask), got {', '.join(chosen) if chosen else 'none'}."
        )
    if amount is not None:
        check_fraction(amount)
    nm = check_n_m(n_m, cols) if n_m is not None else None
    keep_given = _check_mask(mask, weight, traced) if mask is not None else None
    blocksize = check_positive_int(blocksize, "blocksize")
    damp = check_damp(damp)
    if nm is not None:
        blocksize = -(-blocksize // nm[1]) * nm[1]  # groups of m never straddle two blocks

    dtype = torch.promote_types(torch.promote_types(weight.dtype, hessian.dtype), torch.float32)
    if not traced:
        U, dead = _factor.eager_factor(hessian, dtype, damp, f"weight of shape {tuple(weight.shape)}")
        # The weight transposed, (in, out), so that a block of columns is a block of rows.
        WT = torch.empty((cols, rows), dtype=dtype, device=weight.device).copy_(weight.detach().T)
        WT.masked_fill_(dead.unsqueeze(1), 0.0)  # W[:, dead] = 0
        keepT = _sweep_eager(WT, U, amount, nm, keep_given, blocksize)
        new = torch.empty((rows, cols), dtype=weight.dtype, device=weight.device).copy_(WT.T)
        return new, keepT.T.contiguous()

    H = hessian.detach().to(dtype, copy=True)
    dead = H.diagonal() == 0
    H.diagonal().add_(dead.to(dtype))  # H[dead, dead] = 1 (H is a copy)
    W = weight.detach().to(dtype, copy=True)
    W = W.masked_fill(dead, 0.0)  # W[:, dead] = 0
    # Under vmap the loop writes in place into W: W must be batched wherever any input is.
    W = W + sum(
        torch.zeros_like(t, dtype=dtype).sum() for t in (H, amount, keep_given) if isinstance(t, torch.Tensor)
    )
    U = _factor.traced_factor(H, damp)
    del H
    u = U.diagonal()

    keep = torch.ones_like(W, dtype=torch.bool)
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        W1 = W[:, i1:i2].clone()
        U1 = U[i1:i2, i1:i2]
        u1 = u[i1:i2]
        if keep_given is not None:
            prune1 = ~keep_given[:, i1:i2]
        elif amount is not None:
            k = _amount.count(amount, rows * (i2 - i1), "entries", "a block of weight")
            prune1 = lowest(W1.square() / u1.square(), k)
        else:
            prune1 = torch.zeros_like(W1, dtype=torch.bool)
        _block_traced(W, W1, U, U1, u1, prune1, nm, i1, i2)
        keep[:, i1:i2] = ~prune1
    return W.to(weight.dtype), keep


@torch.no_grad()
def refine(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    mask: torch.Tensor,
    *,
    init: torch.Tensor | None = None,
    iters: int = 30,
    damp: float = 0.0,
) -> torch.Tensor:
    """The least-squares weights on a fixed mask: the layer's reconstruction error minimized.

    For each output row ``i`` with kept inputs ``S_i`` (``mask[i]``), minimizes
    ``(v - w_i) H (v - w_i)^T`` over ``v`` zero outside ``S_i`` (``w_i``: row ``i`` of the
    dense ``weight``, whose outputs are reconstructed): the normal equations
    ``H[S, S] v_S = H[S, :] w_i`` solved by conjugate gradient on the kept entries with a
    Jacobi (``diag H``) preconditioner, all rows at once, for a fixed number of ``iters``
    (no data-dependent stopping, so it runs under ``vmap`` and ``torch.compile``), starting
    from ``init`` (for instance :func:`sparsegpt`'s weights; default: ``weight * mask``). This
    is the back-solve ALPS (Meng et al. 2024, mazumder-lab/ALPS) runs on its final support.

    Conjugate gradient lowers the objective at every step (in exact arithmetic), so the result
    is never worse than ``init``; a last check per row, in float64, keeps ``init``'s row where
    rounding made the result worse. So the layer's reconstruction error on the calibration
    rows, ``(W' - W) H (W' - W)^T``, can only go down. ``damp > 0`` solves the damped system
    ``H + damp * mean(diag H) * I`` (a ridge that keeps the solution near ``init``'s norm on
    ill-conditioned hessians); the check still uses ``H`` itself.

    Args:
        weight: ``(out, in)`` dense weight whose outputs are reconstructed (a ``Conv1D`` weight
            transposed, as for :func:`sparsegpt`).
        hessian: ``(in, in)`` hessian of the layer's inputs (:func:`fprune.calibration.hessians`).
        mask: ``(out, in)`` keep-mask (``True`` = kept), fixed.
        init: ``(out, in)`` start point (its entries outside ``mask`` are ignored).
        iters: conjugate-gradient steps (a non-negative int; ``0`` returns ``init`` masked).
        damp: ridge, as a fraction of ``mean(diag H)``.

    Returns:
        The refined weight, ``weight``'s shape and dtype, exactly zero outside ``mask``.

    Raises:
        TypeError / ValueError: bad shapes, dtypes or arguments; non-finite inputs (eager calls).

    Example:
        >>> import torch, fprune
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> x = torch.randn(64, 8) @ torch.randn(8, 8)            # correlated inputs
        >>> h = 2 / 64 * x.T @ x
        >>> w = torch.randn(4, 8)
        >>> keep = fprune.l1_unstructured({"w": w}, 0.5)["w"]
        >>> new = fprune.reconstruct.refine(w, h, keep)
        >>> err = lambda v: float(((x @ (v - w).T) ** 2).sum())
        >>> round(err(new) / err(w * keep), 3)     # the error left, vs. zeroing alone
        0.716
        >>> bool((new[~keep] == 0).all())
        True
    """
    traced = _torch.is_traced([t for t in (weight, hessian, mask, init) if isinstance(t, torch.Tensor)])
    _check_layer(weight, hessian, traced)
    keep = _check_mask(mask, weight, traced)
    if init is not None:
        _check_like(init, weight, "init", traced)
    iters = check_positive_int(iters, "iters", zero_ok=True)
    damp = check_damp(damp)

    dtype = torch.promote_types(torch.promote_types(weight.dtype, hessian.dtype), torch.float32)
    W0 = weight.detach().to(dtype)
    H = hessian.detach().to(dtype)
    M = keep.to(dtype)
    X0 = (W0 if init is None else init.detach().to(dtype)) * M
    A = H.clone()
    A.diagonal().add_(damp * H.diagonal().mean())
    diag = A.diagonal()
    precondition = torch.where(diag > 0, 1.0 / torch.where(diag > 0, diag, 1.0), torch.ones_like(diag))

    X = X0
    R = ((W0 - X) @ A) * M  # minus half the gradient, on the kept entries
    Z = R * precondition
    P = Z
    rz = (R * Z).sum(1)
    for _ in range(iters):
        AP = (P @ A) * M
        curvature = (P * AP).sum(1)
        alpha = torch.where(curvature > 0, rz / torch.where(curvature > 0, curvature, 1.0), 0.0)
        X = X + alpha.unsqueeze(1) * P
        R = R - alpha.unsqueeze(1) * AP
        Z = R * precondition
        rz_next = (R * Z).sum(1)
        beta = torch.where(rz > 0, rz_next / torch.where(rz > 0, rz, 1.0), 0.0)
        P = Z + beta.unsqueeze(1) * P
        rz = rz_next
    # Keep, row by row, whichever of X and X0 has the lower error on H itself.
    wide = torch.float64 if _torch.has_float64(H.device) else dtype
    better = _row_errors(X, W0, H, wide) <= _row_errors(X0, W0, H, wide)
    X = torch.where(better.unsqueeze(1), X, X0)
    return (X * M).to(weight.dtype)


def _sweep_eager(
    WT: torch.Tensor,
    U: torch.Tensor,
    amount: Any,
    nm: tuple[int, int] | None,
    keep_given: torch.Tensor | None,
    blocksize: int,
) -> torch.Tensor:
    """The column sweep of :func:`sparsegpt` on the transposed weight ``WT`` (``(in, out)``), in
    place; returns the transposed keep-mask. The masks are chosen on the weight's own
    orientation (``(out, width)`` scores, ties row-major), exactly as the traced path does."""
    cols, rows = WT.shape
    u = U.diagonal()
    keepT = torch.ones_like(WT, dtype=torch.bool)
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        u1 = u[i1:i2]
        if keep_given is not None:
            prune1T = (~keep_given[:, i1:i2]).T.contiguous()
        elif amount is not None:
            k = _amount.count(amount, rows * (i2 - i1), "entries", "a block of weight")
            scores = WT[i1:i2].square() / u1.square().unsqueeze(1)
            prune1T = lowest(scores.T, k).T.contiguous()
        else:
            prune1T = torch.zeros((i2 - i1, rows), dtype=torch.bool, device=WT.device)
        _block_eager(WT, U, u1, prune1T, nm, i1, i2)
        keepT[i1:i2] = ~prune1T
    return keepT


# Columns swept one by one between two matrix-product updates of a block's later columns.
_SUB_BLOCK = 16


def _block_eager(
    WT: torch.Tensor,
    U: torch.Tensor,
    u1: torch.Tensor,
    prune1T: torch.Tensor,
    nm: tuple[int, int] | None,
    i1: int,
    i2: int,
) -> None:
    """One block of columns (rows ``i1:i2`` of the transposed weight ``WT``), in place. The
    pruned part of column ``i``, ``err = w * prune / U_ii``, is written into row ``i`` of
    ``ErrT``; the later columns get ``-err U[i, later]``: within a sub-block of
    ``_SUB_BLOCK`` columns one rank-1 update a column (a product on contiguous rows), after it
    one product for the rest of the block (``addmm_``), and after the block one product for all
    later columns (the lazy batch update). The block's pruned entries are zeroed at the end (each
    column's own value is what it was when its turn came, as ``q`` in the reference)."""
    width = i2 - i1
    W1T = WT[i1:i2]  # a view: updated in place
    U1 = U[i1:i2, i1:i2]
    ErrT = torch.empty_like(W1T)
    scale = prune1T.to(W1T.dtype) / u1.unsqueeze(1)
    step = _SUB_BLOCK if nm is None else -(-_SUB_BLOCK // nm[1]) * nm[1]  # whole groups of m
    for s1 in range(0, width, step):
        s2 = min(s1 + step, width)
        for i in range(s1, s2):
            if nm is not None and i % nm[1] == 0:
                n, m = nm
                group = W1T[i : i + m].square() / u1[i : i + m].square().unsqueeze(1)
                prune1T[i : i + m] = lowest(group.T, max(m - n, 0), rows=True).T
                scale[i : i + m] = prune1T[i : i + m].to(W1T.dtype) / u1[i : i + m].unsqueeze(1)
            err = torch.mul(W1T[i], scale[i], out=ErrT[i])
            if i + 1 < s2:  # a product, not addr_: BLAS keeps a small one on one thread
                W1T[i + 1 : s2].addmm_(U1[i, i + 1 : s2].unsqueeze(1), err.unsqueeze(0), alpha=-1.0)
        if s2 < width:
            W1T[s2:].addmm_(U1[s1:s2, s2:].T, ErrT[s1:s2], alpha=-1.0)
    W1T.masked_fill_(prune1T, 0.0)
    if i2 < WT.shape[0]:
        WT[i2:].addmm_(U[i1:i2, i2:].T, ErrT, alpha=-1.0)


def _block_traced(
    W: torch.Tensor,
    W1: torch.Tensor,
    U: torch.Tensor,
    U1: torch.Tensor,
    u1: torch.Tensor,
    prune1: torch.Tensor,
    nm: tuple[int, int] | None,
    i1: int,
    i2: int,
) -> None:
    """:func:`_block_eager` in operations that ``vmap`` batches (no ``out=``), the reference's."""
    Err1 = torch.zeros_like(W1)
    for i in range(i2 - i1):
        if nm is not None and i % nm[1] == 0:
            n, m = nm
            group = W1[:, i : i + m].square() / u1[i : i + m].square()
            prune1[:, i : i + m] = lowest(group, max(m - n, 0), rows=True)
        w = W1[:, i]
        q = w.masked_fill(prune1[:, i], 0.0)
        err = (w - q) / u1[i]
        W1[:, i + 1 :] -= err.unsqueeze(1) * U1[i, i + 1 :].unsqueeze(0)
        W1[:, i] = q
        Err1[:, i] = err
    W[:, i1:i2] = W1
    W[:, i2:] -= Err1 @ U[i1:i2, i2:]


def _row_errors(X: torch.Tensor, W0: torch.Tensor, H: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    D = (X - W0).to(dtype)
    return ((D @ H.to(dtype)) * D).sum(1)


# ---------------------------------------------------------------------------------------------
# Checks


def _check_layer(weight: Any, hessian: Any, traced: bool) -> tuple[int, int]:
    for name, t in (("weight", weight), ("hessian", hessian)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Expected {name} to be a torch.Tensor, got {type(t).__name__}.")
        if not t.is_floating_point():
            raise TypeError(f"Expected {name} to be a floating-point tensor, got dtype {t.dtype}.")
    if weight.dim() != 2:
        raise ValueError(
            f"Expected weight to be 2-d, (out_features, in_features), got shape {tuple(weight.shape)} "
            f"(a Conv1D weight is (in, out): pass weight.T)."
        )
    cols = weight.shape[1]
    if tuple(hessian.shape) != (cols, cols):
        raise ValueError(
            f"Expected hessian of shape (in_features, in_features) = ({cols}, {cols}) for a weight of "
            f"shape {tuple(weight.shape)}, got {tuple(hessian.shape)}."
        )
    if hessian.device != weight.device:
        raise ValueError(f"Expected hessian on weight's device ({weight.device}), got {hessian.device}.")
    if not traced:
        for name, t in (("weight", weight), ("hessian", hessian)):
            if t.device.type != "meta" and not bool(_factor.finite(t)):
                raise ValueError(f"Expected {name} to hold finite values only, got NaN or inf.")
    return weight.shape[0], cols


def _check_like(t: Any, weight: torch.Tensor, name: str, traced: bool) -> None:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"Expected {name} to be a floating-point tensor, got {t!r:.60}.")
    if t.shape != weight.shape or t.device != weight.device:
        raise ValueError(
            f"Expected {name} of weight's shape {tuple(weight.shape)} on {weight.device}, got "
            f"{tuple(t.shape)} on {t.device}."
        )
    if not traced and not bool(_factor.finite(t)):
        raise ValueError(f"Expected {name} to hold finite values only, got NaN or inf.")


def _check_mask(mask: Any, weight: torch.Tensor, traced: bool) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"Expected mask to be a torch.Tensor (True = kept), got {type(mask).__name__}.")
    if mask.shape != weight.shape or mask.device != weight.device:
        raise ValueError(
            f"Expected mask of weight's shape {tuple(weight.shape)} on {weight.device}, got "
            f"{tuple(mask.shape)} on {mask.device}."
        )
    if mask.dtype == torch.bool:
        return mask
    if not traced and mask.device.type != "meta":
        # A mask of 0.5s (a score, a density) would otherwise read as all kept.
        odd = mask[(mask != 0) & (mask != 1)]
        if odd.numel():
            raise ValueError(
                f"Expected mask to be a keep-mask: torch.bool, or 0 and 1 only (True / 1 = kept), "
                f"got a {mask.dtype} tensor holding {float(odd[0])!r} ({odd.numel()} entries "
                f"neither 0 nor 1)."
            )
    return mask != 0


def check_fraction(amount: Any, name: str = "amount") -> None:
    """``amount`` a fraction in [0, 1]: a float (or a 0-dim float tensor); errors name ``name``."""
    expected = f"Expected {name} to be a fraction in [0, 1] (a float, the share pruned)"
    if isinstance(amount, numbers.Integral) and not isinstance(amount, bool):
        raise TypeError(f"{expected}, got the int {amount!r}; write {float(amount)!r} for a fraction.")
    if isinstance(amount, torch.Tensor):
        _amount.check_amount(amount)
        return
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise TypeError(f"{expected}, got {amount!r}.")
    if amount != amount or not 0.0 <= float(amount) <= 1.0:
        raise ValueError(f"{expected}, got {amount!r}.")


def check_n_m(n_m: Any, cols: int) -> tuple[int, int]:
    if (
        not isinstance(n_m, (tuple, list))
        or len(n_m) != 2
        or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in n_m)
    ):
        raise TypeError(f"Expected n_m to be a pair of ints (n, m), keep n of every m, got {n_m!r}.")
    n, m = int(n_m[0]), int(n_m[1])
    if m < 1 or not 0 <= n <= m:
        raise ValueError(f"Expected n_m=(n, m) with m >= 1 and 0 <= n <= m, got {n_m!r}.")
    if cols % m:
        raise ValueError(
            f"Expected in_features ({cols}) to be a multiple of m={m} for n_m={n_m!r} (groups of m "
            f"consecutive inputs)."
        )
    return n, m


def check_positive_int(value: Any, name: str, zero_ok: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"Expected {name} to be an int, got {value!r}.")
    if value < (0 if zero_ok else 1):
        raise ValueError(f"Expected {name} to be {'>= 0' if zero_ok else '>= 1'}, got {value}.")
    return int(value)


def check_damp(damp: Any) -> float:
    if isinstance(damp, bool) or not isinstance(damp, numbers.Real):
        raise TypeError(f"Expected damp to be a non-negative float, got {damp!r}.")
    if not 0 <= float(damp) < float("inf"):
        raise ValueError(f"Expected damp to be a non-negative finite float, got {damp!r}.")
    return float(damp)
