"""fprune.iterative: schedule counts, one score_fn call per round, prior masks, bad input."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune


def params_of(seed, sizes=((6, 5), (7,), (3, 4))):
    g = torch.Generator().manual_seed(seed)
    return {f"p{i}": torch.randn(s, generator=g) for i, s in enumerate(sizes)}


def recorder(params, calls):
    def score_fn(masks):
        calls.append(masks)
        return fprune.scores.magnitude(params, masks=masks)

    return score_fn


def kept(masks, names):
    return sum(int(masks[k].sum()) for k in names)


@given(
    seed=st.integers(0, 1000),
    amount=st.one_of(st.floats(0.0, 1.0), st.integers(0, 40)),
    rounds=st.integers(1, 7),
    with_prior=st.booleans(),
)
def test_schedule_counts_and_calls(seed, amount, rounds, with_prior):
    params = params_of(seed)
    where = lambda name, p: name != "p1"
    names = ["p0", "p2"]
    prior = None
    if with_prior:
        g = torch.Generator().manual_seed(seed + 1)
        prior = {k: torch.rand(v.shape, generator=g) > 0.2 for k, v in params.items()}
    start = 42 if prior is None else kept(prior, names)
    if isinstance(amount, int) and amount > start:
        with pytest.raises(ValueError, match="amount"):
            fprune.iterative(recorder(params, []), params, amount, rounds=rounds, masks=prior, where=where)
        return
    calls = []
    masks = fprune.iterative(recorder(params, calls), params, amount, rounds=rounds, masks=prior, where=where)
    assert len(calls) == rounds and calls[0] is prior
    final = start - (amount if isinstance(amount, int) else round(amount * start))
    ratio = final / start if isinstance(amount, int) and start else 1.0 - amount
    history = calls[1:] + [masks]
    previous = prior
    for r, m in enumerate(history, start=1):
        want = final if r == rounds else max(final, round(start * ratio ** (r / rounds)))
        assert kept(m, names) == want
        if previous is not None:  # nested: nothing pruned comes back
            assert all(not (m[k] & ~previous[k]).any() for k in params)
        previous = m
    # Leaves left out keep their prior mask.
    assert torch.equal(masks["p1"], torch.ones(7, dtype=torch.bool) if prior is None else prior["p1"])


def test_one_round_is_global_unstructured():
    params = params_of(0)
    scores = {k: torch.rand(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in params.items()}
    prior = fprune.l1_unstructured(params, 0.3)
    got = fprune.iterative(lambda m: scores, params, 0.6, rounds=1, masks=prior)
    want = fprune.global_unstructured(params, 0.6, importance_scores=scores, masks=prior)
    assert all(torch.equal(got[k], want[k]) for k in params)


def test_signed_ranks_by_value():
    params = {"w": torch.tensor([3.0, -5.0, 1.0, -0.5, 2.0, 4.0])}
    scores = {"w": params["w"]}
    masks = fprune.iterative(lambda m: scores, params, 0.5, rounds=3, signed=True)
    assert torch.equal(masks["w"], torch.tensor([True, False, False, False, True, True]))
    by_magnitude = fprune.iterative(lambda m: scores, params, 0.5, rounds=3)
    assert torch.equal(by_magnitude["w"], torch.tensor([True, True, False, False, False, True]))
    with pytest.raises(TypeError, match="signed"):
        fprune.iterative(lambda m: scores, params, 0.5, rounds=3, signed="yes")


def test_rescoring_changes_the_result():
    # A score that depends on the masks: the ranking flips once fewer than 15 entries are left.
    params = {"w": torch.arange(1.0, 21.0)}

    def score_fn(masks):
        alive = 20 if masks is None else int(masks["w"].sum())
        return {"w": params["w"] if alive >= 15 else 21 - params["w"]}

    one = fprune.iterative(score_fn, params, 0.5, rounds=1)
    many = fprune.iterative(score_fn, params, 0.5, rounds=5)
    assert int(one["w"].sum()) == int(many["w"].sum()) == 10
    assert torch.equal(one["w"], torch.arange(20) >= 10)
    # Kept 17, 15, 13 by value, then 11 and 10 by reversed value: 1..7 and 18..20 pruned.
    assert torch.equal(many["w"], (torch.arange(20) >= 7) & (torch.arange(20) < 17))


def test_synflow_iterative_keeps_every_layer_alive():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 50),
        torch.nn.ReLU(),
        torch.nn.Linear(50, 50),
        torch.nn.ReLU(),
        torch.nn.Linear(50, 2),
    )
    params = {k: v.detach() for k, v in model.named_parameters()}
    weights = lambda name, p: p.dim() > 1
    x = torch.ones(1, 20)
    masks = fprune.iterative(
        lambda m: fprune.scores.synflow(model, params, x, masks=m), params, 0.995, rounds=30, where=weights
    )
    assert sum(int(masks[k].sum()) for k in params if k.endswith("weight")) == round(0.005 * 3600)
    assert all(masks[k].any() for k in params if k.endswith("weight"))


def test_bad_input():
    params = {"w": torch.ones(4)}
    score_fn = lambda m: fprune.scores.magnitude(params)
    with pytest.raises(TypeError, match="score_fn"):
        fprune.iterative("s", params, 0.5, rounds=2)
    with pytest.raises(ValueError, match="rounds"):
        fprune.iterative(score_fn, params, 0.5, rounds=0)
    with pytest.raises(TypeError, match="rounds"):
        fprune.iterative(score_fn, params, 0.5, rounds=2.0)
    with pytest.raises(TypeError, match="amount"):
        fprune.iterative(score_fn, params, torch.tensor(0.5), rounds=2)
    with pytest.raises(ValueError, match=r"amount=1\.5"):
        fprune.iterative(score_fn, params, 1.5, rounds=2)
    with pytest.raises(ValueError, match="amount=5"):
        fprune.iterative(score_fn, params, 5, rounds=2)
    with pytest.raises(ValueError, match="importance_scores"):
        fprune.iterative(lambda m: {"v": torch.ones(4)}, params, 0.5, rounds=2)
    with pytest.raises(ValueError, match=r"masks\['v'\]"):
        fprune.iterative(score_fn, params, 0.5, rounds=2, masks={"v": torch.ones(4, dtype=torch.bool)})


@given(
    seed=st.integers(0, 1000),
    rounds=st.integers(1, 5),
    min_keep=st.one_of(st.integers(0, 3), st.floats(0.0, 0.2)),
)
def test_min_keep_is_each_round_global_unstructured_with_min_keep(seed, rounds, min_keep):
    params = params_of(seed)
    got = fprune.iterative(
        lambda m: fprune.scores.magnitude(params, masks=m), params, 0.7, rounds=rounds, min_keep=min_keep
    )
    # Plain reference: the documented schedule, each round global_unstructured(min_keep=).
    start = sum(p.numel() for p in params.values())
    final_keep = start - round(0.7 * start)
    current, alive = None, start
    for r in range(1, rounds + 1):
        keep = final_keep if r == rounds else max(final_keep, min(alive, round(start * 0.3 ** (r / rounds))))
        scores = {k: (p * current[k] if current is not None else p) for k, p in params.items()}
        current = fprune.global_unstructured(
            params, alive - keep, importance_scores=scores, masks=current, min_keep=min_keep
        )
        alive = keep
    assert all(torch.equal(got[k], current[k]) for k in params)
    floors = {
        k: (min_keep if isinstance(min_keep, int) else round(min_keep * p.numel())) for k, p in params.items()
    }
    assert all(int(got[k].sum()) >= min(floors[k], params[k].numel()) for k in params)


def test_collapse_warns_once_naming_the_round_at_the_callers_line():
    params = {"a": torch.arange(1.0, 11.0), "b": torch.arange(100.0, 110.0)}
    score_fn = lambda m: fprune.scores.magnitude(params, masks=m)
    with pytest.warns(fprune.select.LayerCollapseWarning) as record:
        fprune.iterative(score_fn, params, 0.6, rounds=3)
    assert len(record) == 1
    assert "round 3" in str(record[0].message) and "params['a']" in str(record[0].message)
    assert record[0].filename == __file__
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        masks = fprune.iterative(score_fn, params, 0.6, rounds=3, min_keep=2)
    assert int(masks["a"].sum()) == 2 and int(masks["a"].sum() + masks["b"].sum()) == 8
