"""Where torch.nn.utils.prune's hooks miss the weights a module actually uses, and masked_call does not.

* ``nn.MultiheadAttention`` reads ``out_proj.weight`` without calling ``out_proj`` (pytorch#69353),
  so the forward pre-hook that recomputes ``weight = weight_orig * weight_mask`` never runs: once
  ``weight_orig`` changes (an optimizer step), the output silently uses a stale weight, and a
  second ``backward`` fails. ``masked_call`` substitutes the pruned tensors by name, so the
  weights actually read are the pruned current ones; a hand-written attention confirms it.
* ``nn.LSTM`` reads its weights through ``_flat_weights`` (pytorch#33618: training after
  ``prune.remove`` used to fail). ``masked_call`` is checked against a hand-written LSTM; the
  torch 2.13 status of #33618 is pinned by a test.
* Everywhere else the hooks work, and a few SGD steps with torch's hooks and optimizer give the
  very same parameters as ``torch.func.grad`` through ``masked_call``.
"""

import math

import pytest
import torch
import torch.nn.utils.prune as torch_prune
from torch.func import grad

import fprune
from tests.helpers import close, params_of
from zoo_models import TORCH_CASES, buffers_of, owner, prunable, run

# --- nn.MultiheadAttention ------------------------------------------------------------------

MHA = next(case for case in TORCH_CASES if case.name == "multihead_attention")


def manual_attention(params, query, key, value, num_heads):
    """Multi-head attention written out by hand (batch_first), from the given weights only."""
    w_q, w_k, w_v = params["in_proj_weight"].chunk(3)
    b_q, b_k, b_v = params["in_proj_bias"].chunk(3)
    batch, length, embed = query.shape
    head = embed // num_heads

    def heads(x, w, b):
        return (x @ w.T + b).view(batch, -1, num_heads, head).transpose(1, 2)

    q, k, v = heads(query, w_q, b_q), heads(key, w_k, b_k), heads(value, w_v, b_v)
    attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head), dim=-1)
    out = (attention @ v).transpose(1, 2).reshape(batch, length, embed)
    return out @ params["out_proj.weight"].T + params["out_proj.bias"]


def test_masked_call_prunes_the_weights_multihead_attention_reads():
    model = MHA.build()
    params = params_of(model)
    masks = fprune.l1_unstructured(params, 0.5, where=prunable)
    assert {n for n in params if prunable(n, params[n])} == {"in_proj_weight", "out_proj.weight"}
    (query, key, value), _ = MHA.inputs()
    with torch.no_grad():
        out = run(MHA, model, params, masks)
        expected = manual_attention(fprune.apply_masks(params, masks), query, key, value, 2)
        dense = manual_attention(params, query, key, value, 2)
        only_out_proj = run(MHA, model, params, {"out_proj.weight": masks["out_proj.weight"]})
    assert close(out, expected)
    assert close(run(MHA, model).detach(), dense)  # the manual attention is MHA's
    assert not close(out, dense)
    assert not close(only_out_proj, dense)  # the out_proj mask alone changes the output


def _torch_pruned_mha():
    model = MHA.build()
    torch_prune.l1_unstructured(model, "in_proj_weight", amount=0.5)
    torch_prune.l1_unstructured(model.out_proj, "weight", amount=0.5)
    return model


def test_torch_hooks_leave_out_proj_stale_after_an_update():
    model = _torch_pruned_mha()
    (query, key, value), _ = MHA.inputs()
    stale_out_proj = model.out_proj.weight.detach().clone()
    with torch.no_grad():  # what an optimizer step does to the parameters, weight_orig included
        for p in model.parameters():
            p.add_(0.1 * torch.sign(p))
        current = {
            "in_proj_weight": model.in_proj_weight_orig * model.in_proj_weight_mask,
            "in_proj_bias": model.in_proj_bias,
            "out_proj.weight": model.out_proj.weight_orig * model.out_proj.weight_mask,
            "out_proj.bias": model.out_proj.bias,
        }
        torch_out = model(query, key, value)[0]
        expected = manual_attention(current, query, key, value, 2)
        with_stale = manual_attention({**current, "out_proj.weight": stale_out_proj}, query, key, value, 2)
    # MHA's own pre-hook recomputed in_proj_weight; out_proj's never ran: torch used the old weight.
    assert torch.equal(model.in_proj_weight, current["in_proj_weight"])
    assert not close(torch_out, expected)
    assert close(torch_out, with_stale)

    # masked_call on the same parameters and masks reads the current, pruned weights.
    params = {
        "in_proj_weight": model.in_proj_weight_orig.detach(),
        "in_proj_bias": model.in_proj_bias.detach(),
        "out_proj.weight": model.out_proj.weight_orig.detach(),
        "out_proj.bias": model.out_proj.bias.detach(),
    }
    masks = {"in_proj_weight": model.in_proj_weight_mask, "out_proj.weight": model.out_proj.weight_mask}
    with torch.no_grad():
        assert close(fprune.masked_call(MHA.build(), params, masks, (query, key, value))[0], expected)


