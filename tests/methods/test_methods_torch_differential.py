"""fprune's masks equal torch.nn.utils.prune's for the same tensors (continuous values: no ties)."""

import copy
import math

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.utils import prune as torch_prune

import fprune

METHODS = ["l1", "ln"]


def _conv():
    return torch.nn.Conv2d(3, 6, 3)


@st.composite
def steps(draw):
    """A sequence of (method, amount, extra) pruning calls on one conv weight."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        method = draw(st.sampled_from(METHODS))
        amount = draw(st.one_of(st.floats(0, 1), st.integers(0, 2)))
        extra = (
            (draw(st.sampled_from([1, 2, math.inf, -math.inf])), draw(st.integers(0, 3)))
            if method == "ln"
            else None
        )
        out.append((method, amount, extra))
    return out


def _has_ties(values: torch.Tensor) -> bool:
    return values.unique().numel() < values.numel()


def _channel_norms(values, n, dim):
    others = [d for d in range(values.dim()) if d != dim % values.dim()]
    return torch.norm(values, p=n, dim=others), others


@given(steps(), st.integers(0, 10_000), st.booleans())
def test_iterative_local_pruning_matches_torch(calls, seed, with_scores):
    torch.manual_seed(seed)
    module = _conv()
    weight = module.weight.detach().clone()
    scores = torch.randn(weight.shape) if with_scores else None
    masks = None
    for method, amount, extra in calls:
        kwargs = {} if scores is None else {"importance_scores": scores}
        fkwargs = {} if scores is None else {"importance_scores": {"weight": scores}}
        exact, others = True, None
        if method == "l1":

            def by_torch(*, amount=amount, kwargs=kwargs):
                torch_prune.l1_unstructured(module, "weight", amount, **kwargs)

            def by_fprune(*, amount=amount, fkwargs=fkwargs, masks=masks):
                return fprune.l1_unstructured({"weight": weight}, amount, masks=masks, **fkwargs)
        else:
            n, dim = extra
            # Channel norms of the pruned weight tie (at 0, say, for n=-inf) once entries are
            # pruned; torch then picks arbitrarily and only the counts must agree.
            values = scores if scores is not None else module.weight.detach()
            norms, others = _channel_norms(values, n, dim)
            alive = (
                module.weight_mask.any(dim=others)
                if hasattr(module, "weight_mask")
                else torch.ones_like(norms, dtype=torch.bool)
            )
            exact = not _has_ties(norms[alive])

            def by_torch(*, amount=amount, dim=dim, kwargs=kwargs, n=n):
                torch_prune.ln_structured(module, "weight", amount, n=n, dim=dim, **kwargs)

            def by_fprune(*, amount=amount, dim=dim, fkwargs=fkwargs, masks=masks, n=n):
                return fprune.ln_structured({"weight": weight}, amount, n, dim, masks=masks, **fkwargs)

        try:
            by_torch()
        except Exception as error:  # fprune must refuse the same call, with the same exception type
            try:
                by_fprune()
            except type(error):
                break  # torch's rollback after a failed iterative call can leave the module broken

            raise AssertionError(f"fprune accepted a call torch refused with {error!r}") from error
        before = masks
        masks = by_fprune()
        torch_mask = module.weight_mask.bool()
        if exact:
            assert torch.equal(masks["weight"], torch_mask)
        else:  # ties among channel norms: the same number of channels must survive
            assert int(masks["weight"].any(dim=others).sum()) == int(torch_mask.any(dim=others).sum())
            assert before is None or not (masks["weight"] & ~before["weight"]).any()
            masks = {"weight": torch_mask}  # continue from torch's choice among the ties


@given(st.integers(0, 10_000), st.floats(0, 1))
def test_applied_weights_and_outputs_match_torch(seed, amount):
    torch.manual_seed(seed)
    module = torch.nn.Linear(7, 5)
    params = {k: v.detach().clone() for k, v in module.named_parameters()}
    x = torch.randn(3, 7)
    masks = fprune.l1_unstructured(params, amount)
    dense = copy.deepcopy(module)  # masked_call runs an unpruned module (a hooked one refuses params)
    torch_prune.l1_unstructured(module, "weight", amount)
    torch_prune.l1_unstructured(module, "bias", amount)
    pruned = fprune.apply_masks(params, masks)
    assert torch.equal(pruned["weight"], module.weight) and torch.equal(pruned["bias"], module.bias)
    assert torch.equal(fprune.masked_call(dense, params, masks, (x,)), module(x))


def test_random_methods_prune_the_same_counts_as_torch():
    torch.manual_seed(0)
    module = torch.nn.Linear(10, 9)
    weight = module.weight.detach().clone()
    torch_prune.random_unstructured(module, "weight", 0.37)
    torch_prune.random_structured(module, "weight", 0.4, dim=0)
    masks = fprune.random_unstructured({"weight": weight}, 0.37, generator=0)
    masks = fprune.random_structured({"weight": weight}, 0.4, 0, generator=1, masks=masks)
    assert int((~masks["weight"]).sum()) == int((module.weight_mask == 0).sum())
    assert int((~masks["weight"].any(dim=1)).sum()) == int((module.weight_mask.sum(dim=1) == 0).sum())
