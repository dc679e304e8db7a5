"""fprune.schedules: the formulas, int and tensor steps, under torch.compile, bad parameters."""

import math

import pytest
import torch

from fprune import schedules


def ref_polynomial(step, final, initial, begin, end, power):
    t = min(max((step - begin) / (end - begin), 0.0), 1.0)
    return final + (initial - final) * (1 - t) ** power


def ref_cosine(step, initial, end):
    return initial / 2 * (1 + math.cos(math.pi * min(step, end) / end))


CASES = [
    (schedules.polynomial, dict(final=0.9, end=10), lambda s: ref_polynomial(s, 0.9, 0.0, 0, 10, 3)),
    (
        schedules.polynomial,
        dict(final=0.5, initial=0.1, begin=3, end=7, power=2),
        lambda s: ref_polynomial(s, 0.5, 0.1, 3, 7, 2),
    ),
    (schedules.one_shot, dict(target=0.7, at=4), lambda s: 0.7 if s >= 4 else 0.0),
    (schedules.cosine_decay, dict(initial=0.3, end=8), lambda s: ref_cosine(s, 0.3, 8)),
]


@pytest.mark.parametrize("fn, kwargs, ref", CASES)
def test_int_steps_match_formula(fn, kwargs, ref):
    for step in range(14):
        value = fn(step, **kwargs)
        assert isinstance(value, float)
        assert value == pytest.approx(ref(step), abs=1e-12)


@pytest.mark.parametrize("fn, kwargs, ref", CASES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_tensor_steps_match_formula(fn, kwargs, ref, dtype):
    for step in range(14):
        value = fn(torch.tensor(step, dtype=dtype), **kwargs)
        assert isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point()
        assert float(value) == pytest.approx(ref(step), abs=1e-6)


@pytest.mark.parametrize("fn, kwargs, ref", CASES)
def test_compiled_fullgraph(fn, kwargs, ref):
    torch._dynamo.reset()
    compiled = torch.compile(lambda s: fn(s, **kwargs), fullgraph=True, backend="eager")
    for step in range(14):
        assert float(compiled(torch.tensor(step))) == pytest.approx(ref(step), abs=1e-6)


@pytest.mark.parametrize("fn, kwargs, ref", CASES)
def test_vmap_over_steps(fn, kwargs, ref):
    steps = torch.arange(14)
    values = torch.vmap(lambda s: fn(s, **kwargs))(steps)
    assert values.shape == (14,)
    assert values.tolist() == pytest.approx([ref(s) for s in range(14)], abs=1e-6)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: schedules.polynomial(0, final=1.5, end=10), ValueError, "final"),
        (lambda: schedules.polynomial(0, final=float("nan"), end=10), ValueError, "final"),
        (lambda: schedules.polynomial(0, final=0.5, initial=-0.1, end=10), ValueError, "initial"),
        (lambda: schedules.polynomial(0, final=0.5, begin=5, end=5), ValueError, "end"),
        (lambda: schedules.polynomial(0, final=0.5, begin=5, end=2), ValueError, "begin=5"),
        (lambda: schedules.polynomial(0, final=0.5, end=4, power=0), ValueError, "power"),
        (lambda: schedules.polynomial(0, final=0.5, end=4.0), TypeError, "end"),
        (lambda: schedules.polynomial(0, final="0.5", end=4), TypeError, "final"),
        (lambda: schedules.polynomial(1.5, final=0.5, end=4), TypeError, "step"),
        (lambda: schedules.polynomial(torch.arange(3), final=0.5, end=4), ValueError, "step"),
        (lambda: schedules.one_shot(0, target=2.0, at=1), ValueError, "target"),
        (lambda: schedules.one_shot(0, target=0.5, at=-1), ValueError, "at"),
        (lambda: schedules.cosine_decay(0, initial=0.3, end=0), ValueError, "end"),
        (lambda: schedules.cosine_decay(0, initial=1.3, end=10), ValueError, "initial"),
        (lambda: schedules.cosine_decay(True, initial=0.3, end=10), TypeError, "step"),
    ],
)
def test_bad_parameters(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