def test_torch_hooks_fail_the_second_training_step_where_masked_call_trains():
    (query, key, value), _ = MHA.inputs()
    model = _torch_pruned_mha()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model(query, key, value)[0].pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        model(query, key, value)[0].pow(2).mean().backward()

    functional = MHA.build()
    params = params_of(functional)
    masks = fprune.l1_unstructured(params, 0.5, where=prunable)

    def loss(params):
        return fprune.masked_call(functional, params, masks, (query, key, value))[0].pow(2).mean()

    for _ in range(3):
        grads = grad(loss)(params)
        params = {name: p - 0.05 * grads[name] for name, p in params.items()}
    for name, mask in masks.items():
        assert torch.equal(params[name][~mask], params_of(functional)[name][~mask])
    expected = manual_attention(fprune.apply_masks(params, masks), query, key, value, 2)
    with torch.no_grad():
        assert close(fprune.masked_call(functional, params, masks, (query, key, value))[0], expected)


# --- nn.LSTM ---------------------------------------------------------------------------------


def manual_lstm(params, x, hidden):
    """One LSTM layer written out by hand (batch_first, zero initial state), from the given weights."""
    h = c = torch.zeros(x.shape[0], hidden)
    outputs = []
    for t in range(x.shape[1]):
        gates = (
            x[:, t] @ params["weight_ih_l0"].T
            + params["bias_ih_l0"]
            + h @ params["weight_hh_l0"].T
            + params["bias_hh_l0"]
        )
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, 1)


def _lstm():
    torch.manual_seed(0)
    return torch.nn.LSTM(6, 10, batch_first=True)


def test_masked_call_prunes_the_lstm_flat_weights():
    model = _lstm()
    params = params_of(model)
    masks = fprune.global_unstructured(params, 0.6, where=prunable)
    x = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = fprune.masked_call(model, params, masks, (x,))[0]
        expected = manual_lstm(fprune.apply_masks(params, masks), x, 10)
        assert close(model(x)[0], manual_lstm(params, x, 10))  # the manual LSTM is nn.LSTM's
    assert close(out, expected)
    assert not close(out, manual_lstm(params, x, 10))
    # The module's own flat weights are untouched.
    assert all(a is b for a, b in zip(model._flat_weights, model.parameters(), strict=True))


def test_lstm_trains_after_prune_remove_in_this_torch():
    # pytorch#33618: after prune.remove, LSTM's _flat_weights kept the hook's non-leaf tensor,
    # so training failed with "backward through the graph a second time". Pinned here as it
    # behaves in the torch version CI installs: fixed (remove re-registers the parameter
    # through RNNBase, which refreshes _flat_weights). masked_call never relies on it.
    model = _lstm()
    torch_prune.l1_unstructured(model, "weight_ih_l0", amount=0.5)
    mask = model.weight_ih_l0_mask.bool()
    torch_prune.remove(model, "weight_ih_l0")
    assert model._flat_weights[0] is model.weight_ih_l0
    assert not model.weight_ih_l0[~mask].any()
    x = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(2):
        optimizer.zero_grad()
        model(x)[0].pow(2).mean().backward()
        optimizer.step()
    # After remove the mask is gone: training moves the zeros (torch's documented semantics).
    assert model.weight_ih_l0[~mask].any()


# --- everywhere else, torch's hooks and masked_call train identically --------------------------


def hooks_fire(name, tensor):
    """Prunable, minus the weights torch's hooks miss (``out_proj``, read by its MHA directly)."""
    return prunable(name, tensor) and "out_proj" not in name


@pytest.mark.parametrize("case", TORCH_CASES, ids=lambda case: case.name)
def test_sgd_steps_equal_torch_nn_utils_prune(case):
    lr, steps = 0.05, 3
    torch_model = case.build().train()
    names = [name for name, p in torch_model.named_parameters() if hooks_fire(name, p)]
    torch_prune.global_unstructured(
        [owner(torch_model, name) for name in names], torch_prune.L1Unstructured, amount=0.5
    )
    optimizer = torch.optim.SGD(torch_model.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        run(case, torch_model).pow(2).mean().backward()
        optimizer.step()

    model = case.build().train()
    params = params_of(model)
    buffers = buffers_of(model)
    masks = fprune.global_unstructured(params, 0.5, where=hooks_fire)

    def loss(params, buffers):  # buffers as an argument: BatchNorm updates them in place
        return run(case, model, params, masks, buffers).pow(2).mean()

    for _ in range(steps):
        grads = grad(loss)(params, buffers)
        params = {name: p - lr * grads[name] for name, p in params.items()}

    theirs = {name.replace("_orig", ""): p for name, p in torch_model.named_parameters()}
    for name, p in params.items():
        assert torch.allclose(p, theirs[name], rtol=1e-4, atol=1e-6), name
    for name, b in torch_model.named_buffers():
        if not name.endswith("_mask"):
            assert torch.allclose(b, buffers[name].to(b.dtype), rtol=1e-4, atol=1e-6), name
    with torch.no_grad():
        assert close(run(case, torch_model.eval()), run(case, model.eval(), params, masks, buffers))


WITH_ATTENTION = [case for case in TORCH_CASES if case.name in ("multihead_attention", "transformer_encoder")]


@pytest.mark.parametrize("case", WITH_ATTENTION, ids=lambda case: case.name)
def test_pruning_out_proj_with_torch_hooks_breaks_training(case):
    # nn.TransformerEncoder inherits the bug from its nn.MultiheadAttention layers.
    model = case.build().train()
    names = [name for name, p in model.named_parameters() if prunable(name, p)]
    assert any("out_proj" in name for name in names)
    torch_prune.global_unstructured(
        [owner(model, name) for name in names], torch_prune.L1Unstructured, amount=0.5
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    run(case, model).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        run(case, model).pow(2).mean().backward()
