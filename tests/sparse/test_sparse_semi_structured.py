"""layout="semi_structured" (torch's 2:4 format): every rule checked up front, on the CPU too.

The CUDA-marked tests run on a GPU (``python -m pytest -q -m cuda tests``) and are skipped here.
"""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

import fprune
from fprune.sparse import _semi, layouts, to_sparse
from sparse_helpers import assert_close, gpt2, mlp, output

A100 = (8, 0)
CUDA = torch.device("cuda")


def two_four(shape, dtype=torch.float16):
    """A matrix and a 2:4 mask along its last dim."""
    w = torch.randn(shape).to(dtype)
    keep = fprune.n_m({"w": w.float()}, 2, 4)["w"]
    return w * keep, keep


def test_a_valid_matrix_breaks_no_rule():
    w, keep = two_four((64, 128))
    assert _semi.problems(w, keep, device=CUDA, capability=A100, backend="cutlass") == []
    found = _semi.problems(w, keep, device=CUDA, capability=A100, backend="cusparselt")
    if torch.backends.cusparselt.is_available():
        assert found == []
    else:  # a build without cuSPARSELt (the CPU wheel): the one rule it breaks
        assert len(found) == 1 and found[0].startswith("backend: this torch build has no cuSPARSELt")


def test_device_rule():
    w, keep = two_four((64, 128))
    found = _semi.problems(w, keep, backend="cutlass")
    assert found == ["device: the 2:4 format runs on CUDA GPUs only, got a tensor on cpu"]


def test_capability_rule():
    w, keep = two_four((64, 128))
    found = _semi.problems(w, keep, device=CUDA, capability=(7, 5), backend="cutlass")
    assert found == ["compute capability: the 2:4 kernels need 8.0 (Ampere) or newer, got 7.5"]


def test_dtype_rule_per_backend():
    w, keep = two_four((64, 128), torch.float32)
    assert _semi.problems(w, keep, device=CUDA, capability=A100, backend="cutlass") == []
    found = _semi.problems(w, keep, device=CUDA, capability=A100, backend="cusparselt")
    assert any(
        line.startswith("dtype: the cusparselt backend takes") and "got float32" in line for line in found
    )


@pytest.mark.parametrize(
    "shape, backend, ok",
    [
        ((32, 64), "cutlass", True),
        ((16, 64), "cutlass", False),
        ((32, 72), "cutlass", False),
        ((16, 16), "cusparselt", True),
        ((24, 16), "cusparselt", False),
        ((8, 32), "cusparselt", False),
    ],
)
def test_shape_rule(shape, backend, ok):
    w, keep = two_four(shape)
    found = [
        line
        for line in _semi.problems(w, keep, device=CUDA, capability=A100, backend=backend)
        if line.startswith("shape")
    ]
    assert (found == []) == ok
    if not ok:
        assert f"got ({shape[0]}, {shape[1]})" in found[0]


def test_rank_and_contiguity_rules():
    w, keep = two_four((64, 128))
    assert _semi.problems(w.t(), keep.t(), device=CUDA, capability=A100, backend="cutlass")[0] == (
        "contiguity: the matrix must be contiguous"
    )
    assert _semi.problems(w[None], keep[None], device=CUDA, capability=A100, backend="cutlass") == [
        "rank: the 2:4 format holds 2-D matrices, got 3-D"
    ]


def test_pattern_rule_names_the_first_bad_group():
    w, keep = two_four((32, 64))
    keep[3, 8:12] = True
    keep[5, :4] = torch.tensor([True, True, True, False])
    found = _semi.problems(w, keep, device=CUDA, capability=A100, backend="cutlass")
    assert found == [
        (
            "2:4 pattern: 2 of 512 groups of 4 consecutive inputs keep more than 2 weights "
            "(the first: output 3, inputs 8-11, keeping 4)"
        )
    ]


