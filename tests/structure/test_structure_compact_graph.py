"""fprune.compact_graph (the graph route): exported with every tensor dim dynamic by default, so
it runs at other batch, sequence and image sizes; what export still fixes, as documented."""

from __future__ import annotations

import pytest
import torch

import fprune
from structure_cases import IDS, TORCH_CASES, bert, gpt2, llama, prune
from tests.helpers import params_of


@pytest.mark.parametrize("case", TORCH_CASES, ids=lambda c: c.name)
def test_torch_models_at_other_sizes(case):
    model, s, params, masks = prune(case)
    graph = fprune.compact_graph(model, params, masks, s, case.example)
    small = fprune.compact(model, params, masks, s, case.example)
    shapes = {k: v.shape for k, v in small.state_dict().items()}
    assert {k: v.shape for k, v in graph.state_dict().items()} == shapes
    ranks = [a.dim() for a in case.example]
    for args in case.others:
        if [a.dim() for a in args] != ranks:  # export fixes ranks (the module route does not)
            with pytest.raises(Exception, match="Guard failed"):
                graph(*args)
            continue
        want = fprune.masked_call(model, params, masks, args)
        torch.testing.assert_close(graph(*args), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_decoders_at_other_batch_and_sequence_sizes(build):
    model = build()
    s = fprune.structure.groups(model, (), {"input_ids": IDS})
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    graph = fprune.compact_graph(model, params, masks, s, (), {"input_ids": IDS})
    for shape in ((1, 3), (3, 17)):
        ids = torch.randint(0, 64, shape)
        want = fprune.masked_call(model, params, masks, (), {"input_ids": ids}).logits
        torch.testing.assert_close(graph(input_ids=ids).logits, want, atol=1e-5, rtol=0)
    # Export fixes which keyword inputs exist: this graph was exported without attention_mask.
    with pytest.raises(ValueError, match="keyword mismatch"):
        graph(input_ids=IDS, attention_mask=torch.ones_like(IDS))


def test_bert_with_the_attention_mask_it_was_exported_with():
    model = bert()
    kwargs = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS)}
    s = fprune.structure.groups(model, (), kwargs)
    params = params_of(model)
    masks = fprune.group_structured(params, 0.5, s)
    graph = fprune.compact_graph(model, params, masks, s, (), kwargs)
    ids = torch.randint(0, 64, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    want = fprune.masked_call(model, params, masks, (), {"input_ids": ids, "attention_mask": mask})
    got = graph(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="keyword mismatch"):
        graph(input_ids=ids)  # ... and needs it: the module route does not (see the transformers tests)


def test_static_shapes_on_request_and_size_one_dims():
    case = next(c for c in TORCH_CASES if c.name == "conv2d")
    model, s, params, masks = prune(case)
    static = fprune.compact_graph(model, params, masks, s, case.example, dynamic_shapes=None)
    static(*case.example)
    with pytest.raises(Exception, match="Guard failed"):
        static(torch.randn(3, 3, 8, 8))
    # A dim of size 1 in the example stays static (export specializes it): batch 1 only.
    one = (case.example[0][:1],)
    graph = fprune.compact_graph(model, params, masks, s, one)
    graph(torch.randn(1, 3, 12, 12))  # the image size is still free
    with pytest.raises(Exception, match="Guard failed"):
        graph(torch.randn(2, 3, 8, 8))


def test_graph_modules_are_not_ordinary_models():
    # What the module route adds: the graph route's GraphModule has no train/eval and does not
    # pickle; torch.export.save is its format (tests/structure/test_structure_groups.py saves and loads it).
    case = TORCH_CASES[0]
    model, s, params, masks = prune(case)
    graph = fprune.compact_graph(model, params, masks, s, case.example)
    with pytest.raises(NotImplementedError):
        graph.train()
    small = fprune.compact(model, params, masks, s, case.example)
    assert small.train() is small


def test_a_model_export_cannot_trace_with_dynamic_sizes_is_exported_at_the_example_shapes():
    class StaticOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

        def forward(self, x):
            if isinstance(x.shape[0], torch.SymInt):
                raise RuntimeError("this model needs static shapes")
            return self.b(torch.relu(self.a(x)))

    x = torch.randn(3, 4)
    model, s, params, masks = prune(StaticOnly().eval(), (x,))
    with pytest.warns(UserWarning, match="could not make the input sizes dynamic .* static shapes"):
        graph = fprune.compact_graph(model, params, masks, s, (x,))
    torch.testing.assert_close(graph(x), fprune.masked_call(model, params, masks, (x,)), atol=1e-6, rtol=0)
    with pytest.raises(Exception, match="Guard failed"):
        graph(torch.randn(5, 4))
    small = fprune.compact(model, params, masks, s, (x,))
    assert small(torch.randn(5, 4)).shape == (5, 2)


def test_tensors_through_var_keyword_inputs_keep_the_example_shapes_with_a_warning():
    class Extra(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

        def forward(self, x, **extra):
            return self.b(torch.relu(self.a(x)) * extra["gate"])

    x, gate = torch.randn(3, 4), torch.rand(3, 1)
    model, s, params, masks = prune(Extra().eval(), (x,), {"gate": gate})
    with pytest.warns(UserWarning, match=r"extra\['gate'\] goes through \*\*extra of Extra.forward"):
        graph = fprune.compact_graph(model, params, masks, s, (x,), {"gate": gate})
    want = fprune.masked_call(model, params, masks, (x,), {"gate": gate})
    torch.testing.assert_close(graph(x, gate=gate), want, atol=1e-6, rtol=0)
    small = fprune.compact(model, params, masks, s, (x,), {"gate": gate})
    assert small(torch.randn(5, 4), gate=torch.rand(5, 1)).shape == (5, 2)
