"""fprune.compat (``import fprune.compat as prune``) on the zoo, against torch.nn.utils.prune.

A drop-in must give, on real models, the same ``_orig``/``_mask`` state, the same forward and the
same training as torch; its bridges must carry the hook state to ``masked_call`` and back. Where
compat differs from torch on purpose (``copy.deepcopy`` of a freshly pruned model works,
pytorch#37322) the difference is shown; where it keeps torch's hook semantics, torch's hook
failures come with it (MHA ``out_proj``, GPT-2's tie), and the test shows the functional route.
"""

import copy

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch.func import grad

import fprune
import fprune.compat as compat_prune
from tests.helpers import close, params_of
from zoo_models import HF_CASES, TORCH_CASES, buffers_of, owner, prunable, run, transformers

CASES = TORCH_CASES + [
    pytest.param(case, marks=pytest.mark.skipif(transformers is None, reason="needs transformers"))
    for case in HF_CASES
]
# The hook state does not describe the network masked_call runs: torch (and compat) untie GPT-2's
# LM head from the pruned embedding (see test_zoo_transformers).
HOOKS_UNTIE = {"gpt2"}


def by_name(case):
    return case.name


def _prune(lib, model, kind, where=prunable):
    names = [name for name, p in model.named_parameters() if where(name, p)]
    if kind == "global":
        lib.global_unstructured([owner(model, n) for n in names], lib.L1Unstructured, amount=0.5)
    else:
        for name in names:
            lib.l1_unstructured(*owner(model, name), amount=0.3)
    return model


@pytest.mark.parametrize("kind", ["local", "global"])
@pytest.mark.parametrize("case", CASES, ids=by_name)
def test_same_state_and_forward_as_torch(case, kind):
    theirs = _prune(torch_prune, case.build(), kind)
    ours = _prune(compat_prune, case.build(), kind)
    expected, got = theirs.state_dict(), ours.state_dict()
    assert list(got) == list(expected)
    for key in expected:
        assert got[key].dtype == expected[key].dtype, key
        assert torch.equal(got[key], expected[key]), key
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    with torch.no_grad():
        assert torch.equal(run(case, ours), run(case, theirs))


@pytest.mark.parametrize("case", CASES, ids=by_name)
def test_bridge_to_masked_call(case):
    model = _prune(compat_prune, case.build(), "global")
    params, masks = compat_prune.hooks_to_functional(model)
    plain = case.build()
    assert set(params) == set(params_of(plain))
    reference = fprune.global_unstructured(params_of(plain), 0.5, where=prunable)
    assert set(masks) == {name for name, p in params.items() if prunable(name, p)}
    for name, mask in masks.items():
        assert torch.equal(mask, reference[name]), name
    with torch.no_grad():
        functional = run(case, plain, {n: p.detach() for n, p in params.items()}, masks)
        hooked = run(case, model)
    if case.name in HOOKS_UNTIE:
        assert not close(functional, hooked, atol=1e-5)
    else:
        assert close(functional, hooked, atol=1e-5)
    # strip_pruning: the same model, now plain, run by masked_call with the masks it returns.
    stripped = compat_prune.strip_pruning(model)
    assert not compat_prune.is_pruned(model)
    assert stripped.keys() == masks.keys()
    with torch.no_grad():
        assert close(run(case, model, params_of(model), stripped), functional, atol=1e-5)


UNTIED_CASES = [case for case in CASES if getattr(case, "values", [case])[0].name not in HOOKS_UNTIE]


@pytest.mark.parametrize("case", UNTIED_CASES, ids=by_name)
def test_pruned_checkpoint_loads_into_a_plain_model(case):
    pruned = _prune(compat_prune, case.build(), "global")
    state = pruned.state_dict()
    _params, masks = compat_prune.hooks_to_functional(pruned)
    fresh = case.build(seed=1)
    compat_prune.load_pruned_state_dict(fresh, state)
    assert not compat_prune.is_pruned(fresh)
    loaded = params_of(fresh)
    for name, mask in masks.items():
        assert not loaded[name][~mask].any(), name
    with torch.no_grad():
        expected = run(case, pruned)
        assert close(run(case, fresh), expected, atol=1e-5)
    # ...or with the masks installed as hooks, ready to train further.
    hooked = case.build(seed=2)
    compat_prune.load_pruned_state_dict(hooked, state, install_hooks=True)
    assert compat_prune.is_pruned(hooked)
    assert torch.equal(
        hooked.state_dict()[next(k for k in state if k.endswith("_mask"))],
        state[next(k for k in state if k.endswith("_mask"))],
    )
    with torch.no_grad():
        assert close(run(case, hooked), expected, atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=by_name)
def test_deepcopy_of_a_freshly_pruned_model(case):
    # torch: the pruned attribute is a non-leaf tensor until a no_grad forward recomputes it.
    with pytest.raises(RuntimeError, match="deepcopy"):
        copy.deepcopy(_prune(torch_prune, case.build(), "global"))
    ours = _prune(compat_prune, case.build(), "global")
    copied = copy.deepcopy(ours)
    with torch.no_grad():
        assert torch.equal(run(case, copied), run(case, ours))
    assert compat_prune.is_pruned(copied)