def test_to_sparse_names_the_rules_on_the_cpu():
    model = mlp(sizes=(64, 64))
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.l1_unstructured(params, 0.5, where=lambda n, p: p.dim() == 2)  # not 2:4
    with pytest.raises(ValueError) as info:
        to_sparse(params, masks, layout="semi_structured", module=model)
    message = str(info.value)
    assert message.startswith("params['0.weight'] cannot take layout='semi_structured'")
    assert "device: the 2:4 format runs on CUDA GPUs only, got a tensor on cpu" in message
    assert "dtype: the" in message and "got float32" in message
    assert "2:4 pattern:" in message


def test_conv1d_error_says_its_groups_run_along_dim_0():
    model = gpt2(layers=1)
    params = {k: v.detach().half() for k, v in model.named_parameters()}
    where = lambda name, p: name == "h.0.mlp.c_fc.weight"
    masks = fprune.n_m(params, 2, 4, where=where)  # dim=-1: along out, the wrong dim for Conv1D
    with pytest.raises(
        ValueError,
        match=r"2:4 pattern.*Conv1D weight's \(in, out\) is transposed.*n_m\(params, 2, 4, dim=0\)",
    ):
        to_sparse(
            params, {k: masks[k] for k in ["h.0.mlp.c_fc.weight"]}, layout="semi_structured", module=model
        )


# ------------------------------------------------------------------------------------ on a GPU


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_linear_equals_masked_call(dtype, batch):
    model = mlp(sizes=(256, 512, 128)).to(CUDA, dtype)
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = fprune.n_m(params, 2, 4, where=lambda n, p: p.dim() == 2)
    masks = {k: m for k, m in masks.items() if params[k].dim() == 2}
    sparse = to_sparse(params, masks, layout="semi_structured", module=model)
    assert all(layouts(sparse)[k] == "semi_structured" for k in masks)
    x = torch.randn(batch, 256, device=CUDA, dtype=dtype)
    with torch.no_grad():
        assert_close(
            functional_call(model, sparse, (x,)).float(),
            fprune.masked_call(model, params, masks, (x,)).float(),
            2e-2,
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gpt2_conv1d_equals_masked_call_and_round_trips():
    import io

    model = gpt2(layers=1, width=128).to(CUDA, torch.float16)
    params = {k: v.detach() for k, v in model.named_parameters()}
    where = lambda name, p: p.dim() == 2 and name.startswith("h.")
    masks = {k: m for k, m in fprune.n_m(params, 2, 4, dim=0, where=where).items() if where(k, params[k])}
    sparse = to_sparse(params, masks, layout="semi_structured", module=model)
    ids = torch.randint(0, 64, (2, 8), device=CUDA)
    with torch.no_grad():
        want = output(fprune.masked_call(model, params, masks, (ids,))).float()
        assert_close(output(functional_call(model, sparse, (ids,))).float(), want, 2e-2)
        buffer = io.BytesIO()
        torch.save(fprune.sparse.to_state(sparse), buffer)
        buffer.seek(0)
        loaded = fprune.sparse.from_state(torch.load(buffer, weights_only=True, map_location="cuda"))
        assert layouts(loaded) == layouts(sparse)
        assert_close(output(functional_call(model, loaded, (ids,))).float(), want, 2e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_csr_equals_masked_call_and_auto_keeps_dense():
    model = mlp(sizes=(256, 512, 128)).to(CUDA)
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = {
        k: m
        for k, m in fprune.l1_unstructured(params, 0.95, where=lambda n, p: p.dim() == 2).items()
        if params[k].dim() == 2
    }
    x = torch.randn(8, 256, device=CUDA)
    with torch.no_grad():
        want = fprune.masked_call(model, params, masks, (x,))
        assert_close(
            functional_call(model, to_sparse(params, masks, layout="csr", module=model), (x,)), want, 1e-4
        )
    assert set(layouts(to_sparse(params, masks, module=model)).values()) == {"dense"}
