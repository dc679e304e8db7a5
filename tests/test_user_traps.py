"""Regression tests for traps a new user hit (the `review` round): each test is a bug that was
silently wrong or crashed with an unclear message, against a plain reference where one applies."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import fprune
from fprune.select import Global


# ---------------------------------------------------------------------------------------------
# group_structured(scope=Global()) emptying a whole group; compact of such masks


class _Res(nn.Module):
    """A conv stem, a residual block, a strided conv and a head; BatchNorm in eval mode."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.c1 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(16)
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(x + self.b1(self.c1(x)))
        return self.fc(torch.relu(self.down(x)).mean((2, 3)))


def _res_setup():
    torch.manual_seed(0)
    net = _Res().eval()
    x = torch.randn(2, 3, 8, 8)
    s = fprune.structure.groups(net, (x,))
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    params["down.weight"] *= 1e-3  # the down group's 32 channels score lowest
    params["down.bias"] *= 1e-3
    return net, x, s, params


def test_global_group_structured_warns_at_caller_when_a_group_is_emptied():
    net, x, s, params = _res_setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        masks = fprune.group_structured(params, 0.7, s, scope=Global())
    assert not masks["down.weight"].any() and masks["stem.weight"].any()
    collapse = [w for w in caught if issubclass(w.category, fprune.select.LayerCollapseWarning)]
    assert len(collapse) == 1 and collapse[0].filename == __file__
    assert "down.weight:0" in str(collapse[0].message) and "min_keep=" in str(collapse[0].message)


def test_compact_of_an_emptied_group_raises_clearly_instead_of_not_shrinking():
    # Before: compact silently kept the emptied group at full size (all zeros): no speedup.
    net, x, s, params = _res_setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        masks = fprune.group_structured(params, 0.7, s, scope=Global())
    with pytest.raises(ValueError, match="remove every channel along .*min_keep="):
        fprune.compact(net, params, masks, s, (x,))
    with pytest.raises(ValueError, match="remove every channel along .*min_keep="):
        fprune.compact_graph(net, params, masks, s, (x,))


def test_group_structured_global_min_keep_floor_and_exact_count():
    net, x, s, params = _res_setup()
    chosen = [g for g in s.groups if g.prunable and g.exact]
    total = sum(g.size for g in chosen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no collapse warning with the floor
        masks = fprune.group_structured(params, 0.7, s, scope=Global(min_keep=2))
    kept = {}
    for g in chosen:
        m = g.members[0]
        mask = masks[m.param].movedim(m.dim, 0)
        kept[g.name] = int(mask.reshape(mask.shape[0], -1).any(1).sum())
    assert all(k >= 2 for k in kept.values())
    assert total - sum(kept.values()) == round(0.7 * total)
    small = fprune.compact(net, params, masks, s, (x,))
    assert torch.allclose(small(x), fprune.masked_call(net, params, masks, (x,)), atol=1e-5)
    assert small.down.weight.shape[0] == kept["down.weight:0"]


def test_group_structured_min_keep_needs_global_scope():
    net, x, s, params = _res_setup()
    with pytest.raises(ValueError, match="min_keep works with a Global scope only"):
        fprune.group_structured(params, 0.5, s, min_keep=1)
    with pytest.raises(ValueError, match="min_keep"):
        fprune.group_structured(params, 0.5, s, scope=Global(min_keep=-1))


# ---------------------------------------------------------------------------------------------
# Scores with buffers in params (the {**params, **buffers} dict that masked_call takes)


def _bn_net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 2)).eval()
    params = {k: v.detach() for k, v in net.named_parameters()}
    return net, params, {**params, **dict(net.named_buffers())}


@pytest.mark.parametrize("score", ["snip", "fisher", "obd", "grasp"])
def test_gradient_scores_name_an_integer_leaf(score):
    # Before: RuntimeError "only Tensors of floating point dtype can require gradients".
    net, params, with_buffers = _bn_net()
    batch = (torch.randn(3, 3, 6, 6), torch.tensor([0, 1, 0]))
    loss_fn = lambda p, b: nn.functional.cross_entropy(torch.func.functional_call(net, p, (b[0],)), b[1])
    fn = getattr(fprune.scores, score)
    with pytest.raises(TypeError, match=r"params\['1.num_batches_tracked'\].*Leave buffers out"):
        fn(loss_fn, with_buffers, [batch])
    assert fn(loss_fn, params, [batch]).keys() == params.keys()


