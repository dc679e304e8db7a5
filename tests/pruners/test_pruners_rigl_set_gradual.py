"""Pruners as (init, update) pairs: RigL / SET / gradual magnitude against plain references,
exact per-layer counts, the state as a pytree of tensors (torch.save, vmap, torch.compile)."""

import functools
import io

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import fprune
from fprune import schedules
from tests.helpers import layer_params


def _tied_params(seed=0):
    """Values drawn from a few levels, so that ties are everywhere."""
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randint(-2, 3, v.shape, generator=g).float() for k, v in layer_params(seed).items()}


# --------------------------------------------------------------------- plain references


def ref_update_layer(w, mask, grow_scores, fraction):
    """One SET/RigL layer update in plain Python: drop lowest |w| among active, grow highest
    score among inactive-before (just-dropped excluded), ties by position."""
    w, mask, grow_scores = w.flatten().tolist(), mask.flatten().tolist(), grow_scores.flatten().tolist()
    active = [i for i, m in enumerate(mask) if m]
    inactive = [i for i, m in enumerate(mask) if not m]
    k = min(round(fraction * len(active)), len(inactive))
    drop = sorted(active, key=lambda i: (abs(w[i]), i))[:k]
    grow = sorted(inactive, key=lambda i: (-abs(grow_scores[i]), i))[:k]
    new = list(mask)
    for i in drop:
        new[i] = False
    for i in grow:
        new[i] = True
    regrown = [i in set(grow) for i in range(len(mask))]
    return new, regrown


def ref_gradual(params, masks, fraction, selected, scope):
    """Prune until round(fraction * n) of the selected entries are pruned, lowest |w| among
    the alive ones first, ties by position (leaves in sorted-key order)."""
    new = {k: m.clone() for k, m in masks.items()}
    groups = [selected] if scope == "global" else [[k] for k in selected]
    for names in groups:
        entries = [
            (abs(v), (gi, i))
            for gi, k in enumerate(names)
            for i, v in enumerate(params[k].flatten().tolist())
        ]
        alive = [(s, pos) for s, pos in entries if masks[names[pos[0]]].flatten()[pos[1]]]
        target = round(fraction * len(entries))
        extra = max(target - (len(entries) - len(alive)), 0)
        for _, (gi, i) in sorted(alive)[:extra]:
            new[names[gi]].view(-1)[i] = False
    return new


WEIGHTS = ["l0.weight", "l1.weight", "l2.weight"]
SCOPES = {"global": fprune.select.Global(), "layerwise": fprune.select.EACH}


# ------------------------------------------------------------------------------- RigL / SET


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("fraction", [0.3, 0.5, 1.0])
def test_rigl_update_matches_reference(tied, fraction):
    params = _tied_params() if tied else layer_params()
    g = torch.Generator().manual_seed(1)
    grads = {
        k: torch.randint(-3, 4, v.shape, generator=g).float() if tied else torch.randn(v.shape, generator=g)
        for k, v in params.items()
    }
    pruner = fprune.rigl(0.6, distribution="uniform", drop_fraction=fraction, every=1, end=5, seed=3)
    state = pruner.init(params)
    for _ in range(3):
        before = {k: m.clone() for k, m in state.masks.items()}
        masks, state = pruner.update(params, state, grads=grads)
        for k in params:
            if k in WEIGHTS:
                new, regrown = ref_update_layer(params[k], before[k], grads[k], fraction)
                assert masks[k].flatten().tolist() == new, k
                assert state.regrown[k].flatten().tolist() == regrown, k
            else:
                assert masks[k].all() and not state.regrown[k].any()
        # let the weights move so the next update differs
        params = {k: v + 0.1 * grads[k] for k, v in params.items()}