def test_tied_checkpoint_loses_the_embedding_pruning():
    # The hooks left GPT-2's LM head on the dense Parameter, and the checkpoint says so: it holds
    # wte.weight_orig, wte.weight_mask and a dense lm_head.weight. A plain GPT-2 has one tensor
    # for both names, so loading bakes the mask into wte and then writes the dense lm_head.weight
    # over it. Keep tied models functional (one mask, see test_zoo_transformers) or untie first.
    pytest.importorskip("transformers")
    gpt2 = next(case for case in HF_CASES if case.name == "gpt2")
    pruned = _prune(compat_prune, gpt2.build(), "global")
    state = pruned.state_dict()
    assert {"transformer.wte.weight_orig", "transformer.wte.weight_mask", "lm_head.weight"} <= set(state)
    fresh = gpt2.build(seed=1)
    compat_prune.load_pruned_state_dict(fresh, state)
    assert torch.equal(fresh.transformer.wte.weight, state["transformer.wte.weight_orig"])
    assert fresh.lm_head.weight is fresh.transformer.wte.weight


def hooks_fire(name, tensor):
    """Prunable, minus MHA's ``out_proj`` weights, which neither torch's nor compat's hooks update."""
    return prunable(name, tensor) and "out_proj" not in name


@pytest.mark.parametrize("case", TORCH_CASES, ids=by_name)
def test_training_equals_torch_and_the_functional_route(case):
    lr, steps = 0.05, 3
    models = {}
    for lib in (torch_prune, compat_prune):
        model = _prune(lib, case.build().train(), "global", where=hooks_fire)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for _ in range(steps):
            optimizer.zero_grad()
            run(case, model).pow(2).mean().backward()
            optimizer.step()
        models[lib] = model
    theirs, ours = models[torch_prune], models[compat_prune]
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), name

    # The functional route from the same starting point lands on the same parameters.
    start = _prune(compat_prune, case.build().train(), "global", where=hooks_fire)
    params, masks = compat_prune.hooks_to_functional(start)
    params = {name: p.detach() for name, p in params.items()}
    plain, buffers = case.build().train(), buffers_of(start)
    # The hooks' "*_mask" buffers name nothing in the plain model: masked_call rejects them.
    buffers = {name: b for name, b in buffers.items() if name in dict(plain.named_buffers())}

    def loss(params, buffers):
        return run(case, plain, params, masks, buffers).pow(2).mean()

    for _ in range(steps):
        grads = grad(loss)(params, buffers)
        params = {name: p - lr * grads[name] for name, p in params.items()}
    trained, _ = compat_prune.hooks_to_functional(ours)
    for name, p in params.items():
        assert torch.allclose(p, trained[name], rtol=1e-4, atol=1e-6), name


MHA = next(case for case in TORCH_CASES if case.name == "multihead_attention")


def test_compat_keeps_torch_hook_semantics_for_out_proj():
    # A drop-in: the MHA out_proj failure (pytorch#69353) comes along. The functional route
    # (hooks_to_functional + masked_call) trains the same pruned model.
    model = _prune(compat_prune, MHA.build().train(), "global")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run(MHA, model).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        run(MHA, model).pow(2).mean().backward()

    start = _prune(compat_prune, MHA.build(), "global")
    params, masks = compat_prune.hooks_to_functional(start)
    params = {name: p.detach() for name, p in params.items()}
    assert set(masks) == {"in_proj_weight", "out_proj.weight"}
    plain = MHA.build()

    def loss(params):
        return run(MHA, plain, params, masks).pow(2).mean()

    losses = []
    for _ in range(3):
        grads, value = torch.func.grad_and_value(loss)(params)
        losses.append(float(value))
        params = {name: p - 0.05 * grads[name] for name, p in params.items()}
    assert losses[0] > losses[1] > losses[2]
    for name, mask in masks.items():
        assert torch.equal(grads[name][~mask], torch.zeros_like(grads[name][~mask]))
    # Back to hooks: the trained functional state installs on a fresh model.
    fresh = MHA.build()
    with torch.no_grad():
        for name, p in fresh.named_parameters():
            p.copy_(params[name])
    compat_prune.functional_to_hooks(fresh, masks)
    with torch.no_grad():
        assert close(run(MHA, fresh), run(MHA, plain, params, masks), atol=1e-5)


@pytest.mark.parametrize("case", CASES, ids=by_name)
def test_remove_equals_torch(case):
    theirs = _prune(torch_prune, case.build(), "global")
    ours = _prune(compat_prune, case.build(), "global")
    for lib, model in ((torch_prune, theirs), (compat_prune, ours)):
        for name, _p in list(model.named_parameters()):
            if name.endswith("_orig"):
                lib.remove(*owner(model, name[: -len("_orig")]))
    assert not compat_prune.is_pruned(ours)
    expected, got = theirs.state_dict(), ours.state_dict()
    assert list(got) == list(expected)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
