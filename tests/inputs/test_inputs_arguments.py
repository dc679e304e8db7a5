"""Bad input: clear exceptions (torch's types) naming the argument, and inputs left untouched."""

import math

import pytest
import torch

import fprune

W = {"fc.weight": torch.randn(4, 3), "fc.bias": torch.randn(4)}

ALL_AMOUNT_FUNCTIONS = [
    lambda p, a: fprune.l1_unstructured(p, a),
    lambda p, a: fprune.random_unstructured(p, a, generator=0),
    lambda p, a: fprune.global_unstructured(p, a),
    lambda p, a: fprune.ln_structured(p, a, 2, 0, where=lambda n, t: t.dim() > 1),
    lambda p, a: fprune.random_structured(p, a, 0, generator=0, where=lambda n, t: t.dim() > 1),
]


@pytest.mark.parametrize("fn", ALL_AMOUNT_FUNCTIONS)
@pytest.mark.parametrize(
    "amount, error, words",
    [
        (-1, ValueError, "amount=-1"),
        (1.5, ValueError, "amount=1.5"),
        (-0.1, ValueError, "amount=-0.1"),
        (math.nan, ValueError, "amount=nan"),
        (math.inf, ValueError, "amount=inf"),
        ("half", TypeError, "'half'"),
        (None, TypeError, "None"),
        (True, TypeError, "True"),
        (torch.tensor(3), TypeError, "torch.int64"),
        (torch.tensor([0.5]), ValueError, "0-dim"),
    ],
)
def test_invalid_amounts(fn, amount, error, words):
    with pytest.raises(error, match="amount") as info:
        fn(W, amount)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "call, what",
    [
        (
            lambda: fprune.l1_unstructured(W, 5),
            (
                r"amount=5 is more than the 4 parameters left to prune in params\['fc.bias'\]; "
                r"expected a count of at most 4"
            ),
        ),
        (
            lambda: fprune.random_unstructured(W, 13, where=lambda n, p: p.dim() > 1),
            "amount=13 is more than the 12 parameters left to prune",
        ),
        (
            lambda: fprune.global_unstructured(W, 17),
            "amount=17 is more than the 16 parameters left to prune in params;",
        ),
        (
            lambda: fprune.ln_structured(W["fc.weight"], 5, 2, 0),
            "amount=5 is more than the 4 channels left to prune in params along dim 0",
        ),
        (
            lambda: fprune.random_structured(W["fc.weight"], 4, 1),
            "amount=4 is more than the 3 channels left to prune",
        ),
        (
            lambda: fprune.l1_unstructured(torch.ones(4), 3, masks=torch.tensor([True, True, False, False])),
            "amount=3 is more than the 2 parameters left to prune",
        ),
        (
            lambda: fprune.ln_structured(
                torch.ones(3, 2), 3, 1, 0, masks=torch.tensor([[1, 1], [0, 0], [0, 1]])
            ),
            "amount=3 is more than the 2 channels left to prune",
        ),
    ],
)
def test_count_larger_than_what_remains(call, what):
    with pytest.raises(ValueError, match=what):
        call()


@pytest.mark.parametrize("dim", [2, -3, 10])
def test_dim_out_of_range(dim):
    with pytest.raises(IndexError, match=rf"Invalid index {dim} .* params\['w'\]"):
        fprune.ln_structured({"w": torch.randn(3, 4)}, 1, 2, dim)
    with pytest.raises(IndexError, match=f"Invalid index {dim}"):
        fprune.random_structured({"w": torch.randn(3, 4)}, 1, dim)


def test_dim_of_wrong_type():
    with pytest.raises(TypeError, match="dim"):
        fprune.ln_structured(torch.randn(3, 4), 1, 2, 0.5)


@pytest.mark.parametrize(
    "fn", [lambda p: fprune.ln_structured(p, 1, 1, 0), lambda p: fprune.random_structured(p, 1, 0)]
)
def test_structured_pruning_needs_two_dims(fn):
    with pytest.raises(ValueError, match=r"multidimensional.*params\['fc.bias'\].*where="):
        fn(W)