def test_set_update_matches_reference_with_its_random_scores():
    params = layer_params()
    pruner = fprune.sparse_evolutionary(0.7, distribution="erk", drop_fraction=0.4, every=1, end=5, seed=11)
    state = pruner.init(params)
    before = state.masks
    masks, new_state = pruner.update(params, state)
    names = sorted(params)  # optree's leaf order: sorted keys
    seed = fprune.pruners._core.step_seed(state.seed, state.step)
    for k in WEIGHTS:
        scores = fprune._random.uniform(params[k].shape, seed, names.index(k), params[k].device)
        new, regrown = ref_update_layer(params[k], before[k], scores, 0.4)
        assert masks[k].flatten().tolist() == new
        assert new_state.regrown[k].flatten().tolist() == regrown


@pytest.mark.parametrize("make", [fprune.sparse_evolutionary, fprune.rigl])
@pytest.mark.parametrize("distribution", ["erk", "uniform"])
def test_exact_per_layer_sparsity_through_updates(make, distribution):
    params = layer_params(shapes=((20, 16), (30, 20), (10, 30)))
    drop = functools.partial(schedules.cosine_decay, initial=0.5, end=20)
    pruner = make(0.9, distribution=distribution, drop_fraction=drop, every=3, end=20, seed=5)
    state = pruner.init(params)
    fractions = getattr(fprune.distributions, distribution)({k: params[k] for k in WEIGHTS}, 0.9)
    counts = {k: int(state.masks[k].sum()) for k in params}
    for k in WEIGHTS:
        assert counts[k] == params[k].numel() - round(fractions[k] * params[k].numel())
    g = torch.Generator().manual_seed(2)
    changed = 0
    for step in range(25):
        grads = {k: torch.randn(v.shape, generator=g) for k, v in params.items()}
        before = state.masks
        masks, state = pruner.update(params, state, grads=grads)
        assert {k: int(m.sum()) for k, m in masks.items()} == counts
        moved = any(not torch.equal(masks[k], before[k]) for k in WEIGHTS)
        regrew = any(state.regrown[k].any() for k in params)
        if moved or regrew:
            assert step % 3 == 0 and step < 20
        changed += moved
        params = {k: v + 0.01 * grads[k] for k, v in params.items()}
    assert changed >= 5
    assert int(state.step) == 25


def test_regrown_are_inactive_before_and_zero_regrown():
    params = layer_params()
    pruner = fprune.sparse_evolutionary(0.5, distribution="uniform", drop_fraction=0.5, every=1, end=5)
    state = pruner.init(params)
    before = state.masks
    masks, state = pruner.update(params, state)
    for k in WEIGHTS:
        assert not (state.regrown[k] & before[k]).any()
        assert (state.regrown[k] <= masks[k]).all()
        assert state.regrown[k].any()
    zeroed = fprune.zero_regrown(params, state)
    for k in params:
        assert torch.equal(zeroed[k][state.regrown[k]], torch.zeros(int(state.regrown[k].sum())))
        assert torch.equal(zeroed[k][~state.regrown[k]], params[k][~state.regrown[k]])


def test_no_updates_from_end_on():
    params = layer_params()
    pruner = fprune.rigl(0.5, distribution="uniform", drop_fraction=0.5, every=2, end=4)
    state = pruner.init(params)
    history = []
    for _step in range(8):
        grads = {k: torch.randn(v.shape) for k, v in params.items()}
        _masks, state = pruner.update(params, state, grads=grads)
        history.append(any(state.regrown[k].any() for k in params))
        params = {k: v + grads[k] for k, v in params.items()}
    assert history == [True, False, True, False, False, False, False, False]


# ------------------------------------------------------------------------ gradual magnitude


@pytest.mark.parametrize("scope", ["global", "layerwise"])
@pytest.mark.parametrize("tied", [False, True])
def test_gradual_magnitude_matches_reference(scope, tied):
    params = _tied_params() if tied else layer_params()
    schedule = functools.partial(schedules.polynomial, final=0.8, begin=1, end=9)
    pruner = fprune.gradual_magnitude(schedule, every=2, scope=SCOPES[scope])
    state = pruner.init(params)
    expected = dict(state.masks)
    g = torch.Generator().manual_seed(4)
    for step in range(12):
        masks, state = pruner.update(params, state)
        if step % 2 == 0:
            expected = ref_gradual(params, expected, schedule(step), WEIGHTS, scope)
        for k in params:
            assert torch.equal(masks[k], expected[k]), (step, k)
        params = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in params.items()}
    total = sum(params[k].numel() for k in WEIGHTS)
    pruned = sum(int((~masks[k]).sum()) for k in WEIGHTS)
    if scope == "global":
        assert pruned == round(0.8 * total)
    assert all(masks[k].all() for k in params if k not in WEIGHTS)


