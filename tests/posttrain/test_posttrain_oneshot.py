"""fprune.oneshot.prune against a plain reference pipeline (a deep copy pruned in place, block by
block, with full forwards), on GPT-2, BERT and a Llama-style decoder from tiny configs."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

import fprune
from fprune.reconstruct import refine, sparsegpt

transformers = pytest.importorskip("transformers")

VOCAB = 64


def gpt2():
    config = transformers.GPT2Config(
        n_layer=3, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config).eval(), "transformer.h"


def bert():
    config = transformers.BertConfig(
        num_hidden_layers=2,
        num_attention_heads=2,
        hidden_size=16,
        intermediate_size=32,
        vocab_size=VOCAB,
        max_position_embeddings=32,
    )
    return transformers.BertForMaskedLM(config).eval(), "bert.encoder.layer"


def llama():
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=16,
        intermediate_size=32,
        vocab_size=VOCAB,
        max_position_embeddings=32,
    )
    return transformers.LlamaForCausalLM(config).eval(), "model.layers"


BUILDERS = {"gpt2": gpt2, "bert": bert, "llama": llama}


def calibration(seed=0, n=3, with_padding=False):
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (2, 12), generator=g)
        mask = torch.ones_like(ids)
        if with_padding:
            mask[1, 9:] = 0
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def is_conv1d(layer):
    return type(layer).__name__ == "Conv1D"


def reference(model, container, batches, method, amount=None, n_m=None, refine_steps=0):
    """Prune a deep copy in place, block by block: each block's layer statistics come from full
    forwards of the copy, whose earlier blocks are already pruned (SparseGPT's and Wanda's
    sequential loop, with whole-model forwards instead of the captured block inputs)."""
    model = copy.deepcopy(model)
    blocks = model.get_submodule(container)
    masks = {}
    for b, block in enumerate(blocks):
        layers = {n: m for n, m in block.named_modules() if isinstance(m, torch.nn.Linear) or is_conv1d(m)}
        stats = {n: [] for n in layers}
        handles = [
            m.register_forward_pre_hook(
                lambda m, a, n=n, *, stats=stats: stats[n].append(a[0].reshape(-1, a[0].shape[-1]))
            )
            for n, m in layers.items()
        ]
        with torch.no_grad():
            for batch in batches:
                model(
                    **batch, use_cache=False
                ) if "use_cache" in model.forward.__code__.co_varnames else model(**batch)
        for h in handles:
            h.remove()
        for n, layer in layers.items():
            x = torch.cat(stats[n]).double()
            h = (2.0 / x.shape[0] * x.T @ x).float()
            W = layer.weight.data.T if is_conv1d(layer) else layer.weight.data
            if method == "sparsegpt":
                new, keep = sparsegpt(W, h, amount, n_m=n_m)
            else:
                norms = x.square().sum(0).sqrt().float()
                scores = W.abs() * norms if method == "wanda" else W.abs()
                if n_m is not None:
                    keep = fprune.n_m({"w": scores}, *n_m, importance_scores={"w": scores})["w"]
                elif method == "wanda":
                    keep = fprune.rowwise_unstructured({"w": scores}, amount)["w"]
                else:
                    keep = fprune.l1_unstructured({"w": scores}, amount)["w"]
                new = W * keep
            if refine_steps:
                new = refine(W, h, keep, init=new, iters=refine_steps)
            if is_conv1d(layer):
                new, keep = new.T, keep.T
            layer.weight.data = new.contiguous()
            masks[f"{container}.{b}.{n}.weight"] = keep
    return dict(model.named_parameters()), masks


def state(model):
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    return {k: v.clone() for k, v in model.state_dict().items()}, hooks, model.training


def same_state(model, before):
    tensors, hooks, training = state(model)
    return (
        all(torch.equal(v, before[0][k]) for k, v in tensors.items())
        and hooks == before[1]
        and training == before[2]
    )


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
@pytest.mark.parametrize(
    "method, amount, n_m",
    [
        ("sparsegpt", 0.5, None),
        ("sparsegpt", None, (2, 4)),
        ("wanda", 0.5, None),
        ("wanda", None, (2, 4)),
        ("magnitude", 0.7, None),
    ],
)
def test_equals_the_reference_pipeline(name, method, amount, n_m):
    torch.manual_seed(0)
    model, container = BUILDERS[name]()
    params = dict(model.named_parameters())
    batches = calibration(with_padding=name != "gpt2")
    before = state(model)
    got, masks = fprune.oneshot.prune(model, params, batches, amount, method=method, n_m=n_m)
    assert same_state(model, before)
    want, want_masks = reference(model, container, batches, method, amount, n_m)
    assert got.keys() == want.keys()
    assert masks.keys() == want_masks.keys()  # masks only for the layers pruned, by default
    for k in want:
        if k in want_masks:
            assert torch.equal(masks[k], want_masks[k]), k
            assert (got[k][~masks[k]] == 0).all()
        torch.testing.assert_close(got[k], want[k].detach(), rtol=2e-4, atol=2e-5, msg=k)
    # everything outside the blocks is dense and untouched
    for k, p in params.items():
        if not k.startswith(container + "."):
            assert got[k] is p or torch.equal(got[k], p)


def test_refine_and_per_leaf_amounts_match_the_reference():
    torch.manual_seed(1)
    model, container = gpt2()
    params = dict(model.named_parameters())
    batches = calibration(seed=1)
    refined = fprune.oneshot.Refine(fprune.oneshot.Wanda(), iters=5)
    got, masks = fprune.oneshot.prune(model, params, batches, 0.5, method=refined)
    want, want_masks = reference(model, container, batches, "wanda", 0.5, refine_steps=5)
    for k in want_masks:
        assert torch.equal(masks[k], want_masks[k])
        torch.testing.assert_close(got[k], want[k].detach(), rtol=2e-4, atol=2e-5)
    amounts = {k: (0.25 if ".0." in k else None) for k in params if k.endswith("c_fc.weight")}
    _, masks = fprune.oneshot.prune(model, params, batches, amounts)
    pruned = {k: float((~m).float().mean()) for k, m in masks.items()}
    assert pruned == {"transformer.h.0.mlp.c_fc.weight": 0.25}


def test_owl_profile_equals_owl_of_dense_norms():
    torch.manual_seed(2)
    model, container = llama()
    params = dict(model.named_parameters())
    batches = calibration(seed=2)
    in_blocks = lambda name, p: name.startswith(container + ".") and p.dim() == 2
    norms = fprune.calibration.input_norms(model, params, batches, where=in_blocks)
    want = fprune.distributions.owl(params, norms, 0.6, m=2.0)
    _got, masks = fprune.oneshot.prune(
        model, params, batches, 0.6, method="wanda", profile=fprune.oneshot.OWL(m=2.0)
    )
    _explicit, explicit_masks = fprune.oneshot.prune(model, params, batches, want, method="wanda")
    for k in masks:
        assert torch.equal(masks[k], explicit_masks[k]), k
    assert len({want[k] for k in norms}) > 1  # the blocks do get different sparsities


def test_progress_reports_every_phase(capsys, monkeypatch):
    model, _ = llama()
    params = dict(model.named_parameters())
    reports = []
    fprune.oneshot.prune(model, params, calibration(), 0.5, profile="owl", progress=reports.append)
    phases = [(r.phase, r.number, r.total) for r in reports]
    assert phases == [
        ("capture", 0, 3), ("capture", 1, 3), ("capture", 2, 3),
        ("norms", 0, 2), ("norms", 1, 2),
        ("prune", 0, 2), ("prune", 1, 2),
    ]  # fmt: skip
    assert all(r.layers == 7 for r in reports if r.phase == "prune")
    assert reports[-1].name == "model.layers.1" and reports[-1].remaining_seconds == 0.0
    elapsed = [r.elapsed_seconds for r in reports]
    assert elapsed == sorted(elapsed) and all(r.remaining_seconds >= 0 for r in reports)
    # batches without a length: the capture's total and estimate are unknown
    reports.clear()
    fprune.oneshot.prune(model, params, iter(calibration()), 0.5, progress=reports.append)
    assert [(r.total, r.remaining_seconds) for r in reports if r.phase == "capture"] == [(0, None)] * 3
    # plain lines on stderr without tqdm
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    fprune.oneshot.prune(model, params, calibration(), 0.5, profile="owl", progress=True)
    err = capsys.readouterr().err
    assert "oneshot.prune: capture of model.layers.0's inputs, batch 3/3:" in err
    assert "oneshot.prune: OWL's dense pass, block 2/2 model.layers.1:" in err
    assert "oneshot.prune: block 2/2 model.layers.1: 7 layers, statistics" in err
    assert "elapsed, ~0.0 s left" in err
    fprune.oneshot.prune(model, params, calibration(), 0.5)
    assert capsys.readouterr().err == ""


def test_progress_uses_tqdm_when_installed(capsys):
    pytest.importorskip("tqdm")
    model, _ = gpt2()
    fprune.oneshot.prune(model, dict(model.named_parameters()), calibration(), 0.5, progress=True)
    err = capsys.readouterr().err
    assert "oneshot.prune: capture" in err and "oneshot.prune: blocks" in err and "3/3" in err
    assert "statistics" not in err  # tqdm's bars, not the plain lines


class Tower(torch.nn.Module):
    """Blocks in a plain list, run in order, taking an extra keyword argument."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.stages = torch.nn.ModuleList([Stage(), Stage()])
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x, scale=1.0):
        x = self.embed(x)
        for stage in self.stages:
            x = stage(x, scale=scale)
        return self.head(x)


