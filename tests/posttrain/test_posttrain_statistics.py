"""Statistics as objects: partial sums that add across inputs (and ranks), tables shared by the
layers fed one input, float32 against float64 sums, and the methods naming their statistic."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fprune
from fprune import _observe
from fprune.calibration import Hessian, InputNorms, NoData
from fprune.oneshot import Refine, SparseGPT, Wanda
from posttrain_helpers import hessian_of
from test_posttrain_oneshot import calibration, llama


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**16))
def test_partial_sums_of_two_parts_add_entry_by_entry(rows_a, rows_b, features, seed):
    # What a sum across ranks relies on: the sums of disjoint inputs add to those of all rows.
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(rows_a, features, generator=g), torch.randn(rows_b, features, generator=g)
    for statistic in (Hessian(torch.float64), InputNorms()):
        whole, part_a, part_b = {}, {}, {}
        statistic.add(whole, torch.cat([a, b]))
        statistic.add(part_a, a)
        statistic.add(part_b, b)
        summed = {k: part_a[k] + part_b[k] for k in part_a}
        assert summed.keys() == whole.keys()
        for k in whole:
            torch.testing.assert_close(summed[k], whole[k], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(
            statistic.finish(summed, torch.float64), statistic.finish(whole, torch.float64)
        )


def test_float32_and_float64_hessians_against_a_float64_reference():
    # 8 batches of 128 unit-variance rows: the float32 sums differ from float64 ones by about
    # 2e-7 of the largest entry (1.5e-7 to 2.4e-7 over seeds 0-2 and widths 64 and 512).
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(128, 64, generator=g) for _ in range(8)]
    want = hessian_of(torch.cat(xs))
    for accumulate, bound in ((torch.float32, 1e-6), (torch.float64, 1e-14)):
        sums = {}
        for x in xs:
            Hessian(accumulate).add(sums, x)
        assert sums["xtx"].dtype == accumulate and int(sums["rows"]) == 1024
        got = Hessian(accumulate).finish(sums, accumulate)  # the sums' own precision
        assert got.dtype == accumulate
        error = float((got.double() - want).abs().max() / want.abs().max())
        assert error < bound and (accumulate == torch.float64 or error > 0)


def test_sparsegpt_accumulating_in_float64_is_close_to_float32():
    model, _ = llama()
    params = dict(model.named_parameters())
    batches = calibration(n=1)
    a, ma = fprune.oneshot.prune(model, params, batches, 0.5, method=SparseGPT())
    b, mb = fprune.oneshot.prune(model, params, batches, 0.5, method=SparseGPT(accumulate=torch.float64))
    assert SparseGPT(accumulate=torch.float64).statistic == Hessian(torch.float64)
    agree = sum(int((ma[k] == mb[k]).sum()) for k in ma) / sum(m.numel() for m in ma.values())
    assert agree > 0.99  # the masks may differ only where two scores are within rounding
    for k in ma:
        if torch.equal(ma[k], mb[k]):
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"torch\.float32 or torch\.float64, got torch\.float16"):
        SparseGPT(accumulate=torch.float16)


def llama_block_tables(model):
    layers = _observe.linear_layers(model.model.layers[0], {}, None)
    sums = _observe.Accumulator(Hessian(torch.float64))
    block = model.model.layers[0]
    params = dict(block.named_parameters())
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    rows = {layer.name: [] for layer in layers}

    def record(name):
        return lambda module, args: rows[name].append(args[0].reshape(-1, args[0].shape[-1]))

    handles = [layer.module.register_forward_pre_hook(record(layer.name)) for layer in layers]
    position = model.model.rotary_emb(x, torch.arange(5)[None])
    try:
        with torch.no_grad(), _observe.observing(layers, sums):
            for _ in range(2):
                torch.func.functional_call(block, params, (x,), {"position_embeddings": position})
    finally:
        for h in handles:
            h.remove()
    return sums, rows


def test_layers_fed_one_input_share_one_table_and_each_gets_its_own_hessian():
    model, _ = llama()
    sums, rows = llama_block_tables(model)
    tables = sums.tables()
    groups = sorted(sorted(n for n, t in sums.sums.items() if t is table) for table in tables)
    assert groups == [
        ["mlp.down_proj.weight"],
        ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
        ["self_attn.k_proj.weight", "self_attn.q_proj.weight", "self_attn.v_proj.weight"],
        ["self_attn.o_proj.weight"],
    ]
    q = sums.finish("self_attn.q_proj.weight", torch.float64)
    k = sums.finish("self_attn.k_proj.weight", torch.float64)
    assert k is q  # finished once, shared (a method must not modify it)
    v = sums.finish("self_attn.v_proj.weight", torch.float64, copy=True)
    assert v is not q and torch.equal(v, q)
    for name in ("self_attn.q_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"):
        got = q if name.startswith("self_attn.q") else sums.finish(name, torch.float64)
        torch.testing.assert_close(got, hessian_of(torch.cat(rows[name])), rtol=1e-12, atol=1e-12)


class Parting(torch.nn.Module):
    """``a`` and ``b`` read the same input on the first call, then different ones."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)

    def forward(self, x, part=False):
        return self.a(x) + self.b(x * 2 if part else x)


def test_a_layer_whose_inputs_part_from_the_others_gets_its_own_sums():
    model = Parting()
    xs = [torch.randn(4, 3), torch.randn(5, 3), torch.randn(2, 3)]
    got = fprune.calibration.hessians(model, {}, [(xs[0],), (xs[1], True), (xs[2],)])
    torch.testing.assert_close(got["a.weight"].double(), hessian_of(torch.cat(xs)), rtol=1e-5, atol=1e-6)
    want_b = hessian_of(torch.cat([xs[0], 2 * xs[1], xs[2]]))
    torch.testing.assert_close(got["b.weight"].double(), want_b, rtol=1e-5, atol=1e-6)


def test_wanda_is_scores_wanda_then_rows():
    g = torch.Generator().manual_seed(0)
    weight, norms = torch.randn(6, 8, generator=g), torch.rand(1, 8, generator=g)
    new, keep = Wanda().prune_layer(weight, norms, 0.25)
    scores = fprune.scores.wanda({"w": weight}, {"w": norms})
    want = fprune.select.select(scores, 0.25, scope=fprune.select.Rows(0))["w"]
    assert torch.equal(keep, want) and torch.equal(new, weight * want)


def test_refine_accumulates_its_hessian_and_the_method_statistic_in_one_pass():
    assert Refine(SparseGPT()).statistic == Hessian()
    joint = Refine(Wanda()).statistic
    x = torch.randn(7, 4)
    sums = {}
    joint.add(sums, x)
    hessian, norms = joint.finish(sums, torch.float32)
    torch.testing.assert_close(hessian.double(), hessian_of(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norms, x.norm(dim=0).view(1, -1))
    assert Refine("magnitude").statistic.parts == (Hessian(), NoData())
    assert not NoData().needs_data


def test_a_method_statistic_that_is_not_one_is_refused():
    class Bad(fprune.oneshot.LayerMethod):
        statistic = "gram"

    model, _ = llama()
    with pytest.raises(TypeError, match=r"method\.statistic to be a fprune\.calibration\.Statistic.*'gram'"):
        fprune.oneshot.prune(model, {}, calibration(), 0.5, method=Bad())
