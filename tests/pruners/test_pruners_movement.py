"""movement (Sanh et al., 2020): a pruner with state of its own (the accumulated scores).

Checked against a plain Python loop (scores summed step by step, the lowest pruned by count,
ties by position, pruned entries ranked again), through torch.save / weights_only loading,
under vmap over stacked models and in one compiled step that compiles once.
"""

import functools
import io
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch._dynamo.testing import CompileCounter

import fprune
from fprune import schedules
from fprune.select import EACH, NM, Blocks, Channels, Global, Rows
from tests.helpers import layer_params
from tests.strategies import matrix_shapes, tensors

WEIGHTS = ["l0.weight", "l1.weight", "l2.weight"]


def ref_masks(scores, fraction, scope):
    """Prune round(fraction * n) of the selected entries of lowest score, every entry ranked
    (pruned ones too), ties to the earlier position (leaves in sorted-key order)."""
    groups = [WEIGHTS] if scope == "global" else [[k] for k in WEIGHTS]
    masks = {k: [True] * len(v) for k, v in scores.items()}
    for names in groups:
        entries = [(scores[k][i], gi, i) for gi, k in enumerate(names) for i in range(len(scores[k]))]
        for _, gi, i in sorted(entries)[: round(fraction * len(entries))]:
            masks[names[gi]][i] = False
    return masks


