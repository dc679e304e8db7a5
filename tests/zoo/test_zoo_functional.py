"""The functional API on real architectures (torch's own modules, and GPT-2 / BERT when installed).

For every zoo model: local and global magnitude pruning (exact counts, the smallest entries go),
a forward pass through ``masked_call`` that equals a copy with the pruned entries zeroed in place,
a training step with ``torch.func.grad`` (zero gradients at pruned entries, the kept entries'
gradients equal to autograd's on the zeroed copy), a state_dict round trip, and the masks and
the pruned forward of ``torch.nn.utils.prune`` where its hooks work.
"""

import copy
import io

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch.func import grad, stack_module_state, vmap

import fprune
from tests.helpers import close, params_of
from zoo_models import (
    HF_CASES,
    TORCH_CASES,
    buffers_of,
    owner,
    prunable,
    run,
    transformers,
    zeroed_copy,
)

CASES = TORCH_CASES + [
    pytest.param(case, marks=pytest.mark.skipif(transformers is None, reason="needs transformers"))
    for case in HF_CASES
]
# torch has no vmap batching rule for these modules' fused kernels (aten::lstm, aten::gru).
NO_VMAP_FORWARD = {"lstm", "gru"}
# torch.nn.utils.prune's forward differs from the pruned network here (see test_zoo_transformers):
# pruning GPT-2's tied embedding leaves the LM head on the dense Parameter.
TORCH_FORWARD_DIFFERS = {"gpt2"}


def by_name(case):
    return case.name


pytestmark = pytest.mark.parametrize("case", CASES, ids=by_name)


def test_local_pruning_prunes_exactly_the_smallest_of_each_leaf(case):
    params = params_of(case.build())
    masks = fprune.l1_unstructured(params, 0.3, where=prunable)
    assert set(masks) == set(params)
    for name, p in params.items():
        m = masks[name]
        assert m.dtype == torch.bool and m.shape == p.shape
        if not prunable(name, p):
            assert m.all(), name
            continue
        assert int((~m).sum()) == round(0.3 * p.numel()), name
        assert p[~m].abs().max() <= p[m].abs().min(), name


def test_global_pruning_prunes_exactly_the_smallest_overall(case):
    params = params_of(case.build())
    masks = fprune.global_unstructured(params, 0.5, where=prunable)
    chosen = [name for name, p in params.items() if prunable(name, p)]
    total = sum(params[n].numel() for n in chosen)
    assert sum(int((~masks[n]).sum()) for n in chosen) == round(0.5 * total)
    pruned = torch.cat([params[n][~masks[n]].abs() for n in chosen])
    kept = torch.cat([params[n][masks[n]].abs() for n in chosen])
    assert pruned.max() <= kept.min()
    assert all(masks[n].all() for n in params if n not in chosen)


def test_masked_call_equals_a_copy_with_pruned_entries_zeroed(case):
    model = case.build()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    params = params_of(model)
    masks = fprune.global_unstructured(params, 0.5, where=prunable)
    with torch.no_grad():
        out = run(case, model, params, masks)
        expected = run(case, zeroed_copy(model, masks))
        dense = run(case, model)
    assert close(out, expected)
    assert not close(out, dense)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the module is untouched