class Stage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, scale=1.0):
        return torch.relu(self.fc(x)) * scale


def test_blocks_argument_kwargs_and_where():
    torch.manual_seed(0)
    model = Tower().eval()
    params = dict(model.named_parameters())
    batches = [(torch.randn(16, 4), 2.0) for _ in range(2)]
    a, ma = fprune.oneshot.prune(model, params, batches, 0.5, blocks=["stages.0", "stages.1"])
    _b, mb = fprune.oneshot.prune(model, params, batches, 0.5, blocks="stages")
    _c, mc = fprune.oneshot.prune(model, params, batches, 0.5)
    assert all(torch.equal(ma[k], mb[k]) and torch.equal(ma[k], mc[k]) for k in ma)
    assert {k for k, m in ma.items() if not m.all()} == {"stages.0.fc.weight", "stages.1.fc.weight"}
    _only, masks = fprune.oneshot.prune(
        model, params, batches, 0.5, where=lambda n, p: n == "stages.1.fc.weight"
    )
    assert {k for k, m in masks.items() if not m.all()} == {"stages.1.fc.weight"}
    # the second stage's hessian comes from the first stage's pruned outputs times scale=2
    x = torch.cat(
        [
            torch.relu(
                torch.func.functional_call(
                    model.stages[0].fc,
                    {"weight": a["stages.0.fc.weight"], "bias": a["stages.0.fc.bias"]},
                    (model.embed(bt[0]),),
                )
            )
            * 2.0
            for bt in batches
        ]
    )
    h = 2.0 / x.shape[0] * x.T @ x
    want, _ = sparsegpt(params["stages.1.fc.weight"], h, 0.5)
    torch.testing.assert_close(a["stages.1.fc.weight"], want, rtol=1e-4, atol=1e-5)


