"""fprune.load_into: pruned params from oneshot.prune written back into a transformers model, so
that its own generate, save_pretrained and from_pretrained run the pruned weights."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

import fprune

transformers = pytest.importorskip("transformers")


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=64, tie_word_embeddings=True
    )
    return transformers.GPT2LMHeadModel(config).eval()


def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config).eval()


MODELS = {"gpt2": gpt2, "llama": llama}


def pruned(model, method="sparsegpt"):
    g = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, 64, (2, 16), generator=g)} for _ in range(2)]
    return fprune.oneshot.prune(model, dict(model.named_parameters()), batches, 0.5, method=method)


def greedy_functional(model, params, ids, steps):
    """Greedy decoding by hand through functional_call with the given params."""
    for _ in range(steps):
        logits = functional_call(model, params, (ids,), {"use_cache": False}).logits
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def generate(model, ids, steps):
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=steps,
        do_sample=False,
        pad_token_id=0,
    )


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_unchanged(model, before):
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


@pytest.mark.parametrize("name", sorted(MODELS))
def test_generate_matches_functional_call_with_the_pruned_params(name):
    model = MODELS[name]()
    new, masks = pruned(model)
    ids = torch.tensor([[3, 14, 15, 9, 2, 6]])
    expected = greedy_functional(model, new, ids, 5)
    dense_logits = model(ids).logits
    parameters = {k: id(p) for k, p in model.named_parameters()}

    assert fprune.load_into(model, new) is model

    assert {k: id(p) for k, p in model.named_parameters()} == parameters  # the same objects
    for k, p in model.named_parameters():
        assert torch.equal(p, new[k]), k
        assert p.requires_grad
    assert any(not m.all() for m in masks.values())
    assert torch.equal(generate(model, ids, 5), expected)
    assert not torch.allclose(model(ids).logits, dense_logits)  # the pruned weights are in use


def test_the_tie_survives_and_one_name_writes_both():
    model = gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    value = torch.randn_like(model.transformer.wte.weight)
    fprune.load_into(model, {"transformer.wte.weight": value})
    assert model.lm_head.weight is model.transformer.wte.weight
    assert torch.equal(model.lm_head.weight, value)
    other = torch.randn_like(value)
    fprune.load_into(model, {"lm_head.weight": other})  # the tied name works too
    assert torch.equal(model.transformer.wte.weight, other)
    fprune.load_into(model, {"lm_head.weight": value, "transformer.wte.weight": value.clone()})
    assert torch.equal(model.transformer.wte.weight, value)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_save_and_from_pretrained_round_trip(name, tmp_path):
    model = MODELS[name]()
    new, _ = pruned(model, "wanda")
    fprune.load_into(model, new)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    for k, p in loaded.named_parameters():
        assert torch.equal(p, new[k]), k
    if name == "gpt2":
        assert loaded.lm_head.weight is loaded.transformer.wte.weight
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(generate(loaded, ids, 3), generate(model, ids, 3))


def test_keeps_the_module_dtype_and_converts_floating_values():
    model = torch.nn.Linear(4, 3).to(torch.bfloat16)
    value = torch.randn(3, 4, dtype=torch.float64)
    fprune.load_into(model, {"weight": value})
    assert model.weight.dtype == torch.bfloat16
    assert torch.equal(model.weight, value.to(torch.bfloat16))


def test_buffers_are_untouched():
    model = torch.nn.BatchNorm1d(3)
    model.running_mean.fill_(2.0)
    fprune.load_into(model, {"weight": torch.full((3,), 5.0)})
    assert torch.equal(model.running_mean, torch.full((3,), 2.0))
    assert torch.equal(model.weight, torch.full((3,), 5.0))


def test_its_own_parameters_load_as_a_no_op():
    model = torch.nn.Linear(4, 3)
    before = snapshot(model)
    fprune.load_into(model, dict(model.named_parameters()))
    fprune.load_into(model, {"weight": model.weight.detach()})
    assert_unchanged(model, before)


def hooked():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    torch.nn.utils.prune.l1_unstructured(model[0], "weight", 0.5)
    return model


BAD = [
    (
        "unknown",
        lambda m: {"1.weight": torch.zeros(2, 3), "1.wieght": torch.zeros(2, 3)},
        ValueError,
        r"params\['1.wieght'\].*no parameter.*nearest.*1.weight",
    ),
    ("shape", lambda m: {"1.weight": torch.zeros(3, 2)}, ValueError, r"params\['1.weight'\].*\(2, 3\)"),
    ("not a tensor", lambda m: {"1.bias": [0.0, 0.0]}, TypeError, r"params\['1.bias'\].*list"),
    (
        "bool masks",
        lambda m: {"1.weight": torch.ones(2, 3, dtype=torch.bool)},
        TypeError,
        r"params\['1.weight'\].*bool",
    ),
    ("integer", lambda m: {"1.weight": torch.ones(2, 3, dtype=torch.int64)}, TypeError, "floating.*int64"),
    ("meta", lambda m: {"1.weight": torch.empty(2, 3, device="meta")}, ValueError, "meta"),
    (
        "buffer",
        lambda m: {"0.weight_mask": torch.zeros(3, 4)},
        ValueError,
        r"params\['0.weight_mask'\].*buffer",
    ),
    (
        "hook _orig",
        lambda m: {"0.weight_orig": torch.zeros(3, 4)},
        ValueError,
        r"params\['0.weight_orig'\].*prune hook",
    ),
    (
        "hooked name",
        lambda m: {"0.weight": torch.zeros(3, 4)},
        ValueError,
        r"params\['0.weight'\].*prune hook",
    ),
    ("key", lambda m: {0: torch.zeros(3, 4)}, TypeError, "str"),
]


@pytest.mark.parametrize("label,make,error,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_before_anything_is_written(label, make, error, match):
    model = hooked()
    before = snapshot(model)
    good = {"1.bias": torch.full((2,), 7.0)}  # a valid entry, given first: must not be written
    params = {**good, **make(model)}
    with pytest.raises(error, match=match):
        fprune.load_into(model, params)
    assert_unchanged(model, before)


def test_different_values_for_tied_names_raise_and_write_nothing():
    model = gpt2()
    before = snapshot(model)
    w = model.transformer.wte.weight
    params = {
        "transformer.h.0.ln_1.bias": torch.ones(32),
        "transformer.wte.weight": torch.zeros_like(w),
        "lm_head.weight": torch.ones_like(w),
    }
    with pytest.raises(
        ValueError, match=r"params\['lm_head.weight'\].*params\['transformer.wte.weight'\].*tied"
    ):
        fprune.load_into(model, params)
    assert_unchanged(model, before)


@pytest.mark.parametrize(
    "module,params,match",
    [
        ("not a module", {}, "module"),
        (torch.nn.Linear(2, 2), [("weight", torch.zeros(2, 2))], "params"),
    ],
)
def test_bad_arguments(module, params, match):
    with pytest.raises(TypeError, match=match):
        fprune.load_into(module, params)
