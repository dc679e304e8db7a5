"""The bit-packed mask format: exact round trips, 1 bit per entry, accepted by apply_masks/masked_call."""

import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fprune
from fprune.packed import PackedMask, pack_masks, unpack_masks


@st.composite
def mask_trees(draw):
    tree = {}
    for name in draw(
        st.lists(st.sampled_from(["a", "b", "c.weight", "d"]), min_size=1, max_size=4, unique=True)
    ):
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


# ---- what works with packed masks, and loading them with weights_only=True ----------------------

import io  # noqa: E402

from torch.func import grad, vmap  # noqa: E402

from fprune.packed import from_state, to_state  # noqa: E402


@given(mask_trees())
def test_saved_state_loads_with_weights_only(masks):
    buffer = io.BytesIO()
    torch.save(to_state(pack_masks(masks)), buffer)
    buffer.seek(0)
    loaded = from_state(torch.load(buffer, weights_only=True))
    back = unpack_masks(loaded)
    assert all(torch.equal(back[k], masks[k]) for k in masks)


def test_saved_packed_masks_load_with_a_plain_torch_load(tmp_path):
    masks = {"w": torch.tensor([[True, False, True], [False, True, True]]), "b": torch.ones(9) > 0}
    path = tmp_path / "packed.pt"
    torch.save(pack_masks(masks), path)
    loaded = torch.load(path)  # weights_only=True, torch's default
    assert all(isinstance(leaf, PackedMask) for leaf in loaded.values())
    for name, mask in masks.items():
        assert torch.equal(unpack_masks(loaded)[name], mask)
    # In a fresh process, importing fprune is all a reader needs.
    script = (
        "import sys, torch, fprune\n"
        "loaded = torch.load(sys.argv[1])\n"
        "print(fprune.unpack_masks(loaded)['w'].tolist())\n"
    )
    command = [sys.executable, "-c", script, str(path)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(masks["w"].tolist())


def test_from_state_checks_sizes_and_unpack_checks_bits():
    with pytest.raises(ValueError, match="Expected bits of 2 bytes for shape \\(3, 4\\), got 1"):
        from_state({"w": {"bits": torch.zeros(1, dtype=torch.uint8), "shape": (3, 4)}})
    with pytest.raises(ValueError, match="to hold 2 uint8 bytes"):
        unpack_masks({"w": PackedMask(torch.zeros(4, 2, dtype=torch.uint8), torch.Size([3, 4]))})


def _setup():
    params = {"w": torch.randn(3, 5, generator=torch.Generator().manual_seed(0)), "b": torch.randn(3)}
    masks = fprune.l1_unstructured(params, 0.5)
    return params, masks, pack_masks(masks)


def test_packed_masks_work_under_compile():
    params, masks, packed = _setup()
    compiled = torch.compile(lambda p, m: fprune.apply_masks(p, m), fullgraph=True, backend="eager")
    got, want = compiled(params, packed), fprune.apply_masks(params, masks)
    assert all(torch.equal(got[k], want[k]) for k in params)
    pack_compiled = torch.compile(
        lambda p: pack_masks(fprune.l1_unstructured(p, 0.5)), fullgraph=True, backend="eager"
    )
    assert all(torch.equal(pack_compiled(params)[k].bits, packed[k].bits) for k in params)


def test_packed_masks_work_under_grad():
    params, masks, packed = _setup()
    g = grad(lambda p: fprune.apply_masks(p, packed)["w"].square().sum())(params)
    assert torch.equal(g["w"], 2 * params["w"] * masks["w"])


def test_packed_masks_closed_over_work_under_vmap_but_cannot_be_vmapped_over():
    params, masks, packed = _setup()
    stacked = {k: torch.stack([v, 2 * v]) for k, v in params.items()}
    out = vmap(lambda p: fprune.apply_masks(p, packed))(stacked)
    assert torch.equal(out["w"][1], 2 * fprune.apply_masks(params, masks)["w"])
    with pytest.raises(ValueError, match="PackedMask"):  # documented: not a vmap input
        vmap(lambda p, m: fprune.apply_masks(p, m))(
            stacked, pack_masks({k: torch.stack([m, m]) for k, m in masks.items()})
        )
