"""dynamic_sparse: a drop or grow criterion is one function of a Leaf; SET and RigL are two of them.

A user-defined criterion is checked against a plain Python reference eagerly, under vmap over
seeds, and inside one torch.compile(fullgraph=True) step (eager and aot_eager backends) that
compiles once; gradual_magnitude takes any scope object with an amount, and nothing else.
"""

import functools

import pytest
import torch

import fprune
from fprune import schedules
from fprune.pruners import Leaf, gradient_magnitude, magnitude, uniform_random
from fprune.select import NM, Channels, Rows
from tests.helpers import layer_params


def _grads(params, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) for k, v in params.items()}


WEIGHTS = ["l0.weight", "l1.weight", "l2.weight"]


def grow_where_weights_small(leaf):
    """A user's grow criterion: large gradient, small weight."""
    return leaf.grad.abs() / (1 + leaf.param.abs())


def drop_largest(leaf):
    """A user's drop criterion: the largest weights go first."""
    return -leaf.param.abs()


def reference_update(w, mask, drop_scores, grow_scores, fraction):
    """One leaf's update in plain Python: drop the k lowest drop scores among the active entries,
    grow the k highest grow scores among those inactive before, ties by position."""
    mask = mask.flatten().tolist()
    drop_scores, grow_scores = drop_scores.flatten().tolist(), grow_scores.flatten().tolist()
    active = [i for i, m in enumerate(mask) if m]
    inactive = [i for i, m in enumerate(mask) if not m]
    k = min(round(fraction * len(active)), len(inactive))
    drop = sorted(active, key=lambda i: (drop_scores[i], i))[:k]
    grow = sorted(inactive, key=lambda i: (-grow_scores[i], i))[:k]
    new = list(mask)
    for i in drop:
        new[i] = False
    for i in grow:
        new[i] = True
    return new, [i in set(grow) for i in range(len(mask))]


@pytest.mark.parametrize("drop", [magnitude, drop_largest])
def test_user_criteria_match_the_reference(drop):
    params, grads = layer_params(), _grads(layer_params())
    pruner = fprune.dynamic_sparse(
        0.6,
        drop=drop,
        grow=grow_where_weights_small,
        drop_fraction=0.4,
        every=1,
        end=9,
        distribution="uniform",
        seed=2,
    )
    state = pruner.init(params)
    for step in range(3):
        before = state.masks
        masks, state = pruner.update(params, state, grads=grads)
        for k in params:
            if k not in WEIGHTS:
                assert masks[k].all() and not state.regrown[k].any()
                continue
            leaf = Leaf(params[k], before[k], name=k)
            want, regrown = reference_update(
                params[k], before[k], drop(leaf), grads[k].abs() / (1 + params[k].abs()), 0.4
            )
            assert masks[k].flatten().tolist() == want, (step, k)
            assert state.regrown[k].flatten().tolist() == regrown, (step, k)
        params = {k: v + 0.2 * grads[k] for k, v in params.items()}


@pytest.mark.parametrize(
    "make, grow", [(fprune.sparse_evolutionary, uniform_random), (fprune.rigl, gradient_magnitude)]
)
def test_set_and_rigl_are_dynamic_sparse_instances(make, grow):
    params, grads = layer_params(), _grads(layer_params())
    drop = functools.partial(schedules.cosine_decay, initial=0.5, end=8)
    a = make(0.7, drop_fraction=drop, every=2, end=8, seed=3)
    b = fprune.dynamic_sparse(0.7, drop=magnitude, grow=grow, drop_fraction=drop, every=2, end=8, seed=3)
    sa, sb = a.init(params), b.init(params)
    for _ in range(6):
        _, sa = a.update(params, sa, grads=grads)
        _, sb = b.update(params, sb, grads=grads)
        params = {k: v + 0.1 * grads[k] for k, v in params.items()}
    for x, y in zip(torch.utils._pytree.tree_leaves(sa), torch.utils._pytree.tree_leaves(sb), strict=True):
        assert torch.equal(x, y)


def test_user_criterion_under_vmap_over_seeds_equals_per_seed():
    seeds = [0, 1, 2]
    params = [layer_params(s) for s in seeds]
    grads = [_grads(p, s + 5) for p, s in zip(params, seeds, strict=True)]

    def make(seed):
        return fprune.dynamic_sparse(
            0.7,
            drop=drop_largest,
            grow=grow_where_weights_small,
            drop_fraction=0.3,
            every=1,
            end=9,
            seed=seed,
        )

    expected = []
    for s, p, g in zip(seeds, params, grads, strict=True):
        pruner = make(s)
        state = pruner.init(p)
        for _ in range(3):
            masks, state = pruner.update(p, state, grads=g)
        expected.append(masks)
    stack = lambda trees: {k: torch.stack([t[k] for t in trees]) for k in trees[0]}
    P, G = stack(params), stack(grads)
    state = torch.vmap(lambda p, s: make(s).init(p))(P, torch.tensor(seeds))
    update = torch.vmap(lambda p, st, g: make(0).update(p, st, grads=g))
    for _ in range(3):
        masks, state = update(P, state, G)
    for j in range(len(seeds)):
        for k in masks:
            assert torch.equal(masks[k][j], expected[j][k]), (j, k)


class EagerAndAotEager:
    """A torch.compile backend that runs the graph dynamo traced both ways the backends "eager"
    (the graph as traced) and "aot_eager" (AOTAutograd's graph) run it, asserts that the two give
    the same outputs (bool and integer ones equal, float ones close) and returns AOTAutograd's:
    one trace checks both backends. ``frame_count`` counts the graphs it compiled."""

    def __init__(self):
        self.frame_count = 0

    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        aot = torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

        def run(*args):
            plain, lowered = gm(*args), aot(*args)
            torch.testing.assert_close(list(plain), list(lowered))
            return lowered

        return run


