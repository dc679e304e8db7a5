"""fprune.scores: each score against a plain reference written here (autograd on a copy of the
model, per-example loops, the in-place SynFlow recipe), on models with BatchNorm, tied weights
and prior masks; purity; vmap and torch.compile; bad input."""

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call, stack_module_state, vmap

import fprune
from fprune import scores


class Tied(torch.nn.Module):
    """A tiny language-model-like net whose head shares the embedding's weight (as GPT-2)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 6)
        self.hidden = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.hidden(self.emb(tokens)))).mean(1)


def bn_net(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )
    with torch.no_grad():  # non-trivial running statistics
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
    return net


def bn_data(seed=1, n=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def tied_data(seed=1, n=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 10, (n, 4), generator=g), torch.randint(0, 10, (n,), generator=g)


CASES = {
    "bn": (bn_net, bn_data, (7, 3)),
    "tied": (lambda: (torch.manual_seed(0), Tied())[1], tied_data, (4, 1)),
}


def make_case(name, train=True, dtype=torch.float32):
    build, data, (n, _) = CASES[name]
    model = build().to(dtype)
    model.train(train)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    batches = [data(seed=1, n=n), data(seed=2, n=n)]
    batches = [(x.to(dtype) if x.is_floating_point() else x, y) for x, y in batches]
    # Prior masks on some weights (for "tied", on the shared embedding too).
    gen = torch.Generator().manual_seed(3)
    masks = {k: torch.rand(v.shape, generator=gen) > 0.3 for k, v in params.items() if v.dim() > 1}
    return model, params, batches, masks


def loss_fn_for(model):
    buffers = dict(model.named_buffers())

    def loss_fn(p, batch):
        x, y = batch
        # Cloned buffers: BatchNorm in train mode updates them in place, inside the function.
        state = {**{k: b.clone() for k, b in buffers.items()}, **p}
        return F.cross_entropy(functional_call(model, state, (x,)), y)

    return loss_fn


def ref_copy(model, params, masks):
    """A deepcopy whose parameters hold the pruned weights (the tie survives the deepcopy)."""
    twin = copy.deepcopy(model)
    named = dict(twin.named_parameters())
    with torch.no_grad():
        for k, v in params.items():
            named[k].copy_(v * masks[k] if k in masks else v)
    return twin, named


def ones(masks, k, like):
    return masks[k].to(like.dtype) if k in masks else torch.ones_like(like)


def ref_grad(model, params, masks, batches, create_graph=False):
    """Gradient of p -> sum_b loss(p * m): the gradient at the pruned weights, times the mask."""
    twin, named = ref_copy(model, params, masks)
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for x, y in batches:
        loss = F.cross_entropy(twin(x), y)
        gs = torch.autograd.grad(loss, [named[k] for k in params], create_graph=create_graph)
        for k, g in zip(params, gs, strict=True):
            total[k] = total[k] + g * ones(masks, k, g)
    return total, twin, named


def close(a, b, **kw):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k].to(a[k].dtype), **kw, msg=lambda m, *, k=k: f"{k}: {m}")


@pytest.mark.parametrize("case", ["bn", "tied"])
@pytest.mark.parametrize("masked", [False, True])
def test_snip_against_autograd(case, masked):
    model, params, batches, masks = make_case(case)
    masks = masks if masked else {}
    got = scores.snip(loss_fn_for(model), params, iter(batches), masks=masks or None)
    g, _, _ = ref_grad(model, params, masks, batches)
    want = {k: (g[k] * params[k] * ones(masks, k, g[k])).abs() for k in params}
    close(got, want)
    for k, m in masks.items():
        assert (got[k][~m] == 0).all()


@pytest.mark.parametrize("case", ["bn", "tied"])
@pytest.mark.parametrize("masked", [False, True])
def test_grasp_against_create_graph(case, masked):
    # float64: BatchNorm makes the first bias's curvature ~0, float32 noise would dominate it.
    model, params, batches, masks = make_case(case, dtype=torch.float64)
    masks = masks if masked else {}
    got = scores.grasp(loss_fn_for(model), params, (b for b in batches), masks=masks or None)
    # As the reference code does: g without a graph, then backward of g . grad(create_graph).
    g, twin, named = ref_grad(model, params, masks, batches)
    hg = {k: torch.zeros_like(v) for k, v in params.items()}
    for x, y in batches:
        loss = F.cross_entropy(twin(x), y)
        gs = torch.autograd.grad(loss, [named[k] for k in params], create_graph=True)
        dot = sum((gi * ones(masks, k, gi) * g[k]).sum() for k, gi in zip(params, gs, strict=True))
        for k, h in zip(params, torch.autograd.grad(dot, [named[k] for k in params]), strict=True):
            hg[k] = hg[k] + h * ones(masks, k, h)
    want = {k: params[k] * ones(masks, k, params[k]) * hg[k] for k in params}
    close(got, want)
    assert any((v < 0).any() for v in got.values())  # signed


@pytest.mark.parametrize("case", ["bn", "tied"])
@pytest.mark.parametrize("masked", [False, True])
def test_fisher_and_obd_against_per_example_loop(case, masked):
    model, params, batches, masks = make_case(case, train=False)  # eval mode: BatchNorm
    masks = masks if masked else {}
    loss_fn = loss_fn_for(model)
    got = scores.fisher(loss_fn, params, batches, masks=masks or None)
    got_obd = scores.obd(loss_fn, params, batches, masks=masks or None)
    twin, named = ref_copy(model, params, masks)
    want = {k: torch.zeros_like(v) for k, v in params.items()}
    for x, y in batches:
        for i in range(x.shape[0]):
            loss = F.cross_entropy(twin(x[i : i + 1]), y[i : i + 1])
            for k, g in zip(params, torch.autograd.grad(loss, [named[k] for k in params]), strict=True):
                want[k] += (g * ones(masks, k, g)).square()
    close(got, want)
    close(got_obd, {k: 0.5 * want[k] * (params[k] * ones(masks, k, params[k])).square() for k in params})


def module_state(model):
    return (
        {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        [m.training for m in model.modules()],
        {k: p.requires_grad for k, p in model.named_parameters()},
    )


def assert_same_state(model, before):
    tensors, flags, requires = module_state(model)
    assert tensors.keys() == before[0].keys()
    for k in tensors:
        assert torch.equal(tensors[k], before[0][k]) and tensors[k].dtype == before[0][k].dtype, k
    assert flags == before[1] and requires == before[2]


def synflow_reference(model, masks, x):
    """Synaptic-Flow's recipe, in place on a deepcopy: abs_ over the state_dict, pruned weights
    zeroed, float64, eval mode, ones input, sum(output).backward(), |grad * p|."""
    twin = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        for v in twin.state_dict().values():
            v.abs_()
        named = dict(twin.named_parameters())
        for k, m in masks.items():
            named[k].mul_(m.double())
    ones = torch.ones(x.shape, dtype=torch.float64 if x.is_floating_point() else x.dtype)
    twin(ones).sum().backward()
    return {k: (p.grad * p).abs() for k, p in twin.named_parameters()}


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_synflow_against_in_place_recipe_and_module_untouched(train, masked):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 5),
    )
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        model[1].weight.uniform_(-1, 1)
    model.train(train)
    model[1].train(not train)  # mixed flags must come back as they were
    params = dict(model.named_parameters())  # requires_grad, as users pass them
    gen = torch.Generator().manual_seed(0)
    masks = (
        {k: torch.rand(v.shape, generator=gen) > 0.5 for k, v in params.items() if v.dim() > 1}
        if masked
        else {}
    )
    x = torch.randn(1, 2, 6, 6)
    before = module_state(model)
    got = scores.synflow(model, params, x, masks=masks or None)
    assert_same_state(model, before)
    assert all(v.dtype == torch.float64 and not v.requires_grad for v in got.values())
    close(got, synflow_reference(model, masks, x))


def test_synflow_tied_weights_and_partial_params():
    torch.manual_seed(0)
    model = Tied()
    tokens = torch.zeros(1, 4, dtype=torch.long)
    params = {k: v.detach() for k, v in model.named_parameters()}
    assert "head.weight" not in params  # listed once, as named_parameters does
    close(scores.synflow(model, params, tokens), synflow_reference(model, {}, tokens))
    # A part of the params: the rest are the module's own (abs, float64), not scored.
    part = scores.synflow(model, {"hidden.weight": params["hidden.weight"]}, tokens)
    assert part.keys() == {"hidden.weight"}
    torch.testing.assert_close(part["hidden.weight"], synflow_reference(model, {}, tokens)["hidden.weight"])


def test_synflow_is_exempt_from_compile():
    model = torch.nn.Linear(3, 2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    compiled = torch.compile(lambda p: scores.synflow(model, p, torch.ones(1, 3)), backend="eager")
    close(compiled(params), scores.synflow(model, params, torch.ones(1, 3)))


@pytest.mark.parametrize("name", ["snip", "fisher", "obd", "grasp"])
def test_gradient_scores_leave_module_and_inputs_untouched(name):
    model, _params, batches, masks = make_case("bn", train=name in ("snip", "grasp"))
    live = dict(model.named_parameters())  # requires_grad leaves
    before = module_state(model)
    saved = {k: v.clone() for k, v in masks.items()}
    out = getattr(scores, name)(loss_fn_for(model), live, batches, masks=masks)
    assert_same_state(model, before)
    assert all(torch.equal(masks[k], saved[k]) for k in masks)
    assert all(not v.requires_grad for v in out.values())
    assert all(p.grad is None for p in model.parameters())


GRADIENT_SCORES = [scores.snip, scores.fisher, scores.obd, scores.grasp]


@pytest.mark.parametrize("fn", GRADIENT_SCORES, ids=lambda f: f.__name__)
def test_vmap_over_stacked_models(fn):
    members = [bn_net(seed).eval() for seed in range(3)]
    stacked, _ = stack_module_state(members)
    stacked = {k: v.detach() for k, v in stacked.items()}
    loss_fn = loss_fn_for(members[0])
    batches = [bn_data(seed=1), bn_data(seed=2)]
    masks = {"0.weight": torch.rand(3, 8, 6, generator=torch.Generator().manual_seed(0)) > 0.5}
    got = vmap(lambda p, m: fn(loss_fn, p, batches, masks=m))(stacked, masks)
    for i in range(3):
        one = fn(
            loss_fn, {k: v[i] for k, v in stacked.items()}, batches, masks={"0.weight": masks["0.weight"][i]}
        )
        close({k: v[i] for k, v in got.items()}, one, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("fn", [scores.snip, scores.fisher, scores.grasp], ids=lambda f: f.__name__)
def test_compile_fullgraph(fn):  # obd is fisher's program plus one product
    model = bn_net().eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    loss_fn = loss_fn_for(model)
    batches = [bn_data(seed=1), bn_data(seed=2)]
    masks = {"3.weight": torch.rand(3, 8, generator=torch.Generator().manual_seed(0)) > 0.5}
    compiled = torch.compile(lambda p, m: fn(loss_fn, p, batches, masks=m), fullgraph=True, backend="eager")
    close(compiled(params, masks), fn(loss_fn, params, batches, masks=masks), rtol=1e-4, atol=1e-6)


def test_masks_select_with_global_unstructured():
    model, params, batches, _ = make_case("bn")
    s = scores.snip(loss_fn_for(model), params, batches)
    masks = fprune.global_unstructured(params, 0.5, importance_scores=s)
    flat = torch.cat([v.flatten() for v in s.values()])
    kept = torch.cat([masks[k].flatten() for k in s])
    assert flat[kept].min() >= flat[~kept].max()


def test_magnitude_and_wanda():
    params = {"fc.weight": torch.tensor([[1.0, -2.0], [-3.0, 4.0]]), "fc.bias": torch.tensor([-1.0, 0.5])}
    masks = {"fc.weight": torch.tensor([[True, False], [True, True]])}
    assert torch.equal(scores.magnitude(params)["fc.weight"], params["fc.weight"].abs())
    assert torch.equal(
        scores.magnitude(params, masks=masks)["fc.weight"], torch.tensor([[1.0, 0.0], [3.0, 4.0]])
    )
    norms = {"fc.weight": torch.tensor([[10.0, 0.1]])}
    w = scores.wanda(params, norms, masks=masks)
    assert torch.equal(w["fc.weight"], torch.tensor([[10.0, 0.0], [30.0, 0.4]]))
    assert torch.equal(w["fc.bias"], torch.tensor([1.0, 0.5]))
    # Column norms (transformers' Conv1D stores the weight transposed: norms shaped (in, 1)).
    w = scores.wanda(params, {"fc.weight": torch.tensor([[10.0], [0.1]])})
    assert torch.allclose(w["fc.weight"], torch.tensor([[10.0, 20.0], [0.3, 0.4]]))


def _vector_loss(p, b):
    return p["w"] * b


def _float_loss(p, b):
    return 1.0


@pytest.mark.parametrize("fn", GRADIENT_SCORES, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "loss_fn, params, batches, masks, error, words",
    [
        (_vector_loss, {"w": torch.ones(3)}, [torch.ones(2, 3)], None, ValueError, "0-dim"),
        (_float_loss, {"w": torch.ones(3)}, [torch.ones(2, 3)], None, TypeError, "0-dim tensor, got float"),
        (lambda p, b: p["w"].sum(), {"w": torch.ones(3)}, [], None, ValueError, "at least one batch"),
        (lambda p, b: p["w"].sum(), {"w": torch.ones(3)}, torch.ones(2, 3), None, TypeError, "iterable"),
        (lambda p, b: p["w"].sum(), {"w": torch.ones(3)}, 3, None, TypeError, "iterable"),
        (
            lambda p, b: p["w"].sum(),
            {"w": torch.ones(3)},
            {"x": torch.ones(2, 3)},
            None,
            TypeError,
            r"pass \[batch\]",
        ),
        (
            lambda p, b: p["w"].sum(),
            {"w": torch.ones(3)},
            [torch.ones(2, 3)],
            {"v": torch.ones(3, dtype=torch.bool)},
            ValueError,
            r"masks\['v'\]",
        ),
        (
            lambda p, b: p["w"].sum(),
            {"w": torch.ones(3)},
            [torch.ones(2, 3)],
            {"w": torch.ones(2, dtype=torch.bool)},
            ValueError,
            "shape",
        ),
        ("loss", {"w": torch.ones(3)}, [torch.ones(2, 3)], None, TypeError, "loss_fn"),
        (lambda p, b: p["w"].sum(), {"w": [1.0]}, [torch.ones(2, 3)], None, TypeError, r"params\['w'\]"),
    ],
)
def test_bad_input(fn, loss_fn, params, batches, masks, error, words):
    with pytest.raises(error, match=words):
        fn(loss_fn, params, batches, masks=masks)


def test_bad_input_synflow_and_wanda():
    model = torch.nn.Linear(3, 2)
    params = dict(model.named_parameters())
    with pytest.raises(TypeError, match="module"):
        scores.synflow("model", params, torch.ones(1, 3))
    with pytest.raises(TypeError, match="flat dict"):
        scores.synflow(model, [params["weight"]], torch.ones(1, 3))
    with pytest.raises(ValueError, match="not a parameter"):
        scores.synflow(model, {"fc.weight": params["weight"]}, torch.ones(1, 3))
    with pytest.raises(TypeError, match="example_inputs"):
        scores.synflow(model, params, [1, 2, 3])
    with pytest.raises(ValueError, match=r"input_norms\['fc.weight'\] names no leaf"):
        scores.wanda(params, {"fc.weight": torch.ones(1, 3)})
    with pytest.raises(ValueError, match="broadcast"):
        scores.wanda(params, {"weight": torch.ones(1, 2)})
    with pytest.raises(TypeError, match="dict"):
        scores.wanda(params, [torch.ones(1, 3)])


def test_scores_are_detached_when_loss_fn_closes_over_live_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    part = {"0.weight": model[0].weight.detach()}  # the rest: the module's own, requiring grad
    loss_fn = lambda p, b: functional_call(model, p, (b,)).square().mean()
    batch = torch.randn(5, 3)
    for fn in GRADIENT_SCORES:
        out = fn(loss_fn, part, [batch])
        assert out.keys() == {"0.weight"} and not out["0.weight"].requires_grad


def test_grasp_falls_back_to_reverse_over_reverse(monkeypatch):
    model, params, batches, masks = make_case("bn", dtype=torch.float64)
    loss_fn = loss_fn_for(model)
    want = scores.grasp(loss_fn, params, batches, masks=masks)

    def no_forward_ad(*args, **kwargs):
        raise NotImplementedError("Trying to use forward AD with some_op that does not support it")

    monkeypatch.setattr(scores, "jvp", no_forward_ad)
    close(scores.grasp(loss_fn, params, batches, masks=masks), want)


def test_gradient_scores_on_tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    # Eager attention: CPU flash attention (SDPA) has neither forward-mode nor double-backward
    # derivatives, which GraSP's Hessian-vector product needs.
    config = transformers.GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=8,
        vocab_size=50,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    ids = torch.randint(0, 50, (3, 6), generator=torch.Generator().manual_seed(0))
    loss_fn = lambda p, b: functional_call(model, p, (), {"input_ids": b, "labels": b}).loss
    before = module_state(model)
    for fn in GRADIENT_SCORES:
        out = fn(loss_fn, params, [ids])
        assert out.keys() == params.keys() and "lm_head.weight" not in out  # tied: scored once
        assert all(out[k].shape == params[k].shape and torch.isfinite(out[k]).all() for k in out)
    assert_same_state(model, before)


@settings(max_examples=15)
@given(cuts=st.lists(st.integers(1, 7), max_size=4, unique=True), seed=st.integers(0, 100))
def test_scores_do_not_depend_on_how_examples_are_split_into_batches(cuts, seed):
    # With a sum-reduced loss, gradients and Hessian-vector products add up over batches, and
    # Fisher sums over examples: any split of the same examples gives the same scores.
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 3, (8,))
    masks = {"0.weight": torch.rand(5, 4) > 0.3}
    loss_fn = lambda p, b: F.cross_entropy(functional_call(model, p, (b[0],)), b[1], reduction="sum")
    bounds = [0, *sorted(cuts), 8]
    split = [(x[a:b], y[a:b]) for a, b in itertools.pairwise(bounds)]
    for fn in GRADIENT_SCORES:
        whole = fn(loss_fn, params, [(x, y)], masks=masks)
        parts = fn(loss_fn, params, iter(split), masks=masks)
        close(parts, whole, rtol=1e-9, atol=1e-12)
        assert (whole["0.weight"][~masks["0.weight"]] == 0).all()
