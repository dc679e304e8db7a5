"""fprune.oneshot.prune's methods as objects, profiles as callables, inplace=True and masks=,
on GPT-2, a Llama with grouped-query attention and BERT from tiny configs."""

from __future__ import annotations

import pytest
import torch

import fprune
from fprune.oneshot import LayerMethod, Magnitude, Refine, SparseGPT, Wanda
from test_posttrain_oneshot import BUILDERS, calibration, llama, reference, same_state, state

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
@pytest.mark.parametrize("method", ["sparsegpt", "wanda", "magnitude"])
def test_objects_equal_their_shorthands_and_inplace_equals_a_copy(name, method):
    torch.manual_seed(0)
    model, _ = BUILDERS[name]()
    params = dict(model.named_parameters())
    batches = calibration(with_padding=name != "gpt2")
    objects = {"sparsegpt": SparseGPT(), "wanda": Wanda(), "magnitude": Magnitude()}
    want, want_masks = fprune.oneshot.prune(model, params, batches, 0.5, method=method)
    got, masks = fprune.oneshot.prune(model, params, batches, 0.5, method=objects[method])
    assert masks.keys() == want_masks.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    # inplace=True: the same weights, written into the module's own tensors, block by block
    copies = {k: v.detach().clone() for k, v in params.items()}
    into, in_masks = fprune.oneshot.prune(model, params, batches, 0.5, method=objects[method], inplace=True)
    assert into.keys() == want.keys() and in_masks.keys() == want_masks.keys()
    for k, p in params.items():
        assert into[k] is p  # the caller's own tensors
        torch.testing.assert_close(p.detach(), want[k], rtol=0, atol=0, msg=k)
        if k not in want_masks:
            assert torch.equal(p.detach(), copies[k])
    for k in want_masks:
        assert torch.equal(in_masks[k], want_masks[k])


def test_inplace_into_a_params_dict_the_caller_owns():
    model, container = llama()
    own = {k: v.detach().clone() for k, v in model.state_dict().items()}
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    before = {k: v.clone() for k, v in params.items()}
    batches = calibration()
    new, masks = fprune.oneshot.prune(model, params, batches, None, n_m=(2, 4), inplace=True)
    assert all(torch.equal(v, own[k]) for k, v in model.state_dict().items())  # the module untouched
    want, want_masks = reference(model, container, batches, "sparsegpt", n_m=(2, 4))
    for k, v in params.items():
        assert new[k] is v
        torch.testing.assert_close(v, want[k].detach(), rtol=2e-4, atol=2e-5, msg=k)
        assert (k in want_masks) != torch.equal(v, before[k])
    assert masks.keys() == want_masks.keys()


def test_masks_all_and_none():
    model, _ = BUILDERS["gpt2"]()
    params = dict(model.named_parameters())
    batches = calibration()
    _, pruned = fprune.oneshot.prune(model, params, batches, 0.5, method="magnitude")
    new, every = fprune.oneshot.prune(model, params, batches, 0.5, method="magnitude", masks="all")
    assert every.keys() == new.keys()
    for k, m in every.items():
        assert torch.equal(m, pruned[k]) if k in pruned else (m.dtype == torch.bool and m.all())
    assert fprune.oneshot.prune(model, params, batches, 0.5, method="magnitude", masks=None)[1] == {}


def test_sparsity_with_n_m_as_llm_compressor_writes_it():
    model, _ = BUILDERS["gpt2"]()
    params = dict(model.named_parameters())
    batches = calibration()
    _, want = fprune.oneshot.prune(model, params, batches, None, n_m=(2, 4))
    _, got = fprune.oneshot.prune(model, params, batches, 0.5, n_m=(2, 4))
    assert all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(
        ValueError, match=r"sparsity=None or 0\.5 \(= 1 - 2/4\) with n_m=\(2, 4\).*sparsity=0\.6"
    ):
        fprune.oneshot.prune(model, params, batches, 0.6, n_m=(2, 4))


class Halve(LayerMethod):
    """A method written outside fprune: the layers' hessian diagonal picks what is pruned."""

    statistic = fprune.calibration.Hessian()

    def __init__(self):
        self.seen = []

    def prune_layer(self, weight, statistic, amount=None, *, n_m=None):
        self.seen.append((weight.dtype, tuple(weight.shape), tuple(statistic.shape)))
        scores = {"w": weight.abs() * statistic.diagonal()}
        keep = fprune.l1_unstructured({"w": weight}, amount, importance_scores=scores)["w"]
        return weight * keep, keep


def test_a_layer_method_written_outside_fprune_and_refined():
    model, _ = BUILDERS["gpt2"]()
    params = dict(model.named_parameters())
    batches = calibration()
    method = Halve()
    new, masks = fprune.oneshot.prune(model, params, batches, 0.25, method=method)
    # Conv1D weights arrive as (out, in) float32, with their (in, in) hessian
    assert method.seen[0] == (torch.float32, (48, 16), (16, 16)) and len(method.seen) == 12
    assert all(float((~m).float().mean()) == 0.25 for m in masks.values())
    refined, refined_masks = fprune.oneshot.prune(
        model, params, batches, 0.25, method=Refine(method, iters=5)
    )
    first = [k for k in masks if k.startswith("transformer.h.0.")]  # later inputs differ
    assert len(first) == 4 and all(torch.equal(refined_masks[k], masks[k]) for k in first)
    assert all(not torch.equal(refined[k], new[k]) for k in first)


def test_a_profile_is_any_callable():
    model, _ = llama()
    params = dict(model.named_parameters())
    batches = calibration()
    calls = []

    def deeper_is_sparser(weights, sparsity, *, blocks, norms):
        calls.append((sorted(weights) == sorted(blocks), norms))
        return {name: sparsity + 0.1 * (blocks[name] - 0.5) for name in weights}

    _, masks = fprune.oneshot.prune(
        model, params, batches, 0.5, method="magnitude", profile=deeper_is_sparser
    )
    assert calls == [(True, None)]  # no needs_norms: no dense pass
    got = {round(float((~m).float().mean()), 2) for k, m in masks.items() if ".0." in k}
    assert got == {0.45} and {
        round(float((~m).float().mean()), 2) for k, m in masks.items() if ".1." in k
    } == {0.55}
    with pytest.raises(ValueError, match=r"the profile's amount for 'model\.layers\.0.*1\.5"):
        fprune.oneshot.prune(model, params, batches, 0.5, profile=lambda w, s, **_: dict.fromkeys(w, 1.5))


def test_bfloat16_llama_is_written_back_in_its_dtype():
    model, _ = llama()
    model = model.to(torch.bfloat16)
    params = dict(model.named_parameters())
    before = state(model)
    new, masks = fprune.oneshot.prune(model, params, calibration(), 0.5)
    assert same_state(model, before)
    for k, m in masks.items():
        assert (
            new[k].dtype == torch.bfloat16 and (new[k][~m] == 0).all() and float((~m).float().mean()) == 0.5
        )
    fprune.oneshot.prune(model, params, calibration(), 0.5, inplace=True)
    assert all(torch.equal(params[k], new[k]) for k in masks)


def test_method_objects_check_their_arguments():
    with pytest.raises(ValueError, match="blocksize"):
        SparseGPT(blocksize=0)
    with pytest.raises(ValueError, match="damp"):
        SparseGPT(damp=-0.1)
    with pytest.raises(ValueError, match="iters"):
        Refine(Wanda(), iters=-1)
    with pytest.raises(ValueError, match="Refine's method"):
        Refine("obs")
    with pytest.raises(NotImplementedError):
        LayerMethod().prune_layer(torch.ones(2, 2), None, 0.5)