def test_training_step_has_zero_gradients_at_pruned_entries(case):
    model = case.build().train()  # dropout is 0 in the zoo; BatchNorm uses batch statistics
    params = params_of(model)
    # Layer-wise, so that no layer is pruned away entirely (global magnitude pruning removes
    # the whole small-valued head of the embedding model, and with it every gradient).
    masks = fprune.l1_unstructured(params, 0.5, where=prunable)

    def loss(params, buffers):
        # Buffers go in as an argument: BatchNorm updates its running stats in place, which
        # torch.func.grad allows on inputs of the function, not on tensors it captures.
        return run(case, model, params, masks, buffers).pow(2).mean()

    grads = grad(loss)(params, buffers_of(model))
    for name, mask in masks.items():
        assert torch.equal(grads[name][~mask], torch.zeros_like(grads[name][~mask])), name
        if prunable(name, params[name]):
            assert grads[name][mask].abs().sum() > 0, name

    # The kept entries' gradients are those of autograd on the zeroed copy.
    reference = zeroed_copy(model, masks).train()
    run(case, reference).pow(2).mean().backward()
    for name, p in reference.named_parameters():
        assert close(grads[name][masks[name]], p.grad[masks[name]]), name

    # One SGD step: pruned entries do not move, and the loss goes down.
    stepped = {name: p - 0.05 * grads[name] for name, p in params.items()}
    for name, mask in masks.items():
        assert torch.equal(stepped[name][~mask], params[name][~mask]), name
    with torch.no_grad():
        assert loss(stepped, buffers_of(model)) < loss(params, buffers_of(model))


def test_state_dict_round_trip(case):
    model = case.build()
    params = params_of(model)
    masks = fprune.global_unstructured(params, 0.5, where=prunable)
    with torch.no_grad():
        expected = run(case, model, params, masks)
    # Save the pruned weights (a plain state_dict, loadable by any copy of the model) and the masks.
    buffer = io.BytesIO()
    torch.save({"state_dict": zeroed_copy(model, masks).state_dict(), "masks": masks}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    fresh = case.build(seed=1)
    fresh.load_state_dict(saved["state_dict"], strict=True)
    loaded = params_of(fresh)
    for name, mask in saved["masks"].items():
        assert mask.dtype == torch.bool and torch.equal(mask, masks[name])
        assert not loaded[name][~mask].any(), name
    with torch.no_grad():
        assert close(run(case, fresh), expected)
        assert close(run(case, fresh, loaded, saved["masks"]), expected)


@pytest.mark.parametrize("kind", ["local", "global"])
def test_masks_equal_torch_nn_utils_prune(case, kind):
    model = case.build()
    params = params_of(model)
    chosen = [name for name, p in params.items() if prunable(name, p)]
    theirs = copy.deepcopy(model)
    targets = [owner(theirs, name) for name in chosen]
    if kind == "local":
        ours = fprune.l1_unstructured(params, 0.3, where=prunable)
        for module, leaf in targets:
            torch_prune.l1_unstructured(module, leaf, amount=0.3)
    else:
        ours = fprune.global_unstructured(params, 0.5, where=prunable)
        torch_prune.global_unstructured(targets, torch_prune.L1Unstructured, amount=0.5)
    for name, (module, leaf) in zip(chosen, targets, strict=True):
        assert torch.equal(getattr(module, leaf + "_mask").bool(), ours[name]), name
    with torch.no_grad():
        torch_out = run(case, theirs)
        our_out = run(case, model, params, ours)
    if case.name in TORCH_FORWARD_DIFFERS:
        assert not close(torch_out, our_out)
    else:
        assert close(torch_out, our_out)


# vmap falls back to a loop for some fused attention kernels, and says so.
@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_vmap_over_a_stack_of_seeds(case):
    models = [case.build(seed=seed) for seed in range(3)]
    stacked, _ = stack_module_state(models)
    stacked = {name: p.detach() for name, p in stacked.items()}
    masks = vmap(lambda p: fprune.global_unstructured(p, 0.5, where=prunable))(stacked)
    eager = [fprune.global_unstructured(params_of(m), 0.5, where=prunable) for m in models]
    for i in range(len(models)):
        for name in stacked:
            assert torch.equal(masks[name][i], eager[i][name]), name

    args, kwargs = case.inputs()

    def forward(params, masks):
        return case.output(fprune.masked_call(models[0], params, masks, args, kwargs))

    with torch.no_grad():
        if case.name in NO_VMAP_FORWARD:
            with pytest.raises(RuntimeError, match="Batching rule not implemented"):
                vmap(forward)(stacked, masks)
            return
        out = vmap(forward)(stacked, masks)
        for i, model in enumerate(models):
            assert close(out[i], run(case, model, params_of(model), eager[i]))
