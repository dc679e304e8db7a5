"""fprune.compact on transformers GPT-2, BERT and Llama (tiny configs, nothing downloaded): the
model's own class, smaller, at other batch and sequence sizes and with keyword inputs the
example did not have; training, saving, generate, and the config round trip."""

from __future__ import annotations

import io
import warnings

import pytest
import torch

import fprune
from fprune.select import Global
from structure_cases import (
    IDS,
    assert_unchanged,
    bert,
    gpt2,
    llama,
    masked_copy,
    snapshot,
    transformers_or_skip,
)
from tests.helpers import params_of

transformers = transformers_or_skip()

BUILD = {"gpt2": gpt2, "gpt2_eager": lambda seed=0: gpt2(seed, "eager"), "bert": bert, "llama": llama}
# BERT's example has an attention mask (later calls leave it out); the decoders' have none.
EXAMPLE = {"bert": {"input_ids": IDS, "attention_mask": torch.ones_like(IDS)}}


def _example(name):
    return EXAMPLE.get(name, {"input_ids": IDS})


def _out(model, **kwargs):
    out = model(**kwargs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _compact(model, params, masks, s, kwargs, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GPT-2 / BERT configs cannot describe fewer heads
        return fprune.compact(model, params, masks, s, (), kwargs, **kw)


@pytest.fixture(scope="module", params=list(BUILD))
def pruned(request):
    model = BUILD[request.param]()
    kwargs = _example(request.param)
    s = fprune.structure.groups(model, (), kwargs)
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)  # half the heads and MLP widths
    return request.param, model, s, params, masks


def _inputs():
    """Other batch and sequence sizes, with and without an attention mask (left padding)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for batch, length in ((1, 3), (3, 11)):
        ids = torch.randint(0, 64, (batch, length), generator=g)
        out.append({"input_ids": ids})
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[0, : length // 2] = 0
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def test_same_class_smaller_equal_at_other_sizes_and_keywords(pruned):
    name, model, s, params, masks = pruned
    before = snapshot(model)
    small = _compact(model, params, masks, s, _example(name))
    assert type(small) is type(model)
    assert sum(p.numel() for p in small.parameters()) < 0.8 * sum(p.numel() for p in model.parameters())
    for kwargs in _inputs():
        with torch.no_grad():
            want = _out(masked_copy(model, params, masks), **kwargs)
            torch.testing.assert_close(_out(small, **kwargs), want, atol=1e-5, rtol=0)
    assert_unchanged(model, before)


def test_attributes(pruned):
    name, model, s, params, masks = pruned
    small = _compact(model, params, masks, s, _example(name))
    if name.startswith("gpt2"):
        attn, mlp = small.transformer.h[0].attn, small.transformer.h[0].mlp
        assert (attn.num_heads, attn.head_dim, attn.split_size, attn.embed_dim) == (2, 8, 16, 32)
        assert (attn.c_attn.nf, attn.c_attn.nx, attn.c_proj.nf, attn.c_proj.nx) == (48, 32, 32, 16)
        assert (mlp.c_fc.nf, mlp.c_proj.nx) == (64, 64)
        assert small.lm_head.weight is small.transformer.wte.weight
        assert small.config.n_inner == 64  # uniform MLP width: said by the config
    elif name == "bert":
        attn = small.encoder.layer[1].attention.self
        assert (attn.num_attention_heads, attn.attention_head_size, attn.all_head_size) == (2, 8, 16)
        assert small.encoder.layer[1].intermediate.dense.out_features == 32
        assert small.config.intermediate_size == 32
    else:
        attn, mlp = small.model.layers[0].self_attn, small.model.layers[0].mlp
        assert attn.q_proj.out_features == attn.k_proj.out_features == 32 // 2
        assert (mlp.intermediate_size, mlp.down_proj.in_features) == (32, 32)
        cfg = small.config
        fields = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size)
        assert fields == (2, 2, 8, 32)


def test_train_eval_and_optimizer_steps(pruned):
    name, model, s, params, masks = pruned
    small = _compact(model, params, masks, s, _example(name))
    small.train()
    assert all(m.training for m in small.modules())
    small.eval()
    # A few steps: the same as training the masked model and compacting (dropout off in eval).
    batches = list(_inputs())
    opt = torch.optim.SGD(small.parameters(), lr=0.05)
    for kwargs in batches:
        opt.zero_grad()
        _out(small, **kwargs).pow(2).mean().backward()
        opt.step()
    trained = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.SGD(trained.values(), lr=0.05)
    for kwargs in batches:
        opt.zero_grad()
        out = fprune.masked_call(model, trained, masks, (), kwargs)
        (out.logits if hasattr(out, "logits") else out.last_hidden_state).pow(2).mean().backward()
        opt.step()
    want = _compact(model, {k: v.detach() for k, v in trained.items()}, masks, s, _example(name))
    got = small.state_dict()
    for k, v in want.state_dict().items():
        torch.testing.assert_close(got[k], v, atol=1e-5, rtol=1e-4, msg=k)


def test_save_and_load(pruned):
    name, model, s, params, masks = pruned
    small = _compact(model, params, masks, s, _example(name))
    kwargs = _inputs()[-1]
    with torch.no_grad():
        want = _out(small, **kwargs)
    buffer = io.BytesIO()
    torch.save(small, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(_out(loaded, **kwargs), want, atol=0, rtol=0)
    other = BUILD[name](seed=1)
    skeleton = _compact(other, params_of(other), masks, s, _example(name))
    buffer = io.BytesIO()
    torch.save(small.state_dict(), buffer)
    skeleton.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    with torch.no_grad():
        torch.testing.assert_close(_out(skeleton, **kwargs), want, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_gives_the_masked_models_tokens(name):
    model = BUILD[name]()
    s = fprune.structure.groups(model, (), {"input_ids": IDS})
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    small = _compact(model, params, masks, s, {"input_ids": IDS})
    masked = masked_copy(model, params, masks)
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    attention = torch.ones_like(prompt)
    attention[1, :2] = 0  # a left-padded row
    options = dict(max_new_tokens=12, do_sample=False, use_cache=True, attention_mask=attention)
    got = small.generate(prompt, **options)
    want = masked.generate(prompt, **options)
    assert got.shape == (2, 17)
    assert torch.equal(got, want)
    # Without the KV cache too.
    assert torch.equal(small.generate(prompt, **{**options, "use_cache": False}), want)


@pytest.mark.parametrize(
    "name, where, fields",
    [
        ("gpt2", lambda n, g: ".mlp." in n, {"n_inner": 64}),
        ("bert", lambda n, g: ".intermediate." in n, {"intermediate_size": 32}),
        ("llama", None, {"num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 32}),
    ],
)
def test_config_round_trip_where_widths_are_uniform(name, where, fields, tmp_path):
    model = BUILD[name]()
    kwargs = _example(name)
    s = fprune.structure.groups(model, (), kwargs)
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s, where=where)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config can describe this model: no warning
        small = fprune.compact(model, params, masks, s, (), kwargs)
    assert {k: getattr(small.config, k) for k in fields} == fields
    assert all(getattr(model.config, k) != v for k, v in fields.items())  # the original's is kept
    small.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    for kw in _inputs():
        with torch.no_grad():
            torch.testing.assert_close(_out(loaded, **kw), _out(small, **kw), atol=0, rtol=0)


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_config_that_cannot_describe_the_model_warns(name):
    model = BUILD[name]()
    kwargs = _example(name)
    s = fprune.structure.groups(model, (), kwargs)
    params = params_of(model)
    # Global scope: each layer keeps its own number of channels (per-layer widths).
    masks = fprune.group_structured(params, 0.5, s, scope=Global(min_keep=1))
    words = "config of the compacted .* cannot describe .* torch.save"
    with pytest.warns(UserWarning, match=words) as caught:
        small = fprune.compact(model, params, masks, s, (), kwargs)
    assert caught[0].filename == __file__
    mlp = ("c_fc.weight", "intermediate.dense.weight", "up_proj.weight")
    widths = {tuple(p.shape) for n, p in small.named_parameters() if n.endswith(mlp)}
    assert len(widths) > 1  # the layers differ: no config field can say so
    # What to save instead: the whole model (torch.save), which loads as it was.
    buffer = io.BytesIO()
    torch.save(small, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    with torch.no_grad():
        kwargs = _inputs()[-1]
        torch.testing.assert_close(_out(loaded, **kwargs), _out(small, **kwargs), atol=0, rtol=0)


def test_gpt2_fewer_heads_warns_that_its_config_cannot_say_so():
    model = gpt2()
    s = fprune.structure.groups(model, (), {"input_ids": IDS})
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)  # 2 of 4 heads in every layer
    with pytest.warns(UserWarning, match=r"c_attn\.weight is \(32, 48\) here, \(32, 96\)"):
        small = fprune.compact(model, params, masks, s, (), {"input_ids": IDS})
    assert small.config.n_head == 4  # what GPT2Config says stays (n_embd // n_head = head size)


def _round_trip(model, kwargs, where, tmp_path):
    """Half of the groups ``where`` picks, compacted with no warning, saved with save_pretrained
    and loaded with from_pretrained: the loaded model gives the compact one's outputs."""
    s = fprune.structure.groups(model, (), kwargs)
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s, where=where)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config can describe this model: no warning
        small = fprune.compact(model, params, masks, s, (), kwargs)
    small.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    # The loaded tensors are the compact ones, bit for bit; the outputs agree to rounding only:
    # safetensors maps the file, so a loaded weight may start off a 64-byte boundary, and the
    # BLAS of some CPUs then rounds a matmul differently (seen: BERT's pooler, 2.8e-9).
    mine, theirs = small.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys()
    for name, tensor in mine.items():
        assert torch.equal(tensor, theirs[name]), name
    for kw in _inputs():
        with torch.no_grad():
            want = fprune.masked_call(model, params, masks, (), kw)
            got = small(**kw)
            torch.testing.assert_close(loaded(**kw).logits, got.logits, atol=1e-6, rtol=0)
            torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=0)
    return s, small, loaded


