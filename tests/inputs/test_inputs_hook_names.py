"""Params keyed like a hook-pruned model (``0.weight_orig``) are refused by every entry point.

Masks computed from such params would be keyed ``0.weight_orig`` and would revive the entries the
hooks pruned. The rule for a tree is the name alone (a key whose last part ends in ``_orig``);
``masked_call`` knows the module and refuses such a key only beside the hook's ``_mask`` buffer.
"""

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune
from fprune import compat


def _hooked():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    torch_prune.l1_unstructured(model[0], "weight", amount=0.5)
    return model


def _hook_params():
    return {k: v.detach() for k, v in _hooked().named_parameters()}  # "0.weight_orig", "0.bias", ...


def _loss(params, batch):
    return sum((p * p).sum() for p in params.values()) * batch.sum()


ENTRY_POINTS = {
    "l1_unstructured": lambda p: fprune.l1_unstructured(p, 0.5),
    "random_unstructured": lambda p: fprune.random_unstructured(p, 0.5, generator=0),
    "global_unstructured": lambda p: fprune.global_unstructured(p, 0.5),
    "ln_structured": lambda p: fprune.ln_structured({k: v for k, v in p.items() if v.dim() > 1}, 0.5, 2, 0),
    "random_structured": lambda p: fprune.random_structured(
        {k: v for k, v in p.items() if v.dim() > 1}, 0.5, 0, generator=0
    ),
    "rowwise_unstructured": lambda p: fprune.rowwise_unstructured(
        {k: v for k, v in p.items() if v.dim() > 1}, 0.5
    ),
    "n_m": lambda p: fprune.n_m({k: v for k, v in p.items() if v.dim() > 1}, 1, 2),
    "identity": lambda p: fprune.identity(p),
    "select": lambda p: fprune.select.select(p, 0.5),
    "select(params=)": lambda p: fprune.select.select({k: v.abs() for k, v in p.items()}, 0.5, params=p),
    "scores.magnitude": lambda p: fprune.scores.magnitude(p),
    "scores.snip": lambda p: fprune.scores.snip(_loss, p, [torch.ones(1)]),
    "distributions.uniform": lambda p: fprune.distributions.uniform(p, 0.5),
    "distributions.erk": lambda p: fprune.distributions.erk(p, 0.5),
    "iterative": lambda p: fprune.iterative(fprune.scores.magnitude, p, 0.5, rounds=2),
    "apply_masks": lambda p: fprune.apply_masks(p, {}),
    "masked_call": lambda p: fprune.masked_call(_hooked(), p, {}, (torch.ones(1, 6),)),
}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_every_entry_point_refuses_hook_pruned_names(name):
    with pytest.raises(
        ValueError,
        match=r"(params|scores)\[.0.weight_orig.\] is named like the parameter a torch.nn.utils.prune hook",
    ) as info:
        ENTRY_POINTS[name](_hook_params())
    message = str(info.value)
    assert "fprune.compat.hooks_to_functional(model)" in message and "'0.weight_mask'" in message


def test_the_way_out_the_message_names_works():
    hooked = _hooked()
    params, masks = compat.hooks_to_functional(hooked)
    new = fprune.l1_unstructured(params, 0.75, masks=masks)
    # what the hooks pruned stays pruned: the new masks are nested in the hooks' masks
    assert not (new["0.weight"] & ~masks["0.weight"]).any()
    x = torch.randn(5, 6)
    plain = _hooked()
    compat.strip_pruning(plain)
    torch.testing.assert_close(fprune.masked_call(plain, params, masks, (x,)), hooked(x))


def test_nested_trees_and_near_names():
    with pytest.raises(ValueError, match=r"params\['fc'\]\['weight_orig'\] is named like"):
        fprune.l1_unstructured({"fc": {"weight_orig": torch.ones(4)}}, 1)
    # not the hook's form: no suffix, the suffix alone, or a longer word
    for key in ("weight", "_orig", "weight_original", "orig", "fc._orig"):
        fprune.l1_unstructured({key: torch.arange(4.0)}, 1)


def test_select_refuses_scores_keyed_like_a_hook_pruned_model():
    with pytest.raises(ValueError, match=r"scores\['0.weight_orig'\] is named like"):
        fprune.select.select({"0.weight_orig": torch.ones(3)}, 1)


def test_masked_call_goes_by_the_module_for_a_tensor_of_ones_own():
    # torch.nn.utils.spectral_norm keeps its weight as "weight_orig" too, with no _mask buffer:
    # masked_call, which sees the module, runs it; a tree alone cannot tell, and refuses.
    torch.manual_seed(0)
    model = torch.nn.utils.spectral_norm(torch.nn.Linear(4, 3))
    model.eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    assert "weight_orig" in params
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(fprune.masked_call(model, params, {}, (x,)), expected)
    with pytest.raises(ValueError, match=r"spectral_norm's 'weight_orig', say\) must go under another key"):
        fprune.l1_unstructured(params, 0.5)
    # the way round for such a tensor: another key for the selection, the module's key to run
    masks = fprune.l1_unstructured({"w": params["weight_orig"]}, 0.5)
    out = fprune.masked_call(model, params, {"weight_orig": masks["w"]}, (x,))
    assert out.shape == expected.shape


def test_masked_call_message_for_a_hook_pruned_module_says_how_it_knew():
    with pytest.raises(
        ValueError, match=r"the Sequential module has the hook's '0.weight_mask' buffer beside it"
    ) as info:
        fprune.masked_call(_hooked(), _hook_params(), {}, (torch.ones(1, 6),))
    assert "must go under another key" not in str(info.value)


def test_nothing_is_changed_by_a_refused_call():
    hooked = _hooked()
    before = {k: v.clone() for k, v in hooked.state_dict().items()}
    params = dict(hooked.named_parameters())
    with pytest.raises(ValueError):
        fprune.global_unstructured(params, 0.5)
    with pytest.raises(ValueError):
        fprune.masked_call(hooked, params, {}, (torch.ones(1, 6),))
    after = hooked.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
