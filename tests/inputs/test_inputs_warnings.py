"""fprune's warnings: NaN scores warned once per eager call at the caller's line; silenced and
gathered (compat, iterative) without touching Python's record of warnings already shown."""

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import fprune
from fprune import compat
from fprune.select import NaNScoresWarning

NAN = float("nan")


def _caught(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if issubclass(w.category, NaNScoresWarning)]


CALLS = {
    "l1_unstructured": lambda p: fprune.l1_unstructured(p, 0.5),
    "global_unstructured": lambda p: fprune.global_unstructured(p, 0.5),
    "ln_structured": lambda p: fprune.ln_structured({k: v.reshape(2, -1) for k, v in p.items()}, 1, 2, 0),
    "rowwise_unstructured": lambda p: fprune.rowwise_unstructured(
        {k: v.reshape(2, -1) for k, v in p.items()}, 0.5
    ),
    "n_m": lambda p: fprune.n_m(p, 1, 2),
    "select": lambda p: fprune.select.select(p, 0.5, scope=fprune.select.Global()),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_nan_scores_warn_once_per_call_naming_the_leaves(name):
    params = {
        "a": torch.tensor([1.0, NAN, 3.0, 4.0]),
        "b": torch.tensor([1.0, 2.0, 3.0, 4.0]),
        "c": torch.full((4,), NAN),
    }
    _, caught = _caught(lambda: CALLS[name](params))
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "['a']" in message and "['c']" in message and "['b']" not in message
    assert "NaN ranks above +inf" in message and "torch.nan_to_num" in message


@pytest.mark.parametrize("name", list(CALLS))
def test_no_warning_without_nan(name):
    params = {"a": torch.tensor([1.0, float("inf"), -float("inf"), 4.0]), "b": torch.arange(4.0)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", NaNScoresWarning)
        CALLS[name](params)


def test_the_warning_points_at_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1  # the next line
        fprune.global_unstructured({"w": torch.tensor([NAN, 1.0])}, 1)
    (w,) = [w for w in caught if issubclass(w.category, NaNScoresWarning)]
    assert w.filename == __file__ and w.lineno == line


def test_it_is_the_ranked_scores_that_count():
    finite, nan = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, NAN, 3.0])
    assert (
        len(_caught(lambda: fprune.l1_unstructured({"w": finite}, 1, importance_scores={"w": nan}))[1]) == 1
    )
    assert (
        len(_caught(lambda: fprune.l1_unstructured({"w": nan}, 1, importance_scores={"w": finite}))[1]) == 0
    )
    assert len(_caught(lambda: fprune.random_unstructured({"w": nan}, 1, generator=0))[1]) == 0


def test_all_nan_scores_give_a_mask_by_position():
    masks, caught = _caught(lambda: fprune.l1_unstructured({"w": torch.full((6,), NAN)}, 2))
    assert masks["w"].tolist() == [False, False, True, True, True, True] and len(caught) == 1
    masks, _ = _caught(
        lambda: fprune.global_unstructured({"a": torch.full((2,), NAN), "b": torch.tensor([NAN, 5.0])}, 3)
    )
    # NaN above 5.0: 5.0 goes first, then the NaNs by position (a before b)
    assert masks["a"].tolist() == [False, False] and masks["b"].tolist() == [True, False]


def test_transforms_neither_warn_nor_read():
    batch = torch.tensor([[1.0, NAN, 3.0], [4.0, 5.0, 6.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", NaNScoresWarning)
        out = torch.func.vmap(lambda p: fprune.l1_unstructured({"w": p}, 1)["w"])(batch)
        compiled = torch.compile(lambda p: fprune.l1_unstructured(p, 1), backend="eager", fullgraph=True)
        compiled({"w": batch[0]})
    assert out.tolist() == [[False, True, True], [False, True, True]]


def test_compat_stays_as_silent_as_torch():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in (compat.l1_unstructured, compat.ln_structured):
            net = torch.nn.Linear(3, 2)
            with torch.no_grad():
                net.weight[0, 1] = NAN
            if fn is compat.l1_unstructured:
                fn(net, "weight", amount=2)
            else:
                fn(net, "weight", amount=1, n=2, dim=0)
        net = torch.nn.Linear(3, 2)
        with torch.no_grad():
            net.weight.fill_(NAN)  # every entry pruned: also a layer collapse, silent in torch
        compat.global_unstructured([(net, "weight")], pruning_method=compat.L1Unstructured, amount=6)


SCRIPT = textwrap.dedent(
    """
    import warnings, torch, fprune
    from fprune import compat

    def noisy():
        warnings.warn("seen before", UserWarning)

    noisy()
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    pairs = [(net[0], "weight"), (net[1], "weight")]
    compat.global_unstructured(pairs, pruning_method=compat.L1Unstructured, amount=3)
    noisy()
    params = {"w": torch.randn(4, 4)}
    fprune.iterative(lambda m: fprune.scores.magnitude(params, masks=m), params, 0.5, rounds=2)
    noisy()
    for _ in range(2):  # fprune's own warning, at one line: shown once under the default filter
        fprune.global_unstructured({"a": torch.ones(2), "b": torch.full((2,), 5.0)}, 2)
    """
)


def test_warnings_a_program_already_saw_are_not_shown_again():
    # Python's default filter shows a warning once per location; warnings.catch_warnings() would
    # reset that record, and "seen before" would be shown again after each fprune call.
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert out.stderr.count("seen before") == 1, out.stderr
    assert out.stderr.count("LayerCollapseWarning") == 1, out.stderr


@pytest.mark.parametrize("n", [1, 2, float("inf"), -float("inf"), "fro"])
@pytest.mark.parametrize("leaves", [1, 12])  # one leaf alone, or a run of alike leaves stacked
def test_channel_scopes_see_nan_through_the_channel_norms(n, leaves):
    # Channels read the NaN check off the channel norms (a NaN entry makes its channel's norm
    # NaN), not off every entry: the warning names exactly the leaves that hold NaN.
    params = {f"w{i}": torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(leaves)}
    params["w0"][2, 1] = NAN
    _, caught = _caught(lambda: fprune.ln_structured(params, 1, n, 0))
    assert len(caught) == 1 and "['w0']" in str(caught[0].message) and "['w1']" not in str(caught[0].message)