@pytest.mark.parametrize("force_gqa", [False, True])
def test_grouped_query_attention_keeps_whole_key_value_groups(force_gqa, tmp_path, monkeypatch):
    # TRANSFORMERS_SDPA_FORCE_GQA: transformers calls scaled_dot_product_attention(enable_gqa=True)
    # instead of repeating the key/value heads itself.
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1" if force_gqa else "0")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    s, _, loaded = _round_trip(model, {"input_ids": IDS}, None, tmp_path)
    heads = s.group("model.layers.0.self_attn.q_proj.weight:0")
    assert (heads.kind, heads.size, heads.prunable, heads.exact) == ("head", 2, True, True)
    attn = loaded.model.layers[0].self_attn
    assert (loaded.config.num_attention_heads, loaded.config.num_key_value_heads) == (4, 1)
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.num_key_value_groups) == (16, 4, 4)
    assert model.config.num_key_value_heads == 2  # the original's config is kept


def test_mlp_filter_by_name_round_trips_a_bert_classifier(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=64,
        num_labels=3,
    )
    model = transformers.BertForSequenceClassification(config).eval()
    kwargs = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS)}
    s, small, loaded = _round_trip(model, kwargs, lambda name, g: ".intermediate." in name, tmp_path)
    assert loaded.config.intermediate_size == 32
    assert small.bert.pooler.dense.out_features == 32  # the pooler keeps its width
    # Flags alone also take the pooler's hidden layer, whose width no config field describes.
    params = params_of(model)
    flags = fprune.group_structured(params, 0.5, s, where=lambda name, g: g.exact and g.kind != "head")
    assert not bool(flags["bert.pooler.dense.weight"].all())
    with pytest.warns(UserWarning, match="cannot describe"):
        fprune.compact(model, params, flags, s, (), kwargs)
