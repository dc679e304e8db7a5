"""Private: validating ``amount`` and turning it into a count, exactly as torch.nn.utils.prune does.

The count rules (the README's "Amounts and counts" states them for users):

* An int is the count itself.
* A Python float in [0, 1] is a fraction and the count is ``round(amount * n)`` with Python's
  ``round`` (half to even) on the float64 product, as torch computes it. :func:`round_count` is
  this rule, the only place fprune turns a fraction into a count (the selection layer, the
  distributed backend, the pruners and ``fprune.compat`` all call it).
* A 0-dim floating-point tensor is a fraction too (it lets ``vmap`` run one call over many
  sparsity levels, and then the count is a tensor). A float64 tensor follows the Python-float
  rule exactly. A narrower tensor (float32, float16, bfloat16) first becomes the float64 nearest
  to the **shortest decimal that rounds to it** (what ``repr`` of a NumPy scalar of that dtype
  prints: ``torch.tensor(0.3)`` becomes ``0.3``), and then follows the Python-float rule, so
  ``torch.tensor(x)`` and ``x`` give the same count. Widening the float32 value itself would not:
  float32 ``0.3`` is ``0.30000001192...``, and times 15 it is just above the ``.5`` boundary that
  ``0.3 * 15`` sits on (5 entries against 4).
* Under ``torch.compile`` a Python float takes the tensor route (float64, the same count), so a
  changing float is a graph input instead of a constant: one recompile, then none per value.
* A callable is a *count rule*: ``rule(remaining, size) -> count`` gets what prior masks left
  (entries, channels, or a tensor of them per row) and the size they are out of, and returns the
  count to prune among the remaining ones: an int (checked as an int amount is), or an integer
  tensor (clamped to ``[0, remaining]``, as a count under a transform is). The pruners' counts
  are rules ("prune until ``round(f * size)`` are pruned", "swap ``min(round(f * active),
  inactive)``"): the selection layer, one process or sharded, computes ``remaining`` itself.

Validation: bad Python numbers raise. A tensor amount that can be read (eager code) is checked
with one host read per call: NaN, below 0 or above 1 raise. Under a transform (``vmap``,
``grad``, ``torch.compile``, fake or meta tensors) its value cannot be read, so it is clamped:
NaN prunes nothing, a fraction below 0 counts as 0, above 1 as 1; a count never leaves [0, n].
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from fprune import _torch
from fprune._types import Amount as Amount  # re-exported: modules annotate with ``_amount.Amount``
from fprune._types import CountRule

# Decimal places tried when turning a narrow float into its shortest decimal (float32 needs at
# most 9 significant digits; 17 places cover every fraction down to about 1e-8 exactly).
_PLACES = 18


def range_error(amount: object) -> ValueError:
    """torch.nn.utils.prune's error for an amount out of range (``fprune.compat`` raises it too)."""
    return ValueError(
        f"amount={amount} should either be a float in the range [0, 1] or a non-negative integer"
    )


def check_amount(amount: Amount) -> Amount:
    """Validate ``amount`` on its own (not yet against a size); returns it unchanged.

    A tensor's value is read once (in eager code only; see the module docstring). A count rule
    (a callable) is checked when it is applied (:func:`count`).
    """
    if callable(amount) and not isinstance(amount, torch.Tensor):
        return amount
    if isinstance(amount, torch.Tensor):
        if not amount.is_floating_point():
            raise TypeError(
                f"Expected amount to be an int, a float or a floating-point tensor, got a tensor "
                f"of dtype {amount.dtype}."
            )
        if amount.dim() != 0:
            raise ValueError(
                f"Expected amount to be a 0-dim tensor (use vmap to batch it), got shape "
                f"{tuple(amount.shape)}."
            )
        # One host read per call: NaN fails both comparisons.
        if readable(amount) and not bool((amount >= 0) & (amount <= 1)):
            raise ValueError(
                f"amount={float(amount)} (a tensor) should be a fraction in the range [0, 1]; "
                f"give an int, not a tensor, for a count."
            )
        return amount
    if isinstance(amount, bool) or not isinstance(amount, numbers.Real):
        raise TypeError(
            f"Invalid type for amount: {amount!r}. Must be int or float (a fraction in [0, 1] "
            f"or a non-negative count)."
        )
    if isinstance(amount, numbers.Integral):
        if amount < 0:
            raise range_error(amount)
    # ``amount != amount`` is the NaN test: ``math.isnan`` cannot be traced by torch.compile when
    # the float is a graph input, and comparisons can (they become guards on its range).
    elif amount != amount or not 0.0 <= amount <= 1.0:
        raise range_error(amount)
    return amount