def test_synflow_names_a_buffer_in_params():
    # Before: RuntimeError from native_batch_norm about running_mean requiring grad.
    net, params, with_buffers = _bn_net()
    with pytest.raises(ValueError, match=r"params\['1.running_mean'\] is a buffer"):
        fprune.scores.synflow(net, with_buffers, torch.randn(1, 3, 6, 6))
    with pytest.raises(ValueError, match=r"params\['nope'\] is not a parameter"):
        fprune.scores.synflow(net, {"nope": torch.ones(1)}, torch.randn(1, 3, 6, 6))
    assert fprune.scores.synflow(net, params, torch.randn(1, 3, 6, 6)).keys() == params.keys()


def test_group_structured_global_traces_with_min_keep():
    net, x, s, params = _res_setup()
    want = fprune.group_structured(params, 0.5, s, scope=Global(min_keep=2))
    compiled = torch.compile(
        lambda p: fprune.group_structured(p, 0.5, s, scope=Global(min_keep=2)),
        fullgraph=True, backend="eager",
    )
    got = compiled(params)
    assert all(torch.equal(got[k], want[k]) for k in want)
    stacked = {k: torch.stack([v, v]) for k, v in params.items()}
    batched = torch.func.vmap(lambda p: fprune.group_structured(p, 0.5, s, scope=Global(min_keep=2)))(stacked)
    assert all(torch.equal(batched[k][1], want[k]) for k in want)


def test_iterative_count_error_names_params_and_the_limit():
    # Before: torch.nn.utils.prune's wording ("should be smaller than ... to prune=3"), no place.
    params = {"w": torch.arange(1.0, 4.0), "b": torch.ones(2)}
    score_fn = lambda m: fprune.scores.magnitude(params, masks=m)
    with pytest.raises(ValueError, match=r"amount=4 is more than the 3 parameters left to prune in params"):
        fprune.iterative(score_fn, params, 4, rounds=2, where=lambda name, p: name == "w")
    masks = fprune.iterative(score_fn, params, 3, rounds=2, where=lambda name, p: name == "w")
    assert not masks["w"].any() and masks["b"].all()


# ---------------------------------------------------------------------------------------------
# apply_masks / masked_call with masks on another device


def test_apply_masks_names_a_mask_on_another_device():
    # Before: torch's "Tensor on device cpu is not on the expected device meta!" (no leaf named).
    params = {"w": torch.randn(3), "b": torch.randn(2)}
    masks = {"w": torch.ones(3, dtype=torch.bool, device="meta")}
    with pytest.raises(ValueError, match=r"masks\['w'\] on the device of params\['w'\], cpu, got meta"):
        fprune.apply_masks(params, masks)
    with pytest.raises(ValueError, match=r"masks\['w'\] on the device"):
        fprune.apply_masks({"w": params["w"].to("meta")}, {"w": torch.ones(3, dtype=torch.bool)})
    lin = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"masks\['weight'\] on the device"):
        fprune.masked_call(lin, dict(lin.named_parameters()), {"weight": torch.ones(2, 3, device="meta")}, (torch.ones(1, 3),))
    # A CPU 0-dim mask is a scalar operand: accepted as torch accepts it.
    scalar = {"t": torch.tensor(2.0, device="meta")}
    assert fprune.apply_masks(scalar, {"t": torch.tensor(True)})["t"].device.type == "meta"


# ---------------------------------------------------------------------------------------------
# Wanda calibration on torch's own transformer layers


def test_input_norms_warns_for_layers_that_got_no_input():
    # Before: nn.MultiheadAttention's out_proj silently had no norms (wanda fell back to |W|).
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    params = {k: v.detach() for k, v in enc.named_parameters()}
    with pytest.warns(UserWarning, match=r"'self_attn.out_proj.weight'.*\|W\| alone") as record:
        norms = fprune.calibration.input_norms(enc, params, [torch.randn(2, 5, 16)])
    assert record[0].filename == __file__
    assert sorted(norms) == ["linear1.weight", "linear2.weight"]
    scores = fprune.scores.wanda(params, norms)
    assert torch.equal(scores["self_attn.out_proj.weight"], params["self_attn.out_proj.weight"].abs())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # leaving it out with where= silences it
        fprune.calibration.input_norms(enc, params, [torch.randn(2, 5, 16)],
                                       where=lambda name, p: "out_proj" not in name)


