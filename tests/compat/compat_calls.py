"""Random pruning calls, run through either library (for the differential and interop tests)."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from tests.compat.compat_helpers import LIBRARIES, TARGETS, custom_methods

INVALID_AMOUNTS = [-1, 1.5, float("nan"), "0.3", None, torch.tensor(0.5)]
valid_amounts = st.one_of(st.floats(0, 1), st.integers(0, 6), st.sampled_from([0, 0.0, 1.0, 0.5, 1]))
# Mostly valid calls (a failing call ends a sequence), some invalid ones.
amounts = st.one_of(*[valid_amounts] * 6, st.sampled_from(INVALID_AMOUNTS))
targets = st.sampled_from(TARGETS)
weights = st.sampled_from([t for t in TARGETS if t[1] == "weight"] * 4 + TARGETS)  # mostly >= 2-d
dims = st.one_of(st.integers(-2, 1), st.integers(-2, 1), st.integers(-3, 4))
score_specs = st.sampled_from([None, None, None, "ok", "ok", "ok", "bad"])
seeds = st.integers(0, 2**16)
NORMS = [1, 2, math.inf, 3, 0.5, "fro", None, "bad"]
TIED_NORMS = [-math.inf]  # the min-norm of a masked weight ties at 0: only with fresh scores


@st.composite
def operations(draw):
    kind = draw(
        st.sampled_from(
            [
                "identity",
                "random_unstructured",
                "l1_unstructured",
                "random_structured",
                "ln_structured",
                "custom_from_mask",
                "global",
                "custom",
                "remove",
                "step",
                "forward",
            ]
        )
    )
    seed = draw(seeds)
    if kind in ("identity", "remove"):
        return (kind, seed, draw(targets))
    if kind == "random_unstructured":
        return (kind, seed, draw(targets), draw(amounts))
    if kind == "l1_unstructured":
        return (kind, seed, draw(targets), draw(amounts), draw(score_specs))
    if kind == "random_structured":
        return (kind, seed, draw(weights), draw(amounts), draw(dims))
    if kind == "ln_structured":
        scores = draw(score_specs)
        n = draw(st.sampled_from(NORMS + (TIED_NORMS if scores == "ok" else [])))
        return (kind, seed, draw(weights), draw(amounts), n, draw(dims), scores)
    if kind == "custom_from_mask":
        return (kind, seed, draw(targets), draw(st.sampled_from(["bool", "bool", "float", "float", "bad"])))
    if kind == "global":
        chosen = draw(st.lists(st.sampled_from(TARGETS), min_size=1, max_size=4, unique=True))
        method = draw(
            st.sampled_from(
                ["L1Unstructured"] * 3
                + ["RandomUnstructured"] * 3
                + ["EveryOther", "Identity", "LnStructured"]
            )
        )
        return (kind, seed, tuple(chosen), method, draw(amounts), draw(st.booleans()))
    if kind == "custom":
        return (
            kind,
            seed,
            draw(targets),
            draw(st.sampled_from(["EveryOther", "FirstChannel"])),
            draw(st.integers(-2, 3)),
        )
    return (kind, seed)


def tensor_of(net, target):
    module, name = getattr(net, target[0]), target[1]
    return module, name, getattr(module, name)


def run(library: str, net, op) -> None:
    """Apply ``op`` to ``net`` with ``library`` (torch's prune module or fprune.compat)."""
    prune = LIBRARIES[library]
    kind, seed = op[0], op[1]
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the global generator, drawn from by the random methods
    if kind == "step":
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
        return
    if kind == "forward":
        net(torch.randn(1, 3, 5, 5, generator=g), torch.randn(1, 7, generator=g))
        return
    if kind == "global":
        _, _, chosen, method_name, amount, with_scores = op
        pairs = [(getattr(net, m), n) for m, n in chosen]
        scores = {}
        if with_scores:
            for module, name in pairs[::2]:
                scores[(module, name)] = torch.randn(getattr(module, name).shape, generator=g)
        custom = custom_methods(library)
        method = custom[method_name] if method_name in custom else getattr(prune, method_name)
        kwargs = {"amount": amount} if method_name.endswith("Unstructured") else {}
        if method_name == "LnStructured":
            kwargs = {"amount": amount, "n": 2, "dim": 0}
        prune.global_unstructured(pairs, pruning_method=method, importance_scores=scores or None, **kwargs)
        return
    module, name, tensor = tensor_of(net, op[2])

    def scores_for(spec):
        if spec is None:
            return None
        shape = tensor.shape if spec == "ok" else (3,)
        return torch.randn(shape, generator=g)

    if kind == "identity":
        prune.identity(module, name)
    elif kind == "remove":
        prune.remove(module, name)
        # The zeros remove leaves would tie in later rankings (where the libraries may pick
        # different entries); the same small perturbation in both keeps every score distinct.
        with torch.no_grad():
            getattr(module, name).add_(torch.rand(tensor.shape, generator=g) * 1e-3)
    elif kind == "random_unstructured":
        prune.random_unstructured(module, name, amount=op[3])
    elif kind == "l1_unstructured":
        prune.l1_unstructured(module, name, amount=op[3], importance_scores=scores_for(op[4]))
    elif kind == "random_structured":
        prune.random_structured(module, name, amount=op[3], dim=op[4])
    elif kind == "ln_structured":
        prune.ln_structured(
            module, name, amount=op[3], n=op[4], dim=op[5], importance_scores=scores_for(op[6])
        )
    elif kind == "custom_from_mask":
        shape = tensor.shape if op[3] != "bad" else (2,)
        mask = torch.rand(shape, generator=g) > 0.4
        prune.custom_from_mask(module, name, mask=mask if op[3] == "bool" else mask.float())
    elif kind == "custom":
        method = custom_methods(library)[op[3]]
        if op[3] == "FirstChannel":
            method.apply(module, name, dim=op[4])
        else:
            method.apply(module, name)
    else:  # pragma: no cover - the strategy draws only the kinds above
        raise AssertionError(kind)


def structured_on_pruned_1d(net, op) -> bool:
    """torch's known bug, not reproduced: structured pruning of a 1-d tensor inside a container.

    The first call raises ValueError (no channels in a 1-d tensor); once the tensor is pruned,
    torch's container reads the whole tensor as one channel (``mask.sum(dim=[])``) and prunes
    all or nothing. fprune.compat raises the ValueError every time.
    """
    if op[0] not in ("random_structured", "ln_structured"):
        return False
    module, name, tensor = tensor_of(net, op[2])
    return tensor.dim() == 1 and hasattr(module, name + "_orig")


def outcome(library, net, op):
    try:
        run(library, net, op)
    except Exception as error:
        return error
    return None
