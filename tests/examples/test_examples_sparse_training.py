"""The sparse-training example (examples/sparse_training.py) on a short configuration.

Checks the shape of the result with noise margins (every sparse method learns; at 98% RigL
and gradual magnitude beat static random masks), that every layer's sparsity stays exact
through the RigL and SET updates, and the command line (table and PNG).
"""

import importlib.util

import pytest
import torch

import fprune
from tests.helpers import load_example

# sklearn is imported by the example when it loads the data: finding it costs no import here.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None, reason="needs scikit-learn (the examples extra)"
)

st = load_example("sparse_training")
QUICK = st.Config.quick()


@pytest.fixture(scope="module")
def quick_result():
    return st.run(QUICK, progress=None)


def mean(result, sparsity, method):
    return 100 * float(result.accuracy[(sparsity, method)].mean())


def test_shape_of_the_result(quick_result):
    r = quick_result
    assert mean(r, 0.9, "dense") > 94
    for s in QUICK.sparsities:
        for method in st.METHODS[1:]:
            assert mean(r, s, method) <= mean(r, s, "dense") + 1.0, (s, method)
            assert r.sparsity[(s, method)] == pytest.approx(s, abs=0.005), (s, method)
    for method in st.METHODS[1:]:
        assert mean(r, 0.9, method) > 75, method  # 90%: every method learns
        assert mean(r, 0.9, method) >= mean(r, 0.98, method) - 3.0, method  # sparser is not better
    # dynamic sparse training at least as good as static random masks, within noise
    for method in ("SET", "RigL"):
        assert mean(r, 0.9, method) >= mean(r, 0.9, "static (ERK)") - 3.0
    # at 98% the informed methods are clearly ahead of static random masks
    for method in ("RigL", "gradual magnitude", "lottery ticket"):
        assert mean(r, 0.98, method) >= mean(r, 0.98, "static (ERK)") + 5.0, method


def test_exact_per_layer_sparsity_through_rigl_and_set(quick_result):
    r = quick_result
    _base, init = st.lt.initial_models(QUICK.lt_config())
    weights = {k: v[0] for k, v in init.items() if k.endswith("weight")}
    for s in QUICK.sparsities:
        fractions = fprune.distributions.erk(weights, s)
        expected = {k: w.numel() - round(fractions[k] * w.numel()) for k, w in weights.items()}
        for method in ("SET", "RigL", "static (ERK)"):
            counts = r.layer_counts[(s, method)]
            assert len(counts) == len(r.eval_steps)
            assert all(c == expected for c in counts), (s, method)


def test_masks_move_under_rigl_and_set():
    """Between updates the masks stay; at update steps they change, with counts exact."""
    _base, init = st.lt.initial_models(QUICK.lt_config())
    seeds = torch.arange(QUICK.seeds)
    for method in ("SET", "RigL"):
        pruner = st.make_pruner(method, 0.9, 100, QUICK, 0)
        state = torch.vmap(
            lambda p, seed, *, method=method: st.make_pruner(method, 0.9, 100, QUICK, seed).init(p)
        )(init, seeds)
        grads = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(0)) for k, v in init.items()}
        masks, _new = torch.vmap(lambda p, s, g, *, pruner=pruner: pruner.update(p, s, grads=g))(
            init, state, grads
        )
        for k in init:
            assert torch.equal(masks[k].flatten(1).sum(1), state.masks[k].flatten(1).sum(1))
        assert any(not torch.equal(masks[k], state.masks[k]) for k in init)


def test_command_line(tmp_path):
    plot, table = tmp_path / "a.png", tmp_path / "t.md"
    st.main(
        [
            "--quick",
            "--seeds",
            "2",
            "--epochs",
            "2",
            "--sparsities",
            "0.9",
            "--plot",
            str(plot),
            "--table",
            str(table),
        ]
    )
    assert plot.stat().st_size > 1000
    text = table.read_text()
    assert "| RigL |" in text and "90% pruned" in text