# ---------------------------------------------------------------------------------------------
# fprune.structure on a token-mixing linear layer (MLP-Mixer)


class _Mixer(nn.Module):
    def __init__(self, tokens=5, ch=8):
        super().__init__()
        self.emb = nn.Linear(4, ch)
        self.ln1 = nn.LayerNorm(ch)
        self.t1 = nn.Linear(tokens, 16)
        self.t2 = nn.Linear(16, tokens)
        self.ln2 = nn.LayerNorm(ch)
        self.c1 = nn.Linear(ch, 12)
        self.c2 = nn.Linear(12, ch)
        self.head = nn.Linear(ch, 3)

    def forward(self, x):
        h = self.emb(x)
        h = h + self.t2(torch.relu(self.t1(self.ln1(h).transpose(1, 2)))).transpose(1, 2)
        h = h + self.c2(torch.relu(self.c1(self.ln2(h))))
        return self.head(h.mean(1))


def test_token_mixing_linear_is_not_merged_into_one_prunable_group():
    # Before: a linear layer over a transposed activation merged every channel of its input
    # with every one of its input columns: one "prunable, exact" group of 1 channel covering
    # whole layers (pruning it zeroed them), and the token MLP's hidden width was lost.
    torch.manual_seed(0)
    net = _Mixer().eval()
    x = torch.randn(2, 5, 4)
    s = fprune.structure.groups(net, (x,))
    by_name = {g.name: g for g in s.groups}
    prunable = {g.name: g.size for g in s.groups if g.prunable}
    assert prunable == {"t1.weight:0": 16, "c1.weight:0": 12}
    assert "token-mixing" in by_name["t1.weight:1"].reason  # the token dim: fixed by the input
    params = {k: v.detach() for k, v in net.named_parameters()}
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact(net, params, masks, s, (x,))
    assert small.t1.weight.shape == (8, 5) and small.c1.weight.shape == (6, 8)
    assert torch.allclose(small(x), fprune.masked_call(net, params, masks, (x,)), atol=1e-5)


def test_transposed_features_into_a_linear_are_unprunable():
    class Perm(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 6)
            self.b = nn.Linear(5, 3)

        def forward(self, x):  # a's 6 features become b's batch dim; b mixes the 5 positions
            return self.b(self.a(x).transpose(-1, -2))

    s = fprune.structure.groups(Perm().eval(), (torch.randn(2, 5, 4),))
    assert not any(g.prunable for g in s.groups)
    assert all(g.size > 1 for g in s.groups)


def test_compact_torch_transformer_encoder_layer_heads():
    # Before: groups() found the heads "prunable, exact" but compact failed: "unflatten: Provided
    # sizes [3, 16] don't multiply up" (nn.MultiheadAttention unflattens its packed q/k/v).
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 5, 16)
    s = fprune.structure.groups(enc, (x,))
    heads = [g for g in s.groups if g.kind == "head"]
    assert len(heads) == 1 and heads[0].prunable and heads[0].exact and heads[0].size == 4
    params = {k: v.detach() for k, v in enc.named_parameters()}
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact_graph(enc, params, masks, s, (x,))
    assert small.get_parameter("self_attn.in_proj_weight").shape == (24, 16)  # 2 of 4 heads, q, k and v
    assert small.get_parameter("self_attn.out_proj.weight").shape == (16, 8)
    assert small.get_parameter("linear1.weight").shape == (16, 16)
    assert torch.allclose(small(x), fprune.masked_call(enc, params, masks, (x,)), atol=1e-5)


def test_compact_refuses_a_partial_mask_dict_that_it_would_not_match():
    # Before: masks for a conv weight only (its bias left out) were compacted silently, and the
    # compact model differed from masked_call (the kept bias of a removed channel fed conv 2).
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    x = torch.randn(1, 3, 8, 8)
    s = fprune.structure.groups(net, (x,))
    params = {k: v.detach() for k, v in net.named_parameters()}
    weight_only = {"0.weight": fprune.ln_structured({"w": params["0.weight"]}, 0.5, 2, 0)["w"]}
    with pytest.raises(ValueError, match=r"no mask for its member '0\.bias'"):
        fprune.compact(net, params, weight_only, s, (x,))
    with pytest.raises(ValueError, match=r"'0\.bias'.*which params leaves out"):
        fprune.compact(net, {"0.weight": params["0.weight"]}, weight_only, s, (x,))
    masks = fprune.group_structured(params, 0.5, s)
    small = fprune.compact(net, params, masks, s, (x,))
    assert torch.allclose(small(x), fprune.masked_call(net, params, masks, (x,)), atol=1e-6)


