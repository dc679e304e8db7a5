"""compat's entry checks on inputs a user may well pass: a parametrized tensor, a NaN amount, a
meta tensor, packed masks in ``functional_to_hooks``.

Each call raises a clear exception naming the tensor and leaves the module as it was."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parametrize

import fprune
import fprune.compat as prune


class _Symmetric(torch.nn.Module):
    def forward(self, x):
        return x.triu() + x.triu(1).t()


def _parametrized():
    layer = torch.nn.Linear(4, 4)
    parametrize.register_parametrization(layer, "weight", _Symmetric())
    return layer


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}, sorted(
        n for n, _ in module.named_buffers()
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda m: prune.l1_unstructured(m, "weight", 0.5),
        lambda m: prune.random_unstructured(m, "weight", 0.5),
        lambda m: prune.ln_structured(m, "weight", 0.5, 2, 0),
        lambda m: prune.identity(m, "weight"),
        lambda m: prune.global_unstructured(
            [(torch.nn.Linear(2, 2), "weight"), (m, "weight")], prune.L1Unstructured, amount=0.5
        ),
    ],
)
def test_a_parametrized_weight_is_refused_naming_it(call):
    # Not torch's internal "cannot assign 'torch.FloatTensor' object to parameter 'weight_orig'".
    layer = _parametrized()
    before = _state(layer)
    with pytest.raises(TypeError, match=r"Linear\.weight is computed by a parametrization.*'original'"):
        call(layer)
    after = _state(layer)
    assert after[1] == before[1] and all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    # the way the message gives works
    prune.l1_unstructured(layer.parametrizations.weight, "original", 0.5)
    assert int((layer.parametrizations.weight.original_mask == 0).sum()) == 8


@pytest.mark.parametrize(
    "call",
    [
        lambda m: prune.l1_unstructured(m, "weight", float("nan")),
        lambda m: prune.random_unstructured(m, "weight", float("nan")),
        lambda m: prune.random_structured(m, "weight", float("nan"), 0),
        lambda m: prune.global_unstructured([(m, "weight")], prune.L1Unstructured, amount=float("nan")),
    ],
)
def test_a_nan_amount_is_refused_in_torchs_words(call):
    # Not Python's "cannot convert float NaN to integer".
    layer = torch.nn.Linear(4, 4)
    with pytest.raises(
        ValueError,
        match=r"amount=nan should either be a float in the range \[0, 1\] or a non-negative integer",
    ):
        call(layer)
    assert not hasattr(layer, "weight_mask")


@pytest.mark.parametrize(
    "call",
    [
        lambda m: prune.random_unstructured(m, "weight", 0.5),
        lambda m: prune.l1_unstructured(m, "weight", 0.5),
        lambda m: prune.random_structured(m, "weight", 0.5, 0),
        lambda m: prune.global_unstructured([(m, "weight")], prune.RandomUnstructured, amount=0.5),
    ],
)
def test_a_meta_weight_is_refused_naming_module_weight(call):
    # The message names the tensor, not `scores` (an argument the user never passed).
    layer = torch.nn.Linear(4, 3, device="meta")
    with pytest.raises(ValueError, match=r"Expected Linear\.weight to hold values, got a meta tensor"):
        call(layer)
    assert not hasattr(layer, "weight_mask")
    prune.identity(layer, "weight")  # needs no values: allowed, as in torch
    assert layer.weight_mask.device.type == "meta"


def test_functional_to_hooks_takes_packed_masks():
    # Packed masks are unpacked (no AttributeError: 'PackedMask' object has no attribute 'to').
    layer = torch.nn.Linear(4, 3)
    masks = fprune.l1_unstructured(dict(layer.named_parameters()), 0.5)
    prune.functional_to_hooks(layer, fprune.pack_masks(masks))
    assert torch.equal(layer.weight_mask, masks["weight"].float())
    assert torch.equal(layer.bias_mask, masks["bias"].float())