@pytest.mark.parametrize("n, error", [("max", ValueError), (None, TypeError), (True, TypeError)])
def test_bad_norm(n, error):
    with pytest.raises(error, match="Expected n"):
        fprune.ln_structured(torch.randn(3, 3), 1, n, 0)


def test_non_tensor_leaves_are_named():
    with pytest.raises(TypeError, match=r"got float at params\['b'\]\[1\]"):
        fprune.l1_unstructured({"a": torch.ones(2), "b": [torch.ones(1), 3.0]}, 0.5)
    with pytest.raises(TypeError, match=r"got bool at masks\['w'\]\[0\]"):
        fprune.apply_masks({"w": torch.ones(2)}, {"w": [True, False]})
    with pytest.raises(TypeError, match=r"importance_scores\['w'\]"):
        fprune.l1_unstructured({"w": torch.ones(2)}, 1, importance_scores={"w": "big"})


def test_mismatched_trees_and_shapes():
    params = {"a": torch.ones(2, 2), "b": torch.ones(3)}
    with pytest.raises(ValueError, match=r"importance_scores has no entry for params\['b'\]"):
        fprune.l1_unstructured(params, 1, importance_scores={"a": torch.ones(2, 2)})
    with pytest.raises(ValueError, match=r"masks\['c'\] has no matching entry in params"):
        fprune.l1_unstructured(params, 1, masks={"c": torch.ones(3, dtype=torch.bool)})
    with pytest.raises(
        ValueError, match=r"Expected masks\['b'\] to have the shape of params\['b'\], \(3,\), got \(4,\)"
    ):
        fprune.global_unstructured(params, 1, masks={"a": torch.ones(2, 2), "b": torch.ones(4)})
    with pytest.raises(ValueError, match=r"importance_scores\['a'\].*\(2, 2\), got \(4,\)"):
        fprune.ln_structured(params, 1, 1, 0, importance_scores={"a": torch.ones(4), "b": torch.ones(3)})
    with pytest.raises(ValueError, match="masks"):
        fprune.apply_masks([torch.ones(2)], [torch.ones(2), torch.ones(2)])
    with pytest.raises(TypeError, match="real tensor"):
        fprune.l1_unstructured(
            params, 1, importance_scores={"a": torch.ones(2, 2, dtype=torch.complex64), "b": torch.ones(3)}
        )


def test_bad_generator_normalize_where_module():
    with pytest.raises(TypeError, match="generator"):
        fprune.random_unstructured(W, 0.5, generator=1.5)
    with pytest.raises(TypeError, match="generator"):
        fprune.random_unstructured(W, 0.5, generator=torch.tensor(1.0))
    with pytest.raises(ValueError, match="generator"):
        fprune.random_structured(W, 0.5, 0, generator=torch.tensor([1, 2]), where=lambda n, p: p.dim() > 1)
    with pytest.raises(ValueError, match=r"normalize.*'l3'"):
        fprune.global_unstructured(W, 0.5, normalize="l3")
    with pytest.raises(TypeError, match="where"):
        fprune.l1_unstructured(W, 0.5, where="weight")
    with pytest.raises(TypeError, match="module"):
        fprune.masked_call(lambda x: x, {}, {}, (torch.ones(1),))
    with pytest.raises(TypeError, match="flat dict"):
        fprune.masked_call(torch.nn.Linear(1, 1), [torch.ones(1, 1)], [torch.ones(1, 1)], (torch.ones(1),))


def test_failed_calls_leave_inputs_untouched():
    params = {k: v.clone() for k, v in W.items()}
    masks = {k: torch.ones_like(v, dtype=torch.bool) for k, v in W.items()}
    snapshot = ({k: v.clone() for k, v in params.items()}, {k: v.clone() for k, v in masks.items()})
    for call in (
        lambda: fprune.l1_unstructured(params, 99, masks=masks),
        lambda: fprune.ln_structured(params, 1, 2, 0, masks=masks),
        lambda: fprune.global_unstructured(params, -1, masks=masks),
    ):
        with pytest.raises((ValueError, TypeError, IndexError)):
            call()
    assert all(
        torch.equal(params[k], snapshot[0][k]) and torch.equal(masks[k], snapshot[1][k]) for k in params
    )
