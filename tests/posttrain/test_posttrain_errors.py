"""Bad input to the post-training functions: an error naming the argument (and the layer), raised
before anything is changed, or a warning naming the layer for NaN statistics."""

from __future__ import annotations

import pytest
import torch

import fprune
from fprune.distributions import owl
from test_posttrain_oneshot import BUILDERS, calibration, gpt2, same_state, state

transformers = pytest.importorskip("transformers")


def prune_refused(model, params, batches, error, match, **kwargs):
    """prune raises, with inplace=True too, and the module and params are as they were."""
    meta = any(p.is_meta for p in model.parameters())
    before = None if meta else state(model)
    copies = {k: v.detach().clone() for k, v in params.items()}
    sparsity = kwargs.pop("sparsity", 0.5)
    for inplace in (False, True):
        with pytest.raises(error, match=match):
            fprune.oneshot.prune(model, params, batches, sparsity, inplace=inplace, **kwargs)
        assert meta or same_state(model, before)
        for k, v in params.items():
            if v.device.type != "meta":
                torch.testing.assert_close(v.detach(), copies[k], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_selections_of_no_linear_layer(name):
    model, _ = BUILDERS[name]()
    params = dict(model.named_parameters())
    batches = calibration()
    prune_refused(
        model, params, batches, ValueError, "no linear layer.*where=", where=lambda n, p: "lm_head" in n
    )
    norm = {"gpt2": "transformer.ln_f", "llama": "model.norm", "bert": "bert.embeddings.LayerNorm"}[name]
    prune_refused(model, params, batches, ValueError, rf"no linear layer.*blocks=\['{norm}'\]", blocks=[norm])


def test_nan_or_inf_weights_name_the_layer():
    model, _ = gpt2()
    params = dict(model.named_parameters())
    bad = params["transformer.h.1.mlp.c_proj.weight"].detach().clone()
    bad[0, 0] = float("inf")
    prune_refused(
        model,
        {**params, "transformer.h.1.mlp.c_proj.weight": bad},
        calibration(),
        ValueError,
        r"weight of layer 'transformer\.h\.1\.mlp\.c_proj\.weight' holds NaN or inf",
    )


def test_params_of_the_wrong_shape_or_unknown_keys():
    model, _ = gpt2()
    params = dict(model.named_parameters())
    for call in (fprune.calibration.hessians, fprune.calibration.input_norms):
        with pytest.raises(
            ValueError, match=r"params\['transformer\.h\.0\.attn\.c_attn\.weight'\] of the module's shape"
        ):
            call(model, {"transformer.h.0.attn.c_attn.weight": torch.zeros(3, 3)}, calibration())
    prune_refused(
        model,
        {**params, "transformer.h.0.attn.c_attn.weight": torch.zeros(48, 16)},
        calibration(),
        ValueError,
        r"c_attn\.weight'\] of the module's shape \(16, 48\), got \(48, 16\)",
    )
    prune_refused(
        model,
        {**params, "transformer.h.9.mlp.weight": torch.zeros(2)},
        calibration(),
        ValueError,
        "'transformer.h.9.mlp.weight'",
    )
    # tied names (GPT-2's lm_head.weight is transformer.wte.weight) and buffers are keys of the module
    fprune.calibration.hessians(model, {"lm_head.weight": params["transformer.wte.weight"]}, calibration())


def test_a_meta_device_model():
    with torch.device("meta"):
        model, _ = gpt2()
    params = dict(model.named_parameters())
    prune_refused(model, params, calibration(), ValueError, r"meta device \(no values\): 'lm_head\.weight'")
    with pytest.raises(ValueError, match="meta device"):
        fprune.calibration.hessians(model, params, calibration())


def test_an_empty_calibration_batch():
    model, _ = gpt2()
    params = dict(model.named_parameters())
    batches = calibration() + [{"input_ids": torch.zeros(0, 12, dtype=torch.long)}]
    prune_refused(model, params, batches, ValueError, "batch 3 reaches the first block with no rows")
    layer = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="'weight' received 0 input rows"):
        fprune.calibration.hessians(layer, dict(layer.named_parameters()), [torch.zeros(0, 4)])
    # an empty batch beside others is fine for the hessian: it adds no rows
    h = fprune.calibration.hessians(
        layer, dict(layer.named_parameters()), [torch.ones(2, 4), torch.zeros(0, 4)]
    )
    torch.testing.assert_close(h["weight"], torch.full((4, 4), 2.0))


