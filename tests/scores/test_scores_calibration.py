"""fprune.calibration.input_norms against manual computations (an MLP, GPT-2 from a tiny config),
and its warning for layers that got no input."""

import warnings

import pytest
import torch

import fprune
from fprune.calibration import input_norms


class Twice(torch.nn.Module):
    """One Linear called twice per forward, taking kwargs."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)
        self.out = torch.nn.Linear(3, 2)

    def forward(self, x, scale=1.0):
        return self.out(self.fc(torch.tanh(self.fc(x * scale))))


def hook_count(model):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_mlp_matches_manual_norms_over_tensor_tuple_and_dict_batches():
    torch.manual_seed(0)
    model = Twice()
    params = {k: v.detach() for k, v in model.named_parameters()}
    xs = [torch.randn(4, 3), torch.randn(2, 5, 3), torch.randn(3, 3)]
    batches = [xs[0], (xs[1], 2.0), {"x": xs[2], "scale": 0.5}]
    got = input_norms(model, params, iter(batches))
    fc_in, out_in = [], []
    for x, scale in [(xs[0], 1.0), (xs[1], 2.0), (xs[2], 0.5)]:
        first = x * scale
        hidden = torch.tanh(model.fc(first))
        fc_in += [first.reshape(-1, 3), hidden.reshape(-1, 3)]
        out_in.append(model.fc(hidden).reshape(-1, 3))
    want_fc = torch.cat(fc_in).double().square().sum(0).sqrt().float().view(1, 3)
    want_out = torch.cat(out_in).double().square().sum(0).sqrt().float().view(1, 3)
    torch.testing.assert_close(got["fc.weight"], want_fc)
    torch.testing.assert_close(got["out.weight"], want_out)
    assert hook_count(model) == 0


def test_uses_the_given_params_and_where():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = {k: v.detach() for k, v in model.named_parameters()}
    pruned = fprune.apply_masks(params, {"0.weight": torch.zeros(4, 3, dtype=torch.bool)})
    x = torch.randn(5, 3)
    got = input_norms(model, pruned, [x], where=lambda name, w: name == "1.weight")
    assert got.keys() == {"1.weight"}
    want = pruned["0.bias"].expand(5, 4).square().sum(0).sqrt().view(1, 4)
    torch.testing.assert_close(got["1.weight"], want)


def test_no_hook_left_on_error():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(5, 2))  # shapes do not chain
    params = dict(model.named_parameters())
    with pytest.raises(RuntimeError):
        input_norms(model, params, [torch.randn(2, 3)])
    assert hook_count(model) == 0
    with pytest.raises(TypeError, match="batch"):
        input_norms(model, params, ["tokens"])
    assert hook_count(model) == 0


def test_bad_input():
    model = torch.nn.Linear(3, 2)
    params = dict(model.named_parameters())
    with pytest.raises(TypeError, match="module"):
        input_norms("m", params, [torch.ones(1, 3)])
    with pytest.raises(TypeError, match="flat dict"):
        input_norms(model, [params["weight"]], [torch.ones(1, 3)])
    with pytest.raises(ValueError, match="at least one batch"):
        input_norms(model, params, [])
    with pytest.raises(TypeError, match="iterable"):
        input_norms(model, params, torch.ones(1, 3))
    with pytest.raises(TypeError, match="where"):
        input_norms(model, params, [torch.ones(1, 3)], where="weight")


def test_gpt2_tiny_config():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=8, vocab_size=50, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    ids = [torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (3, 4))]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = input_norms(model, params, [{"input_ids": i} for i in ids])
    assert hook_count(model) == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # Conv1D weights are (in, out): norms (in, 1). The tied LM head is keyed by wte's name.
    assert got["transformer.h.0.attn.c_attn.weight"].shape == (8, 1)
    assert got["transformer.h.1.mlp.c_proj.weight"].shape == (32, 1)
    assert got["transformer.wte.weight"].shape == (1, 8)
    expected = {
        f"transformer.h.{i}.{n}.weight"
        for i in range(2)
        for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    }
    assert got.keys() == expected | {"transformer.wte.weight"}
    # Manual: the first attention's input is ln_1 of the token + position embeddings.
    rows = []
    for i in ids:
        h = model.transformer.wte(i) + model.transformer.wpe(torch.arange(i.shape[1]))
        rows.append(model.transformer.h[0].ln_1(h).reshape(-1, 8))
    want = torch.cat(rows).double().square().sum(0).sqrt().float().view(8, 1)
    torch.testing.assert_close(got["transformer.h.0.attn.c_attn.weight"], want)
    # The LM head's input is the final layer norm's output.
    rows = [model.transformer(i).last_hidden_state.reshape(-1, 8) for i in ids]
    want = torch.cat(rows).double().square().sum(0).sqrt().float().view(1, 8)
    torch.testing.assert_close(got["transformer.wte.weight"], want)
    # Wanda scores from them broadcast against every weight.
    scores = fprune.scores.wanda(params, got)
    assert all(scores[k].shape == params[k].shape for k in params)


def test_input_norms_warns_for_layers_that_got_no_input():
    # nn.MultiheadAttention calls its out_proj's weight directly (no forward of out_proj): no
    # norms for it, so Wanda scores it by |W| alone, which the warning says.
    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    params = {k: v.detach() for k, v in enc.named_parameters()}
    with pytest.warns(UserWarning, match=r"'self_attn.out_proj.weight'.*\|W\| alone") as record:
        norms = fprune.calibration.input_norms(enc, params, [torch.randn(2, 5, 16)])
    assert record[0].filename == __file__
    assert sorted(norms) == ["linear1.weight", "linear2.weight"]
    scores = fprune.scores.wanda(params, norms)
    assert torch.equal(scores["self_attn.out_proj.weight"], params["self_attn.out_proj.weight"].abs())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # leaving it out with where= silences it
        fprune.calibration.input_norms(
            enc, params, [torch.randn(2, 5, 16)], where=lambda name, p: "out_proj" not in name
        )
