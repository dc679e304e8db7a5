"""One rule for every ``where=``: ``where(name, leaf)``, or ``where(leaf)`` for a one-argument
callable; anything else raises a TypeError that names ``where``, before any work is done."""

import functools

import pytest
import torch

import fprune

PARAMS = {
    "fc1.weight": torch.tensor([[0.3, -1.0], [2.0, 0.1]]),
    "fc1.bias": torch.tensor([0.5, -0.2]),
    "fc2.weight": torch.tensor([[4.0, -0.5, 1.5]]),
}
MASKS = fprune.l1_unstructured(PARAMS, 0.5)

CALLS = {
    "l1_unstructured": lambda where: fprune.l1_unstructured(PARAMS, 0.5, where=where),
    "global_unstructured": lambda where: fprune.global_unstructured(PARAMS, 0.5, where=where),
    "random_unstructured": lambda where: fprune.random_unstructured(PARAMS, 0.5, where=where, generator=0),
    "ln_structured": lambda where: fprune.ln_structured(PARAMS, 1, 2, 0, where=where),
    "select": lambda where: fprune.select.select(PARAMS, 0.5, where=where),
    "iterative": lambda where: fprune.iterative(
        lambda m: fprune.scores.magnitude(PARAMS, masks=m), PARAMS, 0.5, rounds=2, where=where
    ),
    "distributions.uniform": lambda where: fprune.distributions.uniform(PARAMS, 0.5, where=where),
    "report": lambda where: fprune.report(MASKS, where=where).total,
    "sparsity": lambda where: fprune.sparsity(MASKS, where=where).overall,
}


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _matrices(p):
    return p.dim() > 1


@pytest.mark.parametrize("name", list(CALLS))
def test_one_argument_where_picks_like_the_two_argument_form(name):
    expected = CALLS[name](lambda n, p: p.dim() > 1)
    assert _same(CALLS[name](lambda p: p.dim() > 1), expected)
    assert _same(CALLS[name](_matrices), expected)
    assert _same(CALLS[name](functools.partial(lambda flag, p: (p.dim() > 1) == flag, True)), expected)


@pytest.mark.parametrize("name", list(CALLS))
def test_two_argument_where_sees_the_flat_dict_key(name):
    expected = CALLS[name](lambda n, p: n.endswith("weight"))
    assert _same(CALLS[name](lambda n, p=None: n.endswith("weight")), expected)  # two fit: (name, leaf)


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize(
    "where, words",
    [
        (lambda: True, r"signature \(\)"),
        (lambda a, b, c: True, r"signature \(a, b, c\)"),
        (lambda *, p: True, r"signature \(\*, p\)"),
    ],
)
def test_a_callable_of_another_shape_raises_naming_where(name, where, words):
    with pytest.raises(TypeError, match=r"Expected where to take \(name, tensor\) or \(tensor\) .*" + words):
        CALLS[name](where)


@pytest.mark.parametrize("name", list(CALLS))
def test_a_non_callable_raises_naming_where(name):
    with pytest.raises(TypeError, match=r"Expected where to be None or a callable where\(name, tensor\)"):
        CALLS[name]("weight")


def test_pruners_and_calibration_follow_the_rule():
    pruner = fprune.gradual_magnitude(lambda step: 0.5, every=1, where=lambda p: p.dim() > 1)
    masks, _ = pruner.update(PARAMS, pruner.init(PARAMS))
    assert masks["fc1.bias"].all() and not masks["fc1.weight"].all()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    one = fprune.calibration.input_norms(
        model, dict(model.named_parameters()), [torch.ones(1, 2)], where=lambda w: w.shape[0] == 1
    )
    two = fprune.calibration.input_norms(
        model, dict(model.named_parameters()), [torch.ones(1, 2)], where=lambda n, w: n == "1.weight"
    )
    assert one.keys() == two.keys() == {"1.weight"}
    with pytest.raises(TypeError, match="Expected where to take"):
        fprune.calibration.input_norms(
            model, dict(model.named_parameters()), [torch.ones(1, 2)], where=lambda: True
        )


@pytest.mark.parametrize("name", list(CALLS))
def test_a_where_answering_with_a_tensor_of_many_values_raises_naming_where_and_the_leaf(name):
    # where picks whole leaves; an entry-wise answer (p > 0) is not a bool
    with pytest.raises(TypeError, match=r"Expected where\(name, tensor\) to return a bool for the leaf 'fc1"):
        CALLS[name](lambda n, p: p > 0)
    with pytest.raises(TypeError, match=r"Expected where\(tensor\) to return a bool .* Tensor of shape \(2,"):
        CALLS[name](lambda p: p > 0)


@pytest.mark.parametrize("name", list(CALLS))
def test_an_error_inside_where_keeps_its_type_and_says_which_call_form_and_leaf(name):
    # a one-argument where gets the tensor: name.endswith fails on it
    with pytest.raises(AttributeError, match="endswith") as caught:
        CALLS[name](lambda name: name.endswith("weight"))
    note = "\n".join(getattr(caught.value, "__notes__", []))
    assert "Raised by where(tensor) for the leaf 'fc1" in note and "gets the tensor only" in note
