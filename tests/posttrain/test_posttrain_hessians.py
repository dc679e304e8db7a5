"""fprune.calibration.hessians against hessians from plain hooks; the module left as it was."""

from __future__ import annotations

import pytest
import torch

import fprune
from fprune.calibration import hessians
from posttrain_helpers import hessian_of


class Twice(torch.nn.Module):
    """One Linear called twice per forward, taking kwargs."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.out = torch.nn.Linear(3, 2)
        self.register_buffer("offset", torch.tensor([0.5, -0.5, 0.0]))

    def forward(self, x, scale=1.0):
        return self.out(self.fc(torch.tanh(self.fc(x * scale))) + self.offset)


def snapshot(model):
    return (
        {k: v.clone() for k, v in model.named_parameters()},
        {k: v.clone() for k, v in model.named_buffers()},
        [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()],
        model.training,
    )


def unchanged(model, before):
    params, buffers, hooks, training = snapshot(model)
    return (
        all(torch.equal(v, before[0][k]) for k, v in params.items())
        and all(torch.equal(v, before[1][k]) for k, v in buffers.items())
        and hooks == before[2]
        and training == before[3]
    )


def test_mlp_matches_hessians_from_plain_hooks():
    torch.manual_seed(0)
    model = Twice()
    params = {k: v.detach() for k, v in model.named_parameters()}
    xs = [torch.randn(4, 3), torch.randn(2, 5, 3), torch.randn(3, 3)]
    rows = {"fc": [], "out": []}
    handles = [
        getattr(model, n).register_forward_pre_hook(lambda m, a, n=n: rows[n].append(a[0].reshape(-1, 3)))
        for n in rows
    ]
    with torch.no_grad():
        model(xs[0], scale=0.5)
        model(xs[1], scale=0.5)
        model(xs[2], scale=3.0)
    for h in handles:
        h.remove()
    before = snapshot(model)
    # kwargs reach every call; a dict batch's own keys win
    batches = iter([xs[0], (xs[1],), {"x": xs[2], "scale": 3.0}])
    got = hessians(model, params, batches, kwargs={"scale": 0.5})
    assert unchanged(model, before)
    assert got.keys() == {"fc.weight", "out.weight"}
    for name in rows:
        want = hessian_of(torch.cat(rows[name]))
        torch.testing.assert_close(got[f"{name}.weight"].double(), want, rtol=1e-5, atol=1e-6)
    assert got["fc.weight"].dtype == torch.float32
    # the diagonal is 2/n times the squared input norms
    norms = fprune.calibration.input_norms(model, params, [xs[0]])
    h = hessians(model, params, [xs[0]])
    n = 4 * 2  # 4 rows, fc called twice
    torch.testing.assert_close(h["fc.weight"].diagonal() * n / 2, norms["fc.weight"].flatten() ** 2)


def test_gpt2_conv1d_and_module_unchanged():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=8, vocab_size=50, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    params = dict(model.named_parameters())
    ids = [torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (3, 4))]
    before = snapshot(model)
    got = hessians(model, params, [{"input_ids": i} for i in ids], where=lambda n, p: ".h.0." in n)
    assert unchanged(model, before)
    assert got["transformer.h.0.mlp.c_proj.weight"].shape == (32, 32)  # Conv1D (in, out): H is (in, in)
    rows = []
    for i in ids:
        h = model.transformer.wte(i) + model.transformer.wpe(torch.arange(i.shape[1]))
        rows.append(model.transformer.h[0].ln_1(h).reshape(-1, 8).detach())
    torch.testing.assert_close(
        got["transformer.h.0.attn.c_attn.weight"].double(), hessian_of(torch.cat(rows)), rtol=1e-5, atol=1e-6
    )


def test_hooks_removed_on_exceptions_and_bad_input():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(5, 2))  # shapes do not chain
    params = dict(model.named_parameters())
    before = snapshot(model)
    with pytest.raises(RuntimeError):
        hessians(model, params, [torch.randn(2, 3)])
    assert unchanged(model, before)
    with pytest.raises(TypeError, match="batch"):
        hessians(model, params, [object()])
    assert unchanged(model, before)
    with pytest.raises(TypeError, match="kwargs"):
        hessians(model, params, [torch.randn(2, 3)], kwargs=[1])
    with pytest.raises(ValueError, match="at least one batch"):
        hessians(model, params, [])


def test_unreached_layer_warns():
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    with pytest.warns(UserWarning, match="hessians: no input reached 1 .*out_proj"):
        got = hessians(layer, dict(layer.named_parameters()), [torch.randn(2, 3, 8)])
    assert "self_attn.out_proj.weight" not in got and "linear1.weight" in got
