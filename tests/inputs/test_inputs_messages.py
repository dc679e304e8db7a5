"""Error messages: each names the argument, the value and what was expected (meta, bool and sparse
tensors, out-of-range seeds, counts above what remains, mismatched trees)."""

import re

import pytest
import torch
from torch.func import vmap

import fprune

MASK_FUNCTIONS = {
    "l1": lambda p: fprune.l1_unstructured(p, 0.5),
    "random": lambda p: fprune.random_unstructured(p, 0.5, generator=0),
    "global": lambda p: fprune.global_unstructured(p, 0.5),
    "ln": lambda p: fprune.ln_structured(p, 0.5, 2, 0),
    "random_structured": lambda p: fprune.random_structured(p, 0.5, 0, generator=0),
}


@pytest.mark.parametrize("name", MASK_FUNCTIONS)
def test_meta_params_say_they_have_no_values(name):
    with pytest.raises(
        ValueError, match=r"Expected params\['w'\] to hold values, got a meta tensor \(shape \(3, 4\)"
    ):
        MASK_FUNCTIONS[name]({"w": torch.empty(3, 4, device="meta")})


def test_meta_params_still_trace_under_vmap():
    masks = vmap(lambda p: fprune.l1_unstructured(p, 0.5))({"w": torch.empty(2, 3, 4, device="meta")})
    assert masks["w"].shape == (2, 3, 4) and masks["w"].device.type == "meta"


@pytest.mark.parametrize("name", MASK_FUNCTIONS)
def test_bool_params_are_a_type_error_naming_the_leaf(name):
    with pytest.raises(
        TypeError,
        match=r"Expected params\['w'\] to be a floating-point or integer tensor, got dtype torch.bool",
    ):
        MASK_FUNCTIONS[name]({"w": torch.ones(3, 4, dtype=torch.bool)})


def test_bool_importance_scores_are_a_type_error():
    with pytest.raises(
        TypeError, match=r"importance_scores\['w'\] to be a real tensor .* got dtype torch.bool"
    ):
        fprune.global_unstructured(
            {"w": torch.ones(3)}, 1, importance_scores={"w": torch.ones(3, dtype=torch.bool)}
        )


@pytest.mark.parametrize(
    "call",
    [
        lambda s: fprune.l1_unstructured({"w": s}, 0.5),
        lambda s: fprune.global_unstructured({"w": s}, 0.5),
        lambda s: fprune.apply_masks({"w": s}, {}),
        lambda s: fprune.sparsity({"w": s}),
        lambda s: fprune.apply_masks({"w": torch.eye(3)}, {"w": s}),
    ],
)
def test_sparse_tensors_name_the_layout_and_the_fix(call):
    with pytest.raises(
        TypeError,
        match=r"dense \(strided\) tensor, got a sparse_coo tensor at (params|masks)\['w'\]; "
        r"convert it with .to_dense\(\)",
    ):
        call(torch.eye(3).to_sparse())


@pytest.mark.parametrize("seed", [2**70, -(2**63) - 1, 2**63])
def test_generator_seeds_outside_int64_name_the_argument(seed):
    with pytest.raises(
        ValueError, match=rf"generator to fit in int64, \[-2\*\*63, 2\*\*63 - 1\], got {seed}"
    ):
        fprune.random_unstructured({"w": torch.ones(3)}, 0.5, generator=seed)


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63), 2**40])
def test_generator_seeds_inside_int64_work(seed):
    masks = fprune.random_unstructured({"w": torch.ones(8)}, 3, generator=seed)
    assert int((~masks["w"]).sum()) == 3


def test_count_message_says_what_it_means_when_the_maximum_is_accepted():
    params = {"w": torch.randn(12)}
    assert int((~fprune.l1_unstructured(params, 12)["w"]).sum()) == 12  # 12 itself is accepted
    with pytest.raises(ValueError) as info:
        fprune.l1_unstructured(params, 13)
    message = str(info.value)
    assert "should be smaller" not in message
    assert re.search(
        r"amount=13 is more than the 12 parameters left to prune in params\['w'\]; "
        r"expected a count of at most 12",
        message,
    )


def test_iterative_count_error_names_params_and_the_limit():
    params = {"w": torch.arange(1.0, 4.0), "b": torch.ones(2)}
    score_fn = lambda m: fprune.scores.magnitude(params, masks=m)
    with pytest.raises(ValueError, match=r"amount=4 is more than the 3 parameters left to prune in params"):
        fprune.iterative(score_fn, params, 4, rounds=2, where=lambda name, p: name == "w")
    masks = fprune.iterative(score_fn, params, 3, rounds=2, where=lambda name, p: name == "w")
    assert not masks["w"].any() and masks["b"].all()


def test_compat_keeps_torch_wording():
    import fprune.compat as prune

    layer = torch.nn.Linear(3, 4)
    with pytest.raises(ValueError, match="should be smaller than the number of parameters to prune"):
        prune.l1_unstructured(layer, "weight", amount=13)


def test_gpt2_sized_tree_mismatch_is_short():
    # The keys that differ, not the trees' PyTreeSpecs (thousands of characters for GPT-2).
    params = {
        f"transformer.h.{i}.{part}": torch.ones(2)
        for i in range(2)
        for part in (
            "ln_1.weight",
            "ln_1.bias",
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "attn.c_proj.bias",
            "ln_2.weight",
            "ln_2.bias",
            "mlp.c_fc.weight",
            "mlp.c_fc.bias",
            "mlp.c_proj.weight",
            "mlp.c_proj.bias",
        )
    }
    masks = {"lm_head.weight": torch.ones(2, dtype=torch.bool)}
    with pytest.raises(
        ValueError, match=r"masks\['lm_head.weight'\] has no matching entry in params"
    ) as info:
        fprune.apply_masks(params, masks)
    assert len(str(info.value)) < 300 and "PyTreeSpec" not in str(info.value)