def test_user_criterion_compiles_once():
    # The backends "eager" and "aot_eager" both run the one traced step (EagerAndAotEager).
    torch._dynamo.reset()
    pruner = fprune.dynamic_sparse(
        0.8,
        drop=drop_largest,
        grow=grow_where_weights_small,
        drop_fraction=functools.partial(schedules.cosine_decay, initial=0.3, end=30),
        every=2,
        end=30,
        seed=7,
    )
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))

    def loss(p, masks):
        return torch.nn.functional.cross_entropy(
            fprune.masked_call(model, p, masks, (x,), straight_through=True), y
        )

    def step(params, state):
        grads = torch.func.grad(loss)(params, state.masks)
        masks, state = pruner.update(params, state, grads=grads)
        params = {k: (params[k] - 0.1 * grads[k] * masks[k]) for k in params}
        return fprune.zero_regrown(params, state), state

    counter = EagerAndAotEager()
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    state = pruner.init(params)
    eager_params, eager_state = params, state
    changed = 0
    for _ in range(12):
        before = state.masks
        params, state = compiled(params, state)
        eager_params, eager_state = step(eager_params, eager_state)
        changed += any(not torch.equal(before[k], state.masks[k]) for k in params)
        for k in params:
            assert torch.equal(state.masks[k], eager_state.masks[k]), k
            torch.testing.assert_close(params[k], eager_params[k])
    assert changed >= 3
    assert counter.frame_count == 1


def test_criterion_errors_name_the_criterion_and_the_leaf():
    params = layer_params()
    state = fprune.sparse_evolutionary(0.5, drop_fraction=0.3, every=1, end=5).init(params)

    def make(drop=magnitude, grow=uniform_random):
        return fprune.dynamic_sparse(0.5, drop=drop, grow=grow, drop_fraction=0.3, every=1, end=5)

    with pytest.raises(
        ValueError, match=r"criterion .*<lambda>.* shaped like 'l0.weight', \(6, 5\), got \(30,\)"
    ):
        make(drop=lambda leaf: leaf.param.abs().flatten()).update(params, state)
    with pytest.raises(TypeError, match=r"criterion .* to return a real tensor .* got 1.0"):
        make(grow=lambda leaf: 1.0).update(params, state)
    with pytest.raises(TypeError, match=r"reads leaf.grad: its update needs grads="):
        make(grow=gradient_magnitude).update(params, state)
    with pytest.raises(TypeError, match="Expected grow to be a criterion"):
        fprune.dynamic_sparse(0.5, grow="gradient", drop_fraction=0.3, every=1, end=5)


def test_gradual_magnitude_scope_is_a_scope_object_with_an_amount():
    schedule = functools.partial(schedules.polynomial, final=0.8, end=6)
    with pytest.raises(ValueError, match="NM"):
        fprune.gradual_magnitude(schedule, every=1, scope=NM(2, 4))
    for bad in (0, "global", "layerwise"):
        with pytest.raises(TypeError, match=r"Expected scope to be a scope of fprune\.select"):
            fprune.gradual_magnitude(schedule, every=1, scope=bad)
    assert not hasattr(fprune, "set_") and not hasattr(fprune.pruners, "set_")


def _reference_structured(w, mask, fraction, dim, rows: bool):
    """gradual pruning by channel (L2 norm of |w|, whole channels) or within rows (|w|), plain."""
    moved_w, moved_m = w.movedim(dim, 0), mask.movedim(dim, 0).clone()
    if rows:
        for r in range(moved_w.shape[0]):
            entries = moved_w[r].flatten().tolist()
            alive = moved_m[r].flatten().tolist()
            target = round(fraction * len(entries))
            extra = max(target - alive.count(False), 0)
            order = sorted((abs(v), i) for i, (v, a) in enumerate(zip(entries, alive, strict=True)) if a)
            flat = moved_m[r].flatten()
            for _, i in order[:extra]:
                flat[i] = False
            moved_m[r] = flat.view(moved_m[r].shape)
        return moved_m.movedim(0, dim)
    alive = [bool(moved_m[c].any()) for c in range(moved_w.shape[0])]
    target = round(fraction * len(alive))
    extra = max(target - alive.count(False), 0)
    norms = [(float(torch.linalg.vector_norm(moved_w[c])), c) for c in range(len(alive)) if alive[c]]
    for _, c in sorted(norms)[:extra]:
        moved_m[c] = False
    return moved_m.movedim(0, dim)


@pytest.mark.parametrize("scope", [Channels(0), Channels(1), Rows(0), Rows(1)])
def test_gradual_magnitude_by_channels_and_rows(scope):
    params = layer_params(shapes=((12, 10), (8, 12)))
    schedule = functools.partial(schedules.polynomial, final=0.75, end=6)
    pruner = fprune.gradual_magnitude(schedule, every=2, scope=scope)
    state = pruner.init(params)
    expected = dict(state.masks)
    for step in range(8):
        masks, state = pruner.update(params, state)
        if step % 2 == 0:
            expected = {
                k: _reference_structured(
                    params[k], expected[k], schedule(step), scope.dim, isinstance(scope, Rows)
                )
                if k.endswith("weight")
                else expected[k]
                for k in params
            }
        for k in params:
            assert torch.equal(masks[k], expected[k]), (step, k)
        params = {k: v * 1.1 + 0.05 for k, v in params.items()}