def test_training_mode_warns_and_is_kept():
    model, _ = gpt2()
    model.train()
    with pytest.warns(UserWarning, match="training mode"):
        fprune.oneshot.prune(model, dict(model.named_parameters()), calibration(), 0.5, method="magnitude")
    assert model.training


def test_hooks_removed_when_a_batch_fails():
    model, _ = gpt2()
    before = state(model)
    with pytest.raises(ValueError, match=r"batches\[0\] gives the embedding"):
        fprune.oneshot.prune(
            model, dict(model.named_parameters()), [{"input_ids": torch.full((1, 4), VOCAB + 5)}], 0.5
        )
    assert same_state(model, before)
    with pytest.raises(TypeError, match="batch"):
        fprune.oneshot.prune(model, dict(model.named_parameters()), ["text"], 0.5)
    assert same_state(model, before)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"sparsity": None}, ValueError, "or n_m"),
        (
            {"sparsity": 0.6, "n_m": (2, 4)},
            ValueError,
            r"sparsity=None or 0.5 \(= 1 - 2/4\) with n_m=\(2, 4\)",
        ),
        ({"sparsity": 0.5, "method": "obs"}, ValueError, "method"),
        ({"sparsity": 0.5, "method": 3}, TypeError, "method"),
        ({"sparsity": 0.5, "profile": "erk"}, TypeError, "profile"),
        ({"sparsity": None, "n_m": (2, 4), "profile": "owl"}, ValueError, "profile='owl' with one sparsity"),
        (
            {"sparsity": {"transformer.h.0.mlp.c_fc.weight": 2.0}},
            ValueError,
            r"sparsity\['transformer.h.0.mlp.c_fc",
        ),
        ({"sparsity": {"transformer.wte.weight": 0.5}}, ValueError, "not weights of the linear layers"),
        ({"sparsity": {"transformer.h.0.mlp.c_fc.weight": None}}, ValueError, "no amount"),
        ({"sparsity": 0.5, "blocks": "nope"}, ValueError, "nope"),
        ({"sparsity": 0.5, "inplace": 1}, TypeError, "inplace"),
        ({"sparsity": 0.5, "masks": "some"}, ValueError, "masks"),
        ({"sparsity": 0.5, "progress": "yes"}, TypeError, "progress"),
        ({"sparsity": 0.5, "blocks": ["transformer.h.1", "transformer.h.0"]}, ValueError, "in the order"),
        ({"sparsity": 1}, TypeError, r"Expected sparsity to be a fraction in \[0, 1\].*got the int 1"),
        ({"sparsity": 1.5}, ValueError, r"Expected sparsity to be a fraction in \[0, 1\].*got 1.5"),
        ({"sparsity": float("nan")}, ValueError, "Expected sparsity"),
        ({"sparsity": None, "n_m": (2, 3)}, ValueError, "c_attn.weight.* multiple of m=3"),
    ],
)
def test_bad_input(kwargs, error, match):
    model, _ = gpt2()
    sparsity = kwargs.pop("sparsity")
    with pytest.raises(error, match=match):
        fprune.oneshot.prune(model, dict(model.named_parameters()), calibration(), sparsity, **kwargs)


def test_no_blocks_found_and_a_block_never_reached():
    with pytest.raises(ValueError, match="pass blocks="):
        fprune.oneshot.find_blocks(torch.nn.Linear(2, 2))
    model = Tower().eval()
    model.spare = torch.nn.Linear(8, 8)  # never called
    with pytest.raises(ValueError, match="without calling its first block"):
        fprune.oneshot.prune(model, dict(model.named_parameters()), [torch.ones(1, 4)], 0.5, blocks=["spare"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