def test_gradual_magnitude_where_selects_biases():
    params = layer_params()
    pruner = fprune.gradual_magnitude(lambda s: 0.5, every=1, where=lambda n, p: True)
    masks, _ = pruner.update(params, pruner.init(params))
    total = sum(p.numel() for p in params.values())
    assert sum(int((~m).sum()) for m in masks.values()) == round(0.5 * total)
    assert any((~masks[k]).any() for k in params if k.endswith("bias"))


# ------------------------------------------------------------- the state: save, vmap, compile


def _pruners():
    return {
        "rigl": fprune.rigl(
            0.8,
            drop_fraction=functools.partial(schedules.cosine_decay, initial=0.3, end=50),
            every=2,
            end=50,
            seed=7,
        ),
        "set": fprune.sparse_evolutionary(0.8, drop_fraction=0.3, every=2, end=50, seed=7),
        "gradual": fprune.gradual_magnitude(
            functools.partial(schedules.polynomial, final=0.8, end=50), every=2
        ),
    }


@pytest.mark.parametrize("name", ["rigl", "set", "gradual"])
def test_state_round_trips_through_torch_save(name):
    pruner = _pruners()[name]
    params = layer_params()
    state = pruner.init(params)
    _, state = pruner.update(params, state, grads=params)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    assert type(loaded) is type(state)
    assert type(state) is (fprune.GradualState if name == "gradual" else fprune.DynamicSparseState)
    for a, b in zip(
        torch.utils._pytree.tree_leaves(state), torch.utils._pytree.tree_leaves(loaded), strict=True
    ):
        assert a.dtype == b.dtype and torch.equal(a, b)
    m1, _s1 = pruner.update(params, state, grads=params)
    m2, _s2 = pruner.update(params, loaded, grads=params)
    assert all(torch.equal(m1[k], m2[k]) for k in params)


@pytest.mark.parametrize("make", [fprune.sparse_evolutionary, fprune.rigl])
def test_vmap_over_seeds_equals_per_seed(make):
    seeds = [0, 1, 2]
    params = [layer_params(seed) for seed in seeds]
    grads = [layer_params(seed + 10) for seed in seeds]
    pruners = [make(0.7, drop_fraction=0.4, every=1, end=10, seed=s) for s in seeds]
    # per seed
    expected = []
    for pruner, p, g in zip(pruners, params, grads, strict=True):
        state = pruner.init(p)
        for _ in range(3):
            masks, state = pruner.update(p, state, grads=g)
        expected.append(masks)
    # in one vmap: init with a batched seed, updates on stacked params and states
    stack = lambda trees: {k: torch.stack([t[k] for t in trees]) for k in trees[0]}
    P, G = stack(params), stack(grads)
    init = torch.vmap(lambda p, s: make(0.7, drop_fraction=0.4, every=1, end=10, seed=s).init(p))
    state = init(P, torch.tensor(seeds))
    update = torch.vmap(lambda p, st, g: pruners[0].update(p, st, grads=g))
    for _ in range(3):
        masks, state = update(P, state, G)
    for j in range(len(seeds)):
        for k in masks:
            assert torch.equal(masks[k][j], expected[j][k]), (j, k)