def _steps(tied, count, seed=0):
    """(params, grads) for each step: small integers when tied (exact sums, ties everywhere)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {k: v.shape for k, v in layer_params().items()}
    draw = (
        (lambda s: torch.randint(-2, 3, s, generator=g).float())
        if tied
        else (lambda s: torch.randn(s, generator=g))
    )
    return [
        ({k: draw(s) for k, s in shapes.items()}, {k: draw(s) for k, s in shapes.items()})
        for _ in range(count)
    ]


@pytest.mark.filterwarnings(
    "ignore::fprune.select.LayerCollapseWarning"
)  # global, tied: the reference agrees
@pytest.mark.parametrize("scope", ["each", "global"])
@pytest.mark.parametrize("tied", [False, True])
def test_movement_matches_a_plain_loop(scope, tied):
    schedule = functools.partial(schedules.polynomial, final=0.7, begin=1, end=7)
    pruner = fprune.movement(schedule, every=2, scope=EACH if scope == "each" else Global())
    steps = _steps(tied, 10)
    state = pruner.init(steps[0][0])
    scores = {k: [0.0] * p.numel() for k, p in steps[0][0].items()}
    expected = {k: [True] * p.numel() for k, p in steps[0][0].items()}
    for step, (params, grads) in enumerate(steps):
        masks, state = pruner.update(params, state, grads=grads)
        for k in WEIGHTS:  # float32, as the state keeps them: the same sums bit for bit
            moved = (-grads[k] * params[k]).flatten().tolist()
            scores[k] = (torch.tensor(scores[k]) + torch.tensor(moved)).tolist()
        if step % 2 == 0:
            expected = ref_masks(scores, schedule(step), scope)
        for k in params:
            assert masks[k].flatten().tolist() == expected[k], (step, k)
            assert state.scores[k].flatten().tolist() == scores[k], (step, k)
        assert int(state.step) == step + 1
    if scope == "global":
        total = sum(steps[0][0][k].numel() for k in WEIGHTS)
        assert sum(int((~masks[k]).sum()) for k in WEIGHTS) == round(0.7 * total)
    else:
        for k in WEIGHTS:
            assert int((~masks[k]).sum()) == round(0.7 * masks[k].numel())


@given(st.data(), matrix_shapes, st.floats(0.0, 1.0), st.integers(1, 3), st.sampled_from(["each", "global"]))
def test_exact_count_and_the_lowest_scores_go(data, shape, fraction, steps, scope):
    # Invariants at any update: round(fraction * n) pruned per scope, count-exact with ties and
    # NaN (NaN ranks above +inf: kept), and no pruned entry scores above a kept one.
    params = {k: data.draw(tensors(st.just(shape))) for k in ("a", "b")}
    pruner = fprune.movement(lambda step: fraction, every=1, scope=EACH if scope == "each" else Global())
    state = pruner.init(params)
    for _ in range(steps):
        grads = {k: data.draw(tensors(st.just(shape))) for k in params}
        with warnings.catch_warnings():  # NaN scores and collapsed leaves are drawn on purpose
            warnings.simplefilter("ignore")
            masks, state = pruner.update(params, state, grads=grads)
    groups = [["a", "b"]] if scope == "global" else [["a"], ["b"]]
    for names in groups:
        kept = torch.cat([masks[k].flatten() for k in names])
        scores = torch.cat([state.scores[k].flatten() for k in names]).nan_to_num(nan=float("inf"))
        assert int((~kept).sum()) == round(fraction * kept.numel())
        if (~kept).any() and kept.any():
            assert scores[~kept].max() <= scores[kept].min()


def test_pruned_entries_come_back_when_their_score_rises():
    pruner = fprune.movement(lambda step: 0.5, every=1)
    params = {"w": torch.tensor([[1.0, 1.0, 1.0, 1.0]])}
    state = pruner.init(params)
    masks, state = pruner.update(params, state, grads={"w": torch.tensor([[1.0, 1.0, -1.0, -1.0]])})
    assert masks["w"].tolist() == [[False, False, True, True]]
    masks, state = pruner.update(params, state, grads={"w": torch.tensor([[-3.0, -3.0, 0.0, 0.0]])})
    assert masks["w"].tolist() == [[True, True, False, False]]
    assert state.scores["w"].tolist() == [[2.0, 2.0, 1.0, 1.0]]


def test_scores_accumulate_between_updates_and_biases_stay_dense():
    params, grads = _steps(False, 1)[0]
    pruner = fprune.movement(lambda step: 0.5, every=3)
    state = pruner.init(params)
    for _ in range(2):
        masks, state = pruner.update(params, state, grads=grads)
    for k in params:
        if k in WEIGHTS:
            torch.testing.assert_close(state.scores[k], -2 * grads[k] * params[k])
        else:
            assert masks[k].all() and not state.scores[k].any()
    # step 1 was no update step: the masks are step 0's
    first, _ = pruner.update(params, pruner.init(params), grads=grads)
    assert all(torch.equal(masks[k], first[k]) for k in params)


def test_state_round_trips_through_torch_save():
    pruner = fprune.movement(lambda step: 0.4, every=2)
    steps = _steps(False, 3)
    state = pruner.init(steps[0][0])
    for params, grads in steps[:2]:
        _, state = pruner.update(params, state, grads=grads)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert type(loaded) is fprune.MovementState and loaded._fields == ("masks", "step", "scores")
    params, grads = steps[2]
    m1, s1 = pruner.update(params, state, grads=grads)
    m2, s2 = pruner.update(params, loaded, grads=grads)
    for a, b in zip(
        torch.utils._pytree.tree_leaves((m1, s1)), torch.utils._pytree.tree_leaves((m2, s2)), strict=True
    ):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_vmap_over_models_equals_one_by_one():
    pruner = fprune.movement(functools.partial(schedules.polynomial, final=0.6, end=4), every=1)
    runs = [_steps(False, 4, seed) for seed in range(3)]
    expected = []
    for steps in runs:
        state = pruner.init(steps[0][0])
        for params, grads in steps:
            masks, state = pruner.update(params, state, grads=grads)
        expected.append((masks, state.scores))
    stack = lambda trees: {k: torch.stack([t[k] for t in trees]) for k in trees[0]}
    state = torch.vmap(pruner.init)(stack([steps[0][0] for steps in runs]))
    update = torch.vmap(lambda p, st, g: pruner.update(p, st, grads=g))
    for i in range(4):
        masks, state = update(stack([s[i][0] for s in runs]), state, stack([s[i][1] for s in runs]))
    for j, (masks_j, scores_j) in enumerate(expected):
        for k in masks:
            assert torch.equal(masks[k][j], masks_j[k]) and torch.equal(state.scores[k][j], scores_j[k])


def test_compiled_step_compiles_once():
    torch._dynamo.reset()
    pruner = fprune.movement(functools.partial(schedules.polynomial, final=0.8, end=30), every=2)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))

    def loss(p, masks):
        out = fprune.masked_call(model, p, masks, (x,), straight_through=True)
        return torch.nn.functional.cross_entropy(out, y)

    def step(params, state):
        grads = torch.func.grad(loss)(params, state.masks)
        _masks, state = pruner.update(params, state, grads=grads)
        return {k: params[k] - 0.1 * grads[k] * state.masks[k] for k in params}, state

    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    state = pruner.init(params)
    eager_params, eager_state = params, state
    history = set()
    for _ in range(40):
        params, state = compiled(params, state)
        eager_params, eager_state = step(eager_params, eager_state)
        history.add(b"".join(bytes(m.flatten().numpy()) for m in state.masks.values()))
    assert counter.frame_count == 1
    assert len(history) > 3
    for k in params:
        assert torch.equal(state.masks[k], eager_state.masks[k])
        torch.testing.assert_close(state.scores[k], eager_state.scores[k])


def test_bad_input():
    params = layer_params()
    pruner = fprune.movement(lambda step: 0.5, every=1)
    state = pruner.init(params)
    with pytest.raises(TypeError, match="needs grads="):
        pruner.update(params, state)
    with pytest.raises(ValueError, match=r"grads has no entry for params\['l0.bias'\].*zeros_like"):
        pruner.update(params, state, grads={**params, "l0.bias": None})
    with pytest.raises(TypeError, match="Expected state to be a MovementState"):
        pruner.update(params, fprune.gradual_magnitude(lambda s: 0.5, every=1).init(params), grads=params)
    with pytest.raises(ValueError, match=r"state\.scores"):
        pruner.update(
            params, state._replace(scores={**state.scores, "l0.weight": torch.zeros(2)}), grads=params
        )
    for reducing in (Channels(0), Blocks((2, 2))):
        with pytest.raises(ValueError, match="EACH, Global"):
            fprune.movement(lambda step: 0.5, every=1, scope=reducing)
    with pytest.raises(TypeError, match="schedule"):
        fprune.movement(0.5, every=1)
    with pytest.raises(ValueError, match="every"):
        fprune.movement(lambda step: 0.5, every=0)
    with pytest.raises(ValueError, match=r"schedule\(step=0\) returned 1.5"):
        fprune.movement(lambda step: 1.5, every=1).update(params, state, grads=params)
    # zero_regrown serves every pruner: movement regrows nothing it must zero
    assert fprune.zero_regrown(params, state) is params


def test_movement_within_rows_prunes_the_lowest_signed_scores_of_each_row():
    torch.manual_seed(0)
    params = {"w": torch.randn(4, 6)}
    pruner = fprune.movement(lambda step: 0.5, every=1, scope=Rows(0))
    state = pruner.init(params)
    scores = torch.zeros(4, 6)
    for _ in range(3):
        grads = {"w": torch.randn(4, 6)}
        scores = scores - grads["w"] * params["w"]
        masks, state = pruner.update(params, state, grads=grads)
    # each row loses its 3 lowest accumulated scores (signed), no more and no fewer
    lowest = scores.argsort(dim=1, stable=True)[:, :3]
    expected = torch.ones(4, 6, dtype=torch.bool).scatter(1, lowest, False)
    assert torch.equal(masks["w"], expected)


def test_movement_refuses_a_scope_without_a_fraction_by_its_own_name():
    with pytest.raises(
        ValueError, match=r"^movement prunes a fraction.*NM\(n=2, m=4.*EACH, Global\(\) or Rows"
    ):
        fprune.movement(lambda step: 0.5, every=1, scope=NM(2, 4))
    with pytest.raises(ValueError, match=r"^gradual_magnitude prunes a fraction.*NM\(n=2, m=4"):
        fprune.gradual_magnitude(lambda step: 0.5, every=1, scope=NM(2, 4))
    with pytest.raises(TypeError, match=r"EACH, Global\(\) or Rows\(dim\)\), got 'rows'"):
        fprune.movement(lambda step: 0.5, every=1, scope="rows")
