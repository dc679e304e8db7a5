"""``amount``: counts of tensor amounts equal Python floats', validation eager and traced, compile.

Three rules: a changing Python float under ``torch.compile(fullgraph=True)`` compiles without a
graph break or a recompile per value; tensor amounts are validated eagerly and clamped under
transforms; a float32 tensor amount prunes the count of the same Python float, ``.5``
boundaries included.
"""

import math

import pytest
import torch
import torch._dynamo.testing
from hypothesis import given
from hypothesis import strategies as st
from torch.func import vmap

import fprune
from fprune import _amount

FUNCTIONS = {
    "l1": lambda p, a: fprune.l1_unstructured(p, a),
    "global": lambda p, a: fprune.global_unstructured(p, a),
    "random": lambda p, a: fprune.random_unstructured(p, a, generator=3),
    "ln": lambda p, a: fprune.ln_structured(p, a, 2, 0),
}


def _pruned(masks):
    return sum(int((~m).sum()) for m in masks.values())


def _params(n, seed=0):
    return {"w": torch.randn(n, generator=torch.Generator().manual_seed(seed))}


# ---- 1. a changing Python float under torch.compile(fullgraph=True) ----------------------------


def test_compiled_mask_computation_takes_a_changing_float_without_recompiling_per_value():
    torch._dynamo.reset()
    params = {"a": torch.randn(10), "b": torch.randn(15)}
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(lambda p, a: fprune.global_unstructured(p, a), fullgraph=True, backend=counter)
    for amount in (0.5, 0.6, 0.7, 0.3, 0.1, 0.0, 1.0):
        got, want = compiled(params, amount), fprune.global_unstructured(params, amount)
        assert all(torch.equal(got[k], want[k]) for k in params), amount
    # The first call specializes on 0.5; the second makes the float a graph input; no more.
    assert counter.frame_count == 2


def test_compiled_local_and_structured_calls_take_a_changing_float():
    torch._dynamo.reset()
    params = {"w": torch.randn(6, 5)}
    for name in ("l1", "ln", "random"):
        fn = FUNCTIONS[name]
        compiled = torch.compile(fn, fullgraph=True, backend="eager")
        for amount in (0.5, 0.3, 0.9):
            assert torch.equal(compiled(params, amount)["w"], fn(params, amount)["w"]), (name, amount)


def test_bad_float_under_compile_without_fullgraph_raises_the_eager_error():
    torch._dynamo.reset()
    compiled = torch.compile(lambda p, a: fprune.global_unstructured(p, a), backend="eager")
    params = {"w": torch.randn(8)}
    compiled(params, 0.5), compiled(params, 0.25)
    for bad in (1.5, -0.5, math.nan):
        with pytest.raises(ValueError, match="amount="):
            compiled(params, bad)


# ---- 2. tensor amounts: validated eagerly, clamped under transforms ---------------------------


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("bad", [1.5, -0.1, math.nan, math.inf])
def test_eager_tensor_amount_out_of_range_raises(name, bad):
    params = {"w": torch.randn(6, 4)}
    with pytest.raises(ValueError, match=r"amount=.*\(a tensor\) should be a fraction in the range \[0, 1\]"):
        FUNCTIONS[name](params, torch.tensor(bad))


def test_eager_tensor_amount_is_read_once_per_call_not_per_leaf(monkeypatch):
    reads = []
    original = torch.Tensor.__bool__

    def counting_bool(self):
        reads.append(1)
        return original(self)

    params = {f"w{i}": torch.randn(5) for i in range(6)}
    amount = torch.tensor(0.4)
    monkeypatch.setattr(torch.Tensor, "__bool__", counting_bool)
    fprune.l1_unstructured(params, amount)
    monkeypatch.undo()
    assert len(reads) == 1


@pytest.mark.parametrize("name", ["l1", "global", "random"])
def test_tensor_amounts_under_vmap_are_clamped_and_nan_prunes_nothing(name):
    params = _params(10)
    levels = torch.tensor([-0.5, 0.0, 0.35, 1.0, 1.5, math.nan, math.inf, -math.inf])
    masks = vmap(lambda a: FUNCTIONS[name](params, a))(levels)
    pruned = (~masks["w"]).sum(1).tolist()
    assert pruned == [0, 0, 4, 10, 10, 0, 10, 0]  # 0.35 * 10 = 3.5 -> 4 (half to even)


