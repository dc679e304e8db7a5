"""Counts: round_count, fprune's one ``round(fraction * n)``, and count rules as amounts.

round_count's int and tensor forms agree with Python's round (half to even) on the float64
product; a count rule ``rule(remaining, size) -> count`` gets what prior masks left in every
scope and its count is the int amount of the same call; its tensor results run under vmap and
torch.compile; what it must return is checked.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fprune import _amount
from fprune.select import EACH, Channels, Global, Rows, select


@given(st.floats(0.0, 1.0), st.integers(0, 10**7))
def test_round_count_forms_agree_with_python_round(fraction, n):
    want = round(fraction * n)
    assert _amount.round_count(fraction, n) == want
    assert int(_amount.round_count(torch.tensor(fraction, dtype=torch.float64), n)) == want
    assert int(_amount.round_count(fraction, torch.tensor(n))) == want
    assert int(_amount.round_count(fraction, n, as_tensor=True)) == want


def test_round_count_is_half_to_even_and_takes_a_tensor_of_sizes():
    assert [_amount.round_count(0.5, n) for n in (1, 3, 5, 7)] == [0, 2, 2, 4]
    per_row = _amount.round_count(0.5, torch.tensor([1, 3, 5, 7]))
    assert per_row.dtype == torch.int64 and per_row.tolist() == [0, 2, 2, 4]
    # a float32 tensor is its shortest decimal: 0.3 * 15 = 4.5 -> 4, as the Python float
    assert int(_amount.round_count(torch.tensor(0.3), 15)) == round(0.3 * 15) == 4


def _scores(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(6, 5, generator=g), "b": torch.randint(-2, 3, (4, 8), generator=g).float()}


def _prior(scores, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.rand(v.shape, generator=g) > 0.3 for k, v in scores.items()}


def keep_at_most_half(remaining, size):
    """Prune until half of the whole is pruned (never fewer than prior masks pruned)."""
    target = round(0.5 * size) if not isinstance(size, torch.Tensor) else _amount.round_count(0.5, size)
    pruned = size - remaining
    out = target - pruned
    return out.clamp(min=0) if isinstance(out, torch.Tensor) else max(out, 0)


@pytest.mark.parametrize("scope", [EACH, Global(), Channels(0), Rows(1)])
def test_a_count_rule_gets_what_prior_masks_left(scope):
    scores, prior = _scores(), _prior(_scores())
    seen = []

    def rule(remaining, size):
        seen.append((remaining, size))
        return keep_at_most_half(remaining, size)

    got = select(scores, rule, scope=scope, masks=prior)
    for k, m in got.items():
        assert not (m & ~prior[k]).any()  # pruned entries stay pruned
    if isinstance(scope, Rows):  # one count per row: tensors
        for (remaining, size), k in zip(seen, sorted(scores), strict=True):
            assert torch.equal(remaining, prior[k].sum(0)) and size == scores[k].shape[0]
        return
    if isinstance(scope, Global):
        ((remaining, size),) = seen
        assert remaining == sum(int(m.sum()) for m in prior.values()) and size == 30 + 32
        want = select(scores, keep_at_most_half(remaining, size), scope=scope, masks=prior)
    elif isinstance(scope, Channels):
        alive = {k: int(m.any(1).sum()) for k, m in prior.items()}
        assert seen == [(alive["a"], 6), (alive["b"], 4)]
        want = select(
            scores,
            {k: keep_at_most_half(alive[k], v.shape[0]) for k, v in scores.items()},
            scope=scope,
            masks=prior,
        )
    else:
        assert seen == [(int(prior[k].sum()), scores[k].numel()) for k in sorted(scores)]
        want = select(
            scores,
            {k: keep_at_most_half(int(prior[k].sum()), v.numel()) for k, v in scores.items()},
            scope=scope,
            masks=prior,
        )
    assert all(torch.equal(got[k], want[k]) for k in scores)


def test_count_rules_run_under_vmap_and_compile():
    scores, prior = _scores(), _prior(_scores())
    eager = select(scores, keep_at_most_half, scope=Global(), masks=prior)
    stacked = {k: torch.stack([v, v]) for k, v in scores.items()}
    stacked_prior = {k: torch.stack([v, v]) for k, v in prior.items()}
    batched = torch.vmap(lambda s, m: select(s, keep_at_most_half, scope=Global(), masks=m))(
        stacked, stacked_prior
    )
    assert all(torch.equal(batched[k][1], eager[k]) for k in scores)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda s, m: select(s, keep_at_most_half, masks=m), fullgraph=True, backend="aot_eager"
    )
    want = select(scores, keep_at_most_half, masks=prior)
    got = compiled(scores, prior)
    assert all(torch.equal(got[k], want[k]) for k in scores)


def test_what_a_count_rule_returns_is_checked():
    scores = _scores()
    with pytest.raises(TypeError, match=r"count rule .* to return an int or an integer tensor"):
        select(scores, lambda remaining, size: 0.5)
    with pytest.raises(TypeError, match=r"count rule .* to return an int or an integer tensor"):
        select(scores, lambda remaining, size: torch.tensor(0.5))
    with pytest.raises(ValueError, match=r"count rule .* returned -1"):
        select(scores, lambda remaining, size: -1)
    with pytest.raises(ValueError, match="more than the 30 parameters left"):
        select(scores, lambda remaining, size: 31)
    # an integer tensor is clamped to [0, remaining], as a count under a transform is
    masks = select(scores, lambda remaining, size: torch.tensor(100), scope=Global())
    assert not any(m.any() for m in masks.values())


def test_compat_refuses_count_rules_as_torch_does():
    import fprune.compat as prune

    module = torch.nn.Linear(3, 2)
    with pytest.raises(TypeError, match="Invalid type for amount"):
        prune.l1_unstructured(module, "weight", amount=lambda remaining, size: 1)
    assert not hasattr(module, "weight_mask")