def test_nan_inputs_warn_naming_the_layer():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    x = torch.ones(5, 3)
    x[2, 1] = float("nan")
    params = dict(model.named_parameters())
    with pytest.warns(
        UserWarning,
        match=r"hessians: the inputs of 2 linear layer\(s\) hold NaN or inf.*'0\.weight', '1\.weight'",
    ):
        fprune.calibration.hessians(model, params, [x])
    with pytest.warns(UserWarning, match=r"input_norms: the inputs .*'0\.weight'"):
        fprune.calibration.input_norms(model, params, [x])


def test_nan_statistics_in_the_pipeline_name_the_layer():
    model, _ = gpt2()
    params = dict(model.named_parameters())
    bias = params["transformer.h.0.ln_1.bias"].detach().clone()
    bias[0] = float("nan")  # not a linear layer's weight: its outputs, the next inputs, are NaN
    prune_refused(
        model,
        {**params, "transformer.h.0.ln_1.bias": bias},
        calibration(),
        ValueError,
        r"inputs of 'transformer\.h\.0\.attn\.c_attn\.weight'.* in block 'transformer\.h\.0' hold NaN",
    )


def owl_params():
    params = {f"h.{b}.fc.weight": torch.randn(8, 8) for b in range(3)}
    norms = {k: torch.rand(1, 8) + 0.1 for k in params}
    return params, norms


def test_owl_bad_norms_and_blocks():
    params, norms = owl_params()
    bad = dict(norms)
    bad["h.1.fc.weight"] = torch.full((1, 8), float("nan"))
    with pytest.raises(ValueError, match=r"norms\['h\.1\.fc\.weight'\] to be finite"):
        owl(params, bad, 0.5)
    with pytest.raises(ValueError, match="m > 0"):
        owl(params, norms, 0.5, m=0)
    with pytest.raises(
        ValueError,
        match=r"head\.weight.\] is selected but belongs to no block \(its name holds no block number\)",
    ):
        owl({**params, "head.weight": torch.ones(8, 8)}, {**norms, "head.weight": torch.ones(1, 8)}, 0.5)
    # transposed norms: (8, 1) for a square nn.Linear weighs its outputs; module= tells
    layers = torch.nn.ModuleDict(
        {"h": torch.nn.ModuleList(torch.nn.ModuleDict({"fc": torch.nn.Linear(8, 8)}) for _ in range(3))}
    )
    transposed = {k: v.T for k, v in norms.items()}
    owl(params, transposed, 0.5)  # without module= a square weight cannot tell
    with pytest.raises(
        ValueError, match=r"norms\['h\.0\.fc\.weight'\] of shape \(1, 8\) .*nn\.Linear.*got \(8, 1\)"
    ):
        owl(params, transposed, 0.5, module=layers)
    assert owl(params, norms, 0.5, module=layers) == owl(params, norms, 0.5)
    with pytest.raises(ValueError, match=r"norms\['h\.0\.fc\.weight'\] of shape"):
        owl(params, {**norms, "h.0.fc.weight": torch.ones(8)}, 0.5)


def test_owl_conv1d_orientation_with_module():
    model, _ = gpt2()
    params = dict(model.named_parameters())
    norms = fprune.calibration.input_norms(
        model, params, calibration(), where=lambda n, p: ".h." in n and p.dim() == 2
    )
    want = owl(params, norms, 0.5)
    assert owl(params, norms, 0.5, module=model) == want
    name = "transformer.h.0.attn.c_proj.weight"  # a square Conv1D: (in, 1) norms
    with pytest.raises(ValueError, match=r"Conv1D"):
        owl(params, {**norms, name: norms[name].T}, 0.5, module=model)
