"""The rule for masks: torch.bool, or the values 0 and 1 (any real dtype). Other values raise.

A float mask of 0.5 used to count as "kept" in the selections and to halve the weight in
``apply_masks``/``masked_call``. Values are read in eager code only, one host read per call.
"""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune
from tests.helpers import count_syncs

W = {"w": torch.tensor([[0.3, -1.0, 2.0], [0.1, 4.0, -0.5]]), "b": torch.tensor([1.0, -2.0])}
HALF = {"w": torch.tensor([[1.0, 0.5, 1.0], [1.0, 1.0, 0.0]])}

PRIOR_MASK_CALLS = {
    "l1_unstructured": lambda m: fprune.l1_unstructured(W, 1, masks=m),
    "global_unstructured": lambda m: fprune.global_unstructured(W, 1, masks=m),
    "random_unstructured": lambda m: fprune.random_unstructured(W, 1, masks=m, generator=0),
    "ln_structured": lambda m: fprune.ln_structured({"w": W["w"]}, 1, 2, 0, masks=m),
    "rowwise_unstructured": lambda m: fprune.rowwise_unstructured({"w": W["w"]}, 0.5, masks=m),
    "select": lambda m: fprune.select.select(W, 1, masks=m),
    "scores.magnitude": lambda m: fprune.scores.magnitude(W, masks=m),
    "apply_masks": lambda m: fprune.apply_masks(W, m),
    "masked_call": lambda m: fprune.masked_call(
        _linear(), {"weight": W["w"]}, {"weight": m["w"]}, (torch.ones(1, 3),)
    ),
}


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


@pytest.mark.parametrize("name", list(PRIOR_MASK_CALLS))
def test_a_fractional_mask_raises_naming_it(name):
    with pytest.raises(
        ValueError, match=r"Expected masks\['(w|weight)'\] to hold only 0 and 1 .*got values such as \[0.5\]"
    ):
        PRIOR_MASK_CALLS[name](HALF)


@pytest.mark.parametrize("name", list(PRIOR_MASK_CALLS))
@pytest.mark.parametrize("bad", [float("nan"), -1.0, 2.0])
def test_nan_and_other_values_raise_too(name, bad):
    mask = torch.ones(2, 3)
    mask[1, 2] = bad
    with pytest.raises(ValueError, match=r"Expected masks\['(w|weight)'\] to hold only 0 and 1"):
        PRIOR_MASK_CALLS[name]({"w": mask})


@pytest.mark.parametrize("name", list(PRIOR_MASK_CALLS))
def test_zero_one_masks_of_any_real_dtype_act_as_bool(name):
    keep = torch.tensor([[True, False, True], [True, True, False]])
    expected = PRIOR_MASK_CALLS[name]({"w": keep})
    for dtype in (torch.float32, torch.float64, torch.float16, torch.uint8, torch.int64):
        got = PRIOR_MASK_CALLS[name]({"w": keep.to(dtype)})
        for a, b in zip(_leaves(expected), _leaves(got), strict=True):
            assert torch.equal(a, b)


def _leaves(tree):
    return [tree] if isinstance(tree, torch.Tensor) else [tree[k] for k in sorted(tree)]


def test_complex_masks_raise_type_error():
    with pytest.raises(
        TypeError, match=r"Expected masks\['w'\] to be a torch.bool mask .* got dtype torch.complex64"
    ):
        fprune.apply_masks(W, {"w": torch.ones(2, 3, dtype=torch.complex64)})


@given(st.integers(0, 2**31 - 1), st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
def test_apply_masks_with_zero_one_masks_equals_bool_masks(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    params = {"a": torch.randn(4, 5, generator=g).to(dtype), "b": torch.randn(7, generator=g).to(dtype)}
    keep = {k: torch.rand(v.shape, generator=g) > 0.5 for k, v in params.items()}
    as_float = {k: m.to(dtype) for k, m in keep.items()}
    for a, b in zip(
        _leaves(fprune.apply_masks(params, keep)), _leaves(fprune.apply_masks(params, as_float)), strict=True
    ):
        assert torch.equal(a, b)


def test_one_host_read_for_all_non_bool_masks_and_none_for_bool():
    params = {f"w{i}": torch.randn(8, 8) for i in range(20)}
    bool_masks = {k: torch.rand(8, 8) > 0.5 for k in params}
    float_masks = {k: m.float() for k, m in bool_masks.items()}
    assert count_syncs(lambda: fprune.apply_masks(params, bool_masks)) == 0
    assert count_syncs(lambda: fprune.apply_masks(params, float_masks)) == 1
    fresh = {k: m.float() for k, m in bool_masks.items()}
    assert (
        count_syncs(lambda: fprune.l1_unstructured(params, 0.5, masks=fresh))
        == count_syncs(lambda: fprune.l1_unstructured(params, 0.5, masks=bool_masks)) + 1
    )


def test_unchanged_masks_are_read_once_and_a_change_is_seen():
    """A training loop passes the same float masks every step: read on the first step only."""
    params = {"w": torch.randn(4, 4)}
    masks = {"w": (torch.rand(4, 4) > 0.5).float()}
    assert count_syncs(lambda: fprune.apply_masks(params, masks)) == 1
    assert count_syncs(lambda: fprune.apply_masks(params, masks)) == 0
    masks["w"][0, 0] = 0.5  # in place: the version counter moves, the values are read again
    with pytest.raises(ValueError, match="to hold only 0 and 1"):
        fprune.apply_masks(params, masks)
    masks["w"][0, 0] = 1.0
    assert count_syncs(lambda: fprune.apply_masks(params, masks)) == 1
    with torch.no_grad():
        view = masks["w"][1]  # a view shares the counter: writing through it is seen too
        view.fill_(0.25)
    with pytest.raises(ValueError, match="to hold only 0 and 1"):
        fprune.apply_masks(params, masks)


def test_under_transforms_the_values_are_not_read():
    # vmap: nothing is read (a traced path cannot read values); the multiply is torch's
    masks = torch.tensor([[1.0, 0.5, 0.0]]).expand(2, 3)
    out = torch.func.vmap(lambda m: fprune.apply_masks({"w": W["w"][0]}, {"w": m})["w"])(masks)
    assert torch.equal(out, W["w"][0] * masks)
    # torch.compile(fullgraph=True): a host read would break the graph
    compiled = torch.compile(lambda p, m: fprune.apply_masks(p, m), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(W, {"w": torch.ones(2, 3)}), W)


def test_meta_masks_are_not_read():
    params = {"w": torch.empty(2, 3, device="meta")}
    out = fprune.apply_masks(params, {"w": torch.empty(2, 3, device="meta")})
    assert out["w"].device.type == "meta"