def readable(t: torch.Tensor) -> bool:
    """Whether a tensor's value can be read on the host now (not traced, not fake, not meta)."""
    return t.device.type != "meta" and not _torch.is_traced([t])


def is_static(amount: Amount) -> bool:
    """True when the amount is a Python number (the count can be known without running anything)."""
    return not isinstance(amount, torch.Tensor)


def fraction(amount: float | torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """A fractional amount as a 0-dim float64 tensor in [0, 1], by the rules of the module docstring.

    Example:
        >>> float(torch.tensor(0.3).double())  # float32 0.3 widened is not 0.3
        0.30000001192092896
        >>> float(fraction(torch.tensor(0.3))), float(fraction(0.3))
        (0.3, 0.3)
    """
    if not isinstance(amount, torch.Tensor):
        # torch.full keeps a float that torch.compile made a graph input symbolic (as_tensor
        # would specialize on its value and recompile for each one).
        return torch.full((), amount, dtype=torch.float64, device=device)
    if device is not None:
        amount = amount.to(device)
    # Under a transform the value was not checked: NaN prunes nothing, the rest is clamped.
    amount = torch.where(torch.isnan(amount), torch.zeros_like(amount), amount.clamp(0.0, 1.0))
    if amount.dtype == torch.float64:
        return amount
    return _shortest_decimal(amount)


def _shortest_decimal(a: torch.Tensor) -> torch.Tensor:
    """The float64 nearest to the decimal with the fewest places that rounds to ``a`` in its dtype.

    Traceable: a fixed set of elementwise ops over the candidates ``round(a * 10**k) / 10**k``
    for ``k = 0 .. _PLACES - 1`` (each is the double nearest to that decimal: both operands are
    exact, and IEEE division rounds correctly); the first candidate that converts back to ``a``
    wins, and ``a`` widened exactly is the fallback.
    """
    wide = a.to(torch.float64)
    scales = torch.tensor([10.0**k for k in range(_PLACES)], dtype=torch.float64, device=a.device)
    candidates = torch.round(wide.unsqueeze(-1) * scales) / scales
    hits = candidates.to(a.dtype) == a.unsqueeze(-1)
    first = hits & (hits.to(torch.int32).cumsum(-1) == 1)
    chosen = torch.where(first, candidates, torch.zeros_like(candidates)).sum(-1)
    return torch.where(hits.any(-1), chosen, wide)


def round_count(
    share: float | torch.Tensor, n: int | torch.Tensor, *, as_tensor: bool = False
) -> int | torch.Tensor:
    """``round(share * n)``: how many of ``n`` a fraction ``share`` is. fprune's one count rule.

    Python's ``round`` (half to even) of the float64 product, in one of two forms:

    * ``share`` a Python float and ``n`` an int: ``round(share * n)``, a Python int (Python's
      own arithmetic; under ``torch.compile`` a constant).
    * either one a tensor (or ``as_tensor=True``: under ``torch.compile`` a changing float
      is then a graph input): an int64 tensor shaped like ``n`` (0-dim for an int), on ``n``'s
      device (the CPU for an int): ``share`` as a float64 tensor (a float16/bfloat16/float32
      tensor first becomes the shortest decimal that rounds to it, see :func:`fraction`), times
      ``n`` in float64, rounded half to even by ``torch.round``. On a device without float64
      the same arithmetic runs on the CPU (:data:`HOST`).

    Both forms give the same count for the same values. ``share`` is not checked here (see
    :func:`check_amount`); a tensor is clamped to [0, 1].

    Example:
        >>> round_count(0.5, 5), round_count(0.5, 7), int(round_count(torch.tensor(0.3), 15))
        (2, 4, 4)
    """
    if not as_tensor and not isinstance(share, torch.Tensor) and not isinstance(n, torch.Tensor):
        return round(share * n)
    n_t = torch.as_tensor(n)
    if not _torch.has_float64(n_t.device):
        return _count_on_host(share, n_t)
    return torch.round(fraction(share, n_t.device) * n_t.to(torch.float64)).to(torch.int64)


def count(
    amount: Amount, n: int | torch.Tensor, what: str, where: str = "", size: Any = None
) -> int | torch.Tensor:
    """How many of ``n`` entries (or channels) to prune; ``what`` and ``where`` name them in errors.

    The core always passes ``where`` (``params['w']``, ``params``) and its message says what it
    means ("is more than the 12 parameters left ... at most 12"); without ``where`` the message
    is torch.nn.utils.prune's ("should be smaller than the number of parameters to prune=12"),
    which ``fprune.compat`` keeps.

    ``n`` (the entries prior masks left) is an int in eager code, or an integer tensor when it
    depends on prior masks under a transform (one per row for the ``Rows`` scope). ``size`` is
    what ``n`` is out of (the leaf's entries, channels or row length; ``n`` when not given): a
    count rule gets both. The result is an int exactly when both are Python numbers (and a rule
    returned an int) and nothing is being compiled; otherwise an int64 tensor in [0, n].
    """
    if callable(amount) and not isinstance(amount, torch.Tensor):
        return _apply_rule(amount, n, n if size is None else size, what, where)
    compiling = _torch.is_dynamo_compiling()
    if isinstance(n, torch.Tensor) or isinstance(amount, torch.Tensor) or compiling:
        if isinstance(amount, numbers.Integral):
            if not isinstance(n, torch.Tensor):
                _check_count(amount, n, what, where)
            # Under a transform the remaining size is a tensor and cannot be checked; prune
            # at most everything that remains.
            return torch.clamp(torch.as_tensor(n), max=int(amount)).to(torch.int64)
        # A Python float takes the tensor form under torch.compile: a graph input, not a constant.
        return round_count(amount, n, as_tensor=True)
    if isinstance(amount, numbers.Integral):
        _check_count(amount, n, what, where)
        return int(amount)
    return round_count(amount, n)


def _apply_rule(rule: CountRule, n: Any, size: Any, what: str, where: str) -> int | torch.Tensor:
    """A count rule's count: an int result is checked as an int amount is, a tensor clamped."""
    got = rule(n, size)
    if isinstance(got, torch.Tensor):
        if got.is_floating_point() or got.is_complex() or got.dtype == torch.bool:
            raise TypeError(
                f"Expected the count rule {rule!r} to return an int or an integer tensor (a "
                f"count), got a tensor of dtype {got.dtype}."
            )
        # Never read: a count outside [0, n] is clamped, as a count under a transform is.
        got = torch.clamp(got.to(torch.int64), min=0)
        return torch.minimum(got, torch.as_tensor(n, device=got.device))
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        raise TypeError(
            f"Expected the count rule {rule!r} to return an int or an integer tensor (a count), got {got!r}."
        )
    if got < 0:
        raise ValueError(f"The count rule {rule!r} returned {got}; expected a count >= 0.")
    if isinstance(n, torch.Tensor):
        return torch.clamp(torch.as_tensor(n), max=int(got)).to(torch.int64)
    _check_count(int(got), n, what, where)
    return int(got)


def _count_on_host(amount: float | torch.Tensor, n_t: torch.Tensor) -> torch.Tensor:
    """The fractional count of ``n_t`` entries on a device without float64 (MPS), made on the CPU.

    The same float64 arithmetic on 0-dim CPU copies (so the same count), moved back to
    ``n_t``'s device: a device-to-host copy of two scalars, and nothing float64 on the device.
    """
    share = fraction(amount, HOST)
    # moved first, converted on the host: no float64 tensor is ever made on the device
    return torch.round(share * n_t.to(HOST).to(torch.float64)).to(torch.int64).to(n_t.device)


# Where counts are made for devices without float64.
HOST = torch.device("cpu")


def _check_count(amount: int, n: int, what: str, where: str) -> None:
    if amount > n:
        if not where:
            # fprune.compat's calls name no place: torch's own message, word for word (a drop-in
            # keeps it, though 12 itself is accepted where it says "smaller than ... 12").
            raise ValueError(f"amount={amount} should be smaller than the number of {what} to prune={n}")
        raise ValueError(
            f"amount={amount} is more than the {n} {what} left to prune in {where}; expected a "
            f"count of at most {n} (or a fraction in [0, 1])."
        )