@pytest.mark.parametrize("name", ["rigl", "set", "gradual"])
def test_compiled_step_compiles_once_over_100_steps(name):
    torch._dynamo.reset()
    pruner = _pruners()[name]
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))

    def loss(p, masks):
        out = fprune.masked_call(model, p, masks, (x,), straight_through=True)
        return torch.nn.functional.cross_entropy(out, y)

    def step(params, state):
        grads = torch.func.grad(loss)(params, state.masks)
        _masks, state = pruner.update(params, state, grads=grads)
        params = {k: (params[k] - 0.1 * grads[k] * state.masks[k]) for k in params}
        params = fprune.zero_regrown(params, state)
        return params, state

    counter = CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    state = pruner.init(params)
    eager_params, eager_state = params, state
    history = set()
    for i in range(100):
        params, state = compiled(params, state)
        if i < 20:
            eager_params, eager_state = step(eager_params, eager_state)
        if i == 19:
            for k in params:
                assert torch.equal(state.masks[k], eager_state.masks[k])
                torch.testing.assert_close(params[k], eager_params[k])
        history.add(b"".join(bytes(m.flatten().numpy()) for m in state.masks.values()))
    assert counter.frame_count == 1
    assert len(history) > 3  # the masks did change
    assert int(state.step) == 100


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: fprune.rigl(1.5, drop_fraction=0.3, every=1, end=10), ValueError, "sparsity"),
        (lambda: fprune.rigl(0.5, drop_fraction=1.3, every=1, end=10), ValueError, "drop_fraction"),
        (lambda: fprune.rigl(0.5, drop_fraction=float("nan"), every=1, end=10), ValueError, "drop_fraction"),
        (lambda: fprune.sparse_evolutionary(0.5, drop_fraction=0.3, every=0, end=10), ValueError, "every"),
        (lambda: fprune.sparse_evolutionary(0.5, drop_fraction=0.3, every=1, end=0), ValueError, "end"),
        (lambda: fprune.sparse_evolutionary(0.5, drop_fraction=0.3, every=1.0, end=10), TypeError, "every"),
        (
            lambda: fprune.sparse_evolutionary(
                0.5, distribution="normal", drop_fraction=0.3, every=1, end=10
            ),
            ValueError,
            "distribution",
        ),
        (
            lambda: fprune.sparse_evolutionary(0.5, drop_fraction=0.3, every=1, end=10, seed=1.5),
            TypeError,
            "seed",
        ),
        (
            lambda: fprune.sparse_evolutionary(0.5, drop_fraction=0.3, every=1, end=10, where="weight"),
            TypeError,
            "where",
        ),
        (lambda: fprune.gradual_magnitude(0.5, every=1), TypeError, "schedule"),
        (lambda: fprune.gradual_magnitude(lambda s: 0.5, every=0), ValueError, "every"),
        (lambda: fprune.gradual_magnitude(lambda s: 0.5, every=1, scope="local"), TypeError, "scope"),
        (
            lambda: fprune.gradual_magnitude(
                functools.partial(schedules.polynomial, final=0.5, begin=5, end=2), every=1
            ).update(layer_params(), fprune.gradual_magnitude(lambda s: 0.0, every=1).init(layer_params())),
            ValueError,
            "end",
        ),
    ],
)
def test_bad_arguments(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


@pytest.mark.parametrize(
    "value", [90, 1.5, -0.2, float("nan"), torch.tensor(1.5), torch.tensor(float("nan"))]
)
@pytest.mark.parametrize("which", ["gradual", "set", "rigl"])
def test_schedule_value_outside_0_1_raises(which, value):
    # A schedule returning a percentage (90), > 1, < 0 or NaN raises, naming the schedule, rather
    # than be clamped (everything or nothing pruned).
    params = layer_params()
    if which == "gradual":
        pruner, name = fprune.gradual_magnitude(lambda step: value, every=1), "schedule"
    else:
        make = fprune.sparse_evolutionary if which == "set" else fprune.rigl
        pruner, name = make(0.5, drop_fraction=lambda step: value, every=1, end=10), "drop_fraction"
    state = pruner.init(params)
    with pytest.raises(ValueError, match=rf"{name}\(step=0\) returned .*expected a fraction in \[0, 1\]"):
        pruner.update(params, state, grads=params)
    with pytest.raises(TypeError, match=name):
        fprune.gradual_magnitude(lambda step: "0.5", every=1).update(
            params, state
        ) if which == "gradual" else (
            fprune.sparse_evolutionary(
                0.5, drop_fraction=lambda step: torch.tensor(1), every=1, end=10
            ).update(params, state)
        )


def test_schedule_value_traced_is_clamped():
    # under vmap with a batched step the value cannot be read: clamped as a tensor amount is
    params = {"w": torch.randn(2, 5)}
    pruner = fprune.gradual_magnitude(lambda step: step.double() * 10 - 1, every=1)  # -1, then 9
    state = pruner.init(params)
    states = fprune.GradualState({"w": state.masks["w"].expand(2, 2, 5)}, torch.tensor([0, 1]))
    masks, _ = torch.vmap(lambda st: pruner.update(params, st))(states)
    assert masks["w"].sum((1, 2)).tolist() == [10, 0]


def test_rigl_bad_grads_are_named_grads():
    # Errors about grads= name grads (not importance_scores, an argument the caller never passed).
    params = {"a": torch.randn(4, 4), "b": torch.randn(3, 4)}
    pruner = fprune.rigl(0.5, drop_fraction=0.3, every=1, end=10)
    state = pruner.init(params)
    with pytest.raises(ValueError, match=r"grads has no entry for params\['b'\].*None gradient.*zeros_like"):
        pruner.update(params, state, grads={"a": torch.randn(4, 4), "b": None})
    with pytest.raises(ValueError, match=r"Expected grads\['b'\] to have the shape of params\['b'\]"):
        pruner.update(params, state, grads={"a": torch.randn(4, 4), "b": torch.randn(4, 3)})
    with pytest.raises(TypeError, match=r"grads\['b'\] to be a real tensor"):
        pruner.update(params, state, grads={"a": torch.randn(4, 4), "b": torch.ones(3, 4, dtype=torch.bool)})
    # zeros, as the message says, work
    masks, _ = pruner.update(params, state, grads={"a": torch.randn(4, 4), "b": torch.zeros(3, 4)})
    assert int(masks["b"].sum()) == int(state.masks["b"].sum())


def test_bad_update_inputs():
    params = layer_params()
    pruner = fprune.rigl(0.5, drop_fraction=0.3, every=1, end=10)
    state = pruner.init(params)
    with pytest.raises(TypeError, match="grads"):
        pruner.update(params, state)
    with pytest.raises(TypeError, match="Expected state to be a DynamicSparseState"):
        pruner.update(params, dict(state._asdict()), grads=params)
    with pytest.raises(ValueError, match="structure"):
        pruner.update({k: v for k, v in params.items() if k != "l0.bias"}, state, grads=params)
    with pytest.raises(ValueError, match="shape"):
        pruner.update(params, state, grads={**params, "l0.weight": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="structure"):
        fprune.zero_regrown({"x": torch.zeros(1)}, state)


def test_vmap_with_unbatched_step_equals_batched():
    """An unbatched state.step (all members step together) lets update skip non-update steps
    on the host; the masks are the same as with a batched step."""
    seeds = torch.tensor([0, 1])
    params = {k: torch.stack([v, v * 2]) for k, v in layer_params().items()}
    make = lambda s: fprune.rigl(0.7, drop_fraction=0.4, every=3, end=10, seed=s)
    state = torch.vmap(lambda p, s: make(s).init(p))(params, seeds)
    dims = fprune.DynamicSparseState(masks=0, step=None, regrown=0, seed=0)
    batched = torch.vmap(lambda p, st, g: make(0).update(p, st, grads=g))
    unbatched = torch.vmap(
        lambda p, st, g: make(0).update(p, st, grads=g), in_dims=(0, dims, 0), out_dims=(0, dims)
    )
    a, b = state, state._replace(step=state.step[0])
    for i in range(7):
        grads = {k: torch.randn(v.shape) for k, v in params.items()}
        ma, a = batched(params, a, grads)
        mb, b = unbatched(params, b, grads)
        assert b.step.dim() == 0 and int(b.step) == i + 1
        for k in params:
            assert torch.equal(ma[k], mb[k]) and torch.equal(a.regrown[k], b.regrown[k])
        params = {k: v + grads[k] for k, v in params.items()}