def test_tensor_amount_under_compile_is_clamped():
    torch._dynamo.reset()
    params = _params(10)
    compiled = torch.compile(lambda p, a: fprune.global_unstructured(p, a), fullgraph=True, backend="eager")
    for value, pruned in ((0.3, 3), (1.5, 10), (-1.0, 0), (math.nan, 0)):
        assert _pruned(compiled(params, torch.tensor(value))) == pruned, value


def test_count_amounts_under_vmap_never_exceed_what_remains():
    # An int count with prior masks under vmap: the remaining size is a tensor; prune at most it.
    params = _params(6)
    prior = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
    masks = vmap(lambda m: fprune.l1_unstructured(params, 4, masks=m))({"w": prior})
    assert (~masks["w"]).sum(1).tolist() == [4, 6]


# ---- 3. a float32 tensor amount gives the count of the same Python float ----------------------


@pytest.mark.parametrize(
    "amount, n, count",
    [
        (0.3, 15, 4),  # 4.5 -> 4; float32 0.3 widened to float64 gives 4.50000018 -> 5
        (0.1, 5, 0),  # 0.5 -> 0; float32 0.1 widened gives 0.50000001 -> 1
        (0.5, 5, 2),
        (0.5, 7, 4),
        (0.7, 5, 4),  # 3.5 -> 4
        (0.9, 5, 4),  # 4.5 -> 4
        (0.25, 10, 2),
        (0.75, 10, 8),
        (0.35, 10, 4),
        (0.05, 10, 0),
        (0.15, 10, 2),
    ],
)
def test_half_boundaries_give_the_python_float_count_eager_vmapped_and_compiled(amount, n, count):
    assert round(amount * n) == count  # the documented rule, as torch computes it
    params = _params(n)
    assert _pruned(fprune.l1_unstructured(params, amount)) == count
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        tensor = torch.tensor(amount, dtype=dtype)
        if float(tensor.to(torch.float64)) != amount and dtype in (torch.float16, torch.bfloat16):
            continue  # only decimals that survive the narrow dtype's shortest repr are checked here
        assert _pruned(fprune.l1_unstructured(params, tensor)) == count, dtype
        assert _pruned(fprune.global_unstructured(params, tensor)) == count, dtype
    levels = torch.tensor([amount, amount])
    batched = vmap(lambda a: fprune.global_unstructured(params, a))(levels)
    assert (~batched["w"]).sum(1).tolist() == [count, count]
    compiled = torch.compile(lambda p, a: fprune.l1_unstructured(p, a), fullgraph=True, backend="eager")
    assert _pruned(compiled(params, torch.tensor(amount))) == count


@given(st.integers(0, 10**6), st.integers(1, 5000))
def test_float32_tensor_count_equals_python_float_count(millionths, n):
    amount = millionths / 10**6  # any 6-place decimal survives float32's shortest repr
    assert int(_amount.count(torch.tensor(amount), n, "x")) == round(amount * n)


@given(st.integers(0, 1000), st.integers(1, 3000))
def test_float16_tensor_count_equals_python_float_count(thousandths, n):
    amount = thousandths / 1000
    assert int(_amount.count(torch.tensor(amount, dtype=torch.float16), n, "x")) == round(amount * n)


@given(st.integers(0, 100), st.integers(1, 3000))
def test_bfloat16_tensor_count_equals_python_float_count(hundredths, n):
    amount = hundredths / 100
    assert int(_amount.count(torch.tensor(amount, dtype=torch.bfloat16), n, "x")) == round(amount * n)


@given(st.floats(0, 1), st.integers(1, 10**9))
def test_float64_tensor_count_is_the_python_float_rule(amount, n):
    assert int(_amount.count(torch.tensor(amount, dtype=torch.float64), n, "x")) == round(amount * n)


@given(st.floats(0, 1, width=32))
def test_shortest_decimal_is_what_the_narrow_float_prints(value):
    np = pytest.importorskip("numpy")
    shortest = float(repr(np.float32(value)).removeprefix("np.float32(").rstrip(")"))
    if value >= 1e-8:  # below that, more than 17 places: the widened value is the fallback
        assert float(_amount.fraction(torch.tensor(value, dtype=torch.float32))) == shortest


def test_fraction_traces_under_vmap():
    levels = torch.tensor([0.3, 0.1, 0.7])
    got = vmap(_amount.fraction)(levels)
    assert got.dtype == torch.float64 and got.tolist() == [0.3, 0.1, 0.7]
