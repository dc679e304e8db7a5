"""Schedules: pure functions of the training step, for pruning during training.

Each schedule maps a step to a fraction in [0, 1]. A Python ``int`` step gives a Python
``float``; a 0-dim tensor step (such as a pruner's ``state.step``) gives a 0-dim floating
tensor (float64 for an integer step, the step's dtype for a floating one)
computed with tensor operations only (no ``.item()``, no host sync, no Python branch
on its value), so a schedule can live inside a ``torch.compile(fullgraph=True)`` training
step or under ``vmap``. The keyword parameters are checked on every call (``ValueError``
naming the parameter): fractions must lie in [0, 1], ``end`` must come after ``begin``.

A pruner takes any callable ``step -> fraction``; bind the parameters with a ``lambda`` or
``functools.partial``::

    schedule = functools.partial(fprune.schedules.polynomial, final=0.9, end=1000)

A pruner checks what any schedule returns at each update step: a Python number, or a tensor
in eager code, outside [0, 1] (or NaN) raises ``ValueError``; under a transform a tensor is clamped.
"""

from __future__ import annotations

import math
import numbers

import torch

from fprune import _torch

__all__ = ["polynomial", "one_shot", "cosine_decay"]

Step = int | torch.Tensor


def _check_step(step: Step) -> None:
    if isinstance(step, torch.Tensor):
        if step.dim() != 0 or step.is_complex() or step.dtype == torch.bool:
            raise ValueError(
                f"Expected step to be an int or a 0-dim real tensor, got a tensor of shape "
                f"{tuple(step.shape)} and dtype {step.dtype}."
            )
        return
    if not isinstance(step, numbers.Integral) or isinstance(step, bool):
        raise TypeError(f"Expected step to be an int or a 0-dim tensor, got {step!r}.")


def _check_fraction(name: str, value: float) -> None:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"Expected {name} to be a float in [0, 1], got {value!r}.")
    if not 0.0 <= value <= 1.0:  # False for NaN too
        raise ValueError(f"Expected {name} to be a fraction in [0, 1], got {value!r}.")


def _check_int(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"Expected {name} to be an int, got {value!r}.")
    if value < minimum:
        raise ValueError(f"Expected {name} to be an int >= {minimum}, got {value!r}.")


def _float_step(step: torch.Tensor) -> torch.Tensor:
    # float64 for integer steps: a pruner rounds ``fraction * numel`` to a count, and float32
    # would move that count for large leaves (0.9 is 0.89999998 in float32).
    if step.is_floating_point():
        return step
    if not _torch.has_float64(step.device):  # MPS: the schedule is computed on the CPU
        return step.to("cpu").to(torch.float64)
    return step.to(torch.float64)


def polynomial(
    step: Step, *, final: float, initial: float = 0.0, begin: int = 0, end: int, power: float = 3
) -> float | torch.Tensor:
    """Zhu & Gupta's (2017) gradual pruning schedule: ``final + (initial - final) * (1 - t) ** power``.

    ``t = (step - begin) / (end - begin)`` clipped to [0, 1]: ``initial`` up to ``begin``,
    ``final`` from ``end`` on, a cubic (for ``power=3``) ramp in between that prunes fast at
    first and slowly at the end.

    Args:
        step: the training step, an int or a 0-dim tensor.
        final: the fraction reached at ``end``, in [0, 1].
        initial: the fraction up to ``begin``, in [0, 1].
        begin: the step where the ramp starts (an int >= 0).
        end: the step where it reaches ``final`` (an int > ``begin``).
        power: the exponent, a finite number > 0.

    Returns:
        A float for an int step, a 0-dim floating tensor for a tensor step.

    Raises:
        TypeError / ValueError: on a parameter of the wrong kind or value, naming it.

    Example:
        >>> import torch
        >>> from fprune.schedules import polynomial
        >>> [round(polynomial(s, final=0.8, end=4), 4) for s in range(6)]
        [0.0, 0.4625, 0.7, 0.7875, 0.8, 0.8]
        >>> polynomial(torch.tensor(2), final=0.8, end=4)
        tensor(0.7000, dtype=torch.float64)
    """
    _check_step(step)
    _check_fraction("final", final)
    _check_fraction("initial", initial)
    _check_int("begin", begin, 0)
    _check_int("end", end, 0)
    if end <= begin:
        raise ValueError(f"Expected end to come after begin, got begin={begin!r} and end={end!r}.")
    if not isinstance(power, numbers.Real) or isinstance(power, bool) or not (0 < power < math.inf):
        raise ValueError(f"Expected power to be a finite number > 0, got {power!r}.")
    span = end - begin
    if isinstance(step, torch.Tensor):
        t = ((_float_step(step) - begin) / span).clamp(0.0, 1.0)
        return final + (initial - final) * (1.0 - t) ** power
    t = min(max((step - begin) / span, 0.0), 1.0)
    return final + (initial - final) * (1.0 - t) ** power


def one_shot(step: Step, *, target: float, at: int) -> float | torch.Tensor:
    """``0`` before step ``at``, ``target`` from ``at`` on: prune once, at one step.

    Args:
        step: the training step, an int or a 0-dim tensor.
        target: the fraction from ``at`` on, in [0, 1].
        at: the step where it switches (an int >= 0).

    Returns:
        A float for an int step, a 0-dim floating tensor for a tensor step.

    Example:
        >>> from fprune.schedules import one_shot
        >>> [one_shot(s, target=0.5, at=2) for s in range(4)]
        [0.0, 0.0, 0.5, 0.5]
    """
    _check_step(step)
    _check_fraction("target", target)
    _check_int("at", at, 0)
    if isinstance(step, torch.Tensor):
        step = _float_step(step)
        return (step >= at).to(step.dtype) * target
    return float(target) if step >= at else 0.0


def cosine_decay(step: Step, *, initial: float, end: int) -> float | torch.Tensor:
    """RigL's drop-fraction schedule: ``initial / 2 * (1 + cos(pi * min(step, end) / end))``.

    ``initial`` at step 0, decaying to 0 at ``end`` and staying there (Evci et al., 2020).

    Args:
        step: the training step, an int >= 0 or a 0-dim tensor.
        initial: the fraction at step 0, in [0, 1].
        end: the step where it reaches 0 (an int > 0).

    Returns:
        A float for an int step, a 0-dim floating tensor for a tensor step.

    Example:
        >>> from fprune.schedules import cosine_decay
        >>> [round(cosine_decay(s, initial=0.3, end=4), 4) for s in range(6)]
        [0.3, 0.2561, 0.15, 0.0439, 0.0, 0.0]
    """
    _check_step(step)
    _check_fraction("initial", initial)
    _check_int("end", end, 1)
    if isinstance(step, torch.Tensor):
        progress = _float_step(step).clamp(max=end) / end
        return initial / 2 * (1.0 + torch.cos(math.pi * progress))
    return initial / 2 * (1.0 + math.cos(math.pi * min(step, end) / end))
