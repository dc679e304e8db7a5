"""The bit-packed mask format: exact round trips, 1 bit per entry, accepted by apply_masks/masked_call."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune
from fprune.packed import PackedMask, pack_masks, unpack_masks


@st.composite
def mask_trees(draw):
    tree = {}
    for name in draw(st.lists(st.sampled_from(["a", "b", "c.weight", "d"]), min_size=1, max_size=4, unique=True)):
        shape = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=3)))
        n = int(torch.Size(shape).numel())
        values = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        tree[name] = torch.tensor(values, dtype=torch.bool).reshape(shape)
    return tree


@given(mask_trees())
def test_round_trip_is_exact_and_uses_one_bit_per_entry(masks):
    packed = pack_masks(masks)
    assert set(packed) == set(masks)
    for name, mask in masks.items():
        assert isinstance(packed[name], PackedMask)
        assert packed[name].bits.dtype == torch.uint8
        assert packed[name].bits.numel() == (mask.numel() + 7) // 8
    back = unpack_masks(packed)
    for name, mask in masks.items():
        assert back[name].dtype == torch.bool and back[name].shape == mask.shape
        assert torch.equal(back[name], mask)


def test_bit_order_is_flat_index_least_significant_first():
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0, 0] = mask[0, 3] = mask[1, 7] = True
    assert pack_masks({"m": mask})["m"].bits.tolist() == [0b00001001, 0b10000000]


def test_zero_one_masks_of_other_dtypes_pack_like_bool():
    float_mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    assert torch.equal(unpack_masks(pack_masks([float_mask]))[0], float_mask != 0)


@given(mask_trees(), st.integers(0, 2**31 - 1))
def test_apply_masks_accepts_packed_masks(masks, seed):
    g = torch.Generator().manual_seed(seed)
    params = {name: torch.randn(m.shape, generator=g) for name, m in masks.items()}
    expected = fprune.apply_masks(params, masks)
    got = fprune.apply_masks(params, pack_masks(masks))
    for name in params:
        assert torch.equal(got[name], expected[name])


def test_masked_call_accepts_packed_masks_and_a_partial_dict():
    model = torch.nn.Linear(5, 3)
    params = dict(model.named_parameters())
    masks = fprune.l1_unstructured(params, 0.6, where=lambda name, p: name == "weight")
    x = torch.randn(4, 5)
    expected = fprune.masked_call(model, params, {"weight": masks["weight"]}, (x,))
    got = fprune.masked_call(model, params, pack_masks({"weight": masks["weight"]}), (x,))
    assert torch.equal(got, expected)


def test_unpack_leaves_plain_tensors_alone():
    plain = torch.tensor([True, False])
    tree = {"p": pack_masks({"x": torch.ones(3, dtype=torch.bool)})["x"], "t": plain}
    out = unpack_masks(tree)
    assert out["t"] is plain and out["p"].tolist() == [True, True, True]


def test_pack_rejects_non_tensor_leaves():
    with pytest.raises(TypeError, match="masks"):
        pack_masks({"a": [True, False]})