@pytest.mark.parametrize("score", ["snip", "fisher", "grasp"])
def test_gradient_scores_explain_batchnorm_in_training_mode(score):
    # Before: torch.func's "attempted to call in-place operation ... that would mutate a
    # captured Tensor", with no word about BatchNorm or what to do.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    params = {k: v.detach() for k, v in net.named_parameters()}
    batch = (torch.randn(3, 3, 6, 6), torch.tensor([0, 1, 0]))
    loss_fn = lambda p, b: nn.functional.cross_entropy(torch.func.functional_call(net, p, (b[0],)), b[1])
    with pytest.raises(RuntimeError, match=rf"^{score}: loss_fn updates a tensor .* model\.eval\(\)"):
        getattr(fprune.scores, score)(loss_fn, params, [batch])
    net.eval()
    assert getattr(fprune.scores, score)(loss_fn, params, [batch]).keys() == params.keys()


def test_group_structured_global_min_keep_equals_a_greedy_reference():
    # A plain reference: channel score = sum over the group's members in params of the squared
    # entries of the channel's slices; walk all channels lowest first (ties: groups in sorted
    # name order, then channel index), skipping a group once it is down to min_keep.
    net, x, s, params = _res_setup()
    chosen = sorted((g for g in s.groups if g.prunable and g.exact), key=lambda g: g.name)
    order = []
    for g in chosen:
        score = torch.zeros(g.size, dtype=torch.float64)
        for m in g.members:
            if m.param in params:
                slices = params[m.param].movedim(m.dim, 0)[m.index].reshape(g.size, -1)
                score += slices.double().square().sum(1)
        order += [(float(score[c]), g.name, c) for c in range(g.size)]
    rank = {g.name: i for i, g in enumerate(chosen)}
    order.sort(key=lambda t: (t[0], rank[t[1]], t[2]))
    for amount, floor in [(0.7, 2), (0.8, 3), (0.5, 0.25), (0.6, 0.4)]:
        total = sum(g.size for g in chosen)
        left = {g.name: g.size for g in chosen}
        minimum = {g.name: floor if isinstance(floor, int) else round(floor * g.size) for g in chosen}
        pruned, count = set(), round(amount * total)
        for score, name, c in order:
            if len(pruned) == count:
                break
            if left[name] > minimum[name]:
                pruned.add((name, c))
                left[name] -= 1
        masks = fprune.group_structured(params, amount, s, scope=Global(min_keep=floor))
        for g in chosen:
            m = g.members[0]
            alive = masks[m.param].movedim(m.dim, 0)[m.index].reshape(g.size, -1).any(1)
            assert {c for c in range(g.size) if not alive[c]} == {c for n, c in pruned if n == g.name}


# ---------------------------------------------------------------------------------------------
# masked_call with both names of a tied weight


def test_masked_call_names_two_keys_of_one_tied_weight():
    # Before: functional_call's "got multiple values for keys ... which are tied. Consider using
    # tie_weights=False", advice that silently unties the weight (each use its own mask).
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    torch.manual_seed(0)
    net, x = Tied(), torch.randn(2, 4)
    both = {k: v.detach() for k, v in net.named_parameters(remove_duplicate=False)}
    masks = fprune.global_unstructured(both, 0.5)
    with pytest.raises(ValueError, match=r"both 'a\.weight' and 'b\.weight'.*keep one"):
        fprune.masked_call(net, both, masks, (x,))
    same = dict(net.named_parameters(remove_duplicate=False))  # one tensor object, unmasked: fine
    assert fprune.masked_call(net, same, {}, (x,)).shape == (2, 4)
    one = {k: v.detach() for k, v in net.named_parameters()}
    m1 = fprune.global_unstructured(one, 0.5, where=lambda name, p: p.dim() > 1)
    w = one["a.weight"] * m1["a.weight"]
    want = nn.functional.linear(nn.functional.linear(x, w, one["a.bias"]), w, one["b.bias"])
    assert torch.allclose(fprune.masked_call(net, one, m1, (x,)), want, atol=1e-6)
