"""Hugging Face models from tiny configs: GPT-2's tied weights, BERT's structured pruning.

GPT-2 ties its LM head to the token embedding (``lm_head.weight is transformer.wte.weight``).
``named_parameters()`` lists the tensor once, under ``transformer.wte.weight``, so it gets one
mask and is pruned once; ``masked_call`` (``functional_call`` with ``tie_weights=True``) hands the
pruned tensor to both uses. torch.nn.utils.prune, by contrast, unties them.
"""

import copy

import pytest
import torch
import torch.nn.utils.prune as torch_prune

import fprune
from tests.helpers import close, params_of
from zoo_models import HF_CASES, owner, prunable, zeroed_copy

pytest.importorskip("transformers")

GPT2, BERT = HF_CASES
WTE, LM_HEAD = GPT2.tied[0]


def _gpt2_outputs(model, params=None, masks=None, **options):
    (ids,), _ = GPT2.inputs()
    kwargs = {"output_hidden_states": True}
    with torch.no_grad():
        if params is None:
            out = model(ids, **kwargs)
        else:
            out = fprune.masked_call(model, params, masks, (ids,), kwargs, **options)
    return out.logits, out.hidden_states[-1]  # logits = lm_head(final hidden states)


@pytest.fixture
def gpt2():
    model = GPT2.build()
    params = params_of(model)
    masks = fprune.global_unstructured(params, 0.5, where=prunable)
    return model, params, masks


def test_tied_weight_is_one_parameter_with_one_mask(gpt2):
    model, params, masks = gpt2
    assert model.get_parameter(LM_HEAD) is model.get_parameter(WTE)
    assert WTE in params and LM_HEAD not in params
    assert set(masks) == set(params)
    # Pruned once: the global count is over the distinct tensors, the tied one counted once.
    distinct = sum(p.numel() for name, p in params.items() if prunable(name, p))
    assert sum(int((~masks[n]).sum()) for n in masks) == round(0.5 * distinct)
    assert (~masks[WTE]).any() and masks[WTE].any()


def test_lm_head_uses_the_pruned_embedding(gpt2):
    model, params, masks = gpt2
    logits, hidden = _gpt2_outputs(model, params, masks)
    pruned_wte = params[WTE] * masks[WTE]
    assert close(logits, hidden @ pruned_wte.T, atol=1e-5)
    assert not close(logits, hidden @ params[WTE].T, atol=1e-5)
    assert close(logits, _gpt2_outputs(zeroed_copy(model, masks))[0], atol=1e-5)


def test_untied_call_leaves_the_lm_head_dense(gpt2):
    model, params, masks = gpt2
    logits, hidden = _gpt2_outputs(model, params, masks, tie_weights=False)
    assert close(logits, hidden @ params[WTE].T, atol=1e-5)  # only the input embedding was replaced


def test_the_alias_name_is_rejected_with_a_clear_error(gpt2):
    model, params, masks = gpt2
    (ids,), _ = GPT2.inputs()
    with pytest.raises(ValueError, match=r"masks\['lm_head.weight'\] has no matching entry in params"):
        fprune.masked_call(model, params, {LM_HEAD: masks[WTE]}, (ids,))


def test_torch_prune_unties_the_lm_head(gpt2):
    model, params, _masks = gpt2
    theirs = copy.deepcopy(model)
    torch_prune.l1_unstructured(theirs.transformer.wte, "weight", amount=0.5)
    ours = fprune.l1_unstructured(params, 0.5, where=lambda name, p: name == WTE)
    assert torch.equal(theirs.transformer.wte.weight_mask.bool(), ours[WTE])
    # The LM head keeps the Parameter, now registered as wte.weight_orig: it stays dense.
    assert theirs.lm_head.weight is theirs.transformer.wte.weight_orig
    logits, hidden = _gpt2_outputs(theirs)
    assert close(logits, hidden @ params[WTE].T, atol=1e-5)
    assert not close(logits, _gpt2_outputs(model, params, ours)[0], atol=1e-5)


def test_saving_a_pruned_tied_model(gpt2):
    model, params, masks = gpt2
    expected = _gpt2_outputs(model, params, masks)[0]
    # Pitfall: state_dict() lists both tied names; merging the pruned tensors into it updates
    # only wte, and loading then writes the dense lm_head.weight over the same Parameter.
    naive = {**model.state_dict(), **fprune.apply_masks(params, masks)}
    fresh = GPT2.build(seed=1)
    fresh.load_state_dict(naive)
    assert fresh.transformer.wte.weight[~masks[WTE]].any()
    # Write the pruned values into the module instead: every alias sees them.
    fresh.load_state_dict(zeroed_copy(model, masks).state_dict())
    assert not fresh.transformer.wte.weight[~masks[WTE]].any()
    assert close(_gpt2_outputs(fresh)[0], expected, atol=1e-5)


def test_bert_structured_pruning_of_feed_forward_neurons_equals_torch():
    model = BERT.build()
    params = params_of(model)

    def ffn(name, p):
        return name.endswith("intermediate.dense.weight")

    masks = fprune.ln_structured(params, 0.5, n=2, dim=0, where=ffn)
    theirs = copy.deepcopy(model)
    chosen = [name for name in params if ffn(name, params[name])]
    assert len(chosen) == 2
    for name in chosen:
        module, leaf = owner(theirs, name)
        torch_prune.ln_structured(module, leaf, amount=0.5, n=2, dim=0)
        assert torch.equal(getattr(module, leaf + "_mask").bool(), masks[name])
        rows = masks[name].all(dim=1)
        assert int((~rows).sum()) == 32 and torch.equal(rows, masks[name].any(dim=1))
    args, kwargs = BERT.inputs()
    with torch.no_grad():
        ours = BERT.output(fprune.masked_call(model, params, masks, args, kwargs))
        assert close(BERT.output(theirs(*args, **kwargs)), ours, atol=1e-5)
        assert not close(BERT.output(model(*args, **kwargs)), ours, atol=1e-5)
