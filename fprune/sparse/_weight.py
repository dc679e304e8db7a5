"""Private: :class:`SparseWeight`, a 2-D weight held as a torch sparse (CSR or BSR) matrix.

It is a storage-less tensor subclass (a "wrapper") with the weight's shape and dtype: the params
pytree keeps its structure, ``functional_call`` swaps it in like any tensor, and each op that
reaches it lands in ``__torch_dispatch__`` (below autograd, so autograd still records the ops
and gradients flow to the inputs). The ops of a linear layer go to sparse kernels:

* ``F.linear(x, w, b)`` (``nn.Linear``): torch decomposes it into ``t(w)`` and
  ``addmm(b, x, w.t())`` / ``mm(x, w.t())``;
* ``torch.addmm(b, x, w)`` (transformers' ``Conv1D``, whose weight is laid out ``(in, out)``).

Both are ``x @ W`` for the logical weight ``W``; with the kernel matrix ``M = W.T`` of shape
``(out, in)`` (the weight of an ``nn.Linear`` as it is; a ``Conv1D`` weight transposed once, at
conversion) that is ``(M @ x.T).T``, torch's sparse-times-dense kernel (MKL on the CPU), faster
than ``F.linear(x, csr)``'s path (docs/sparse.md). Any other op gets the dense
weight (``M.to_dense()``, with a warning naming the op), so every result is right.

torch's CPU kernel takes float32 and float64 only. A bfloat16 or float16 weight on the CPU keeps
its values (rounded to its dtype) in a float32 ``M``; each call multiplies in float32 and casts
the output back to the weight's dtype, as a dense bfloat16 layer accumulates in float32 and
rounds once.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import optree
import torch

from fprune import _torch

__all__ = ["SparseWeight", "quiet", "sparse_matrix"]

aten = torch.ops.aten

SPARSE_LAYOUTS = {torch.sparse_csr: "csr", torch.sparse_bsr: "bsr"}
# torch's CPU sparse-times-dense kernel (MKL) takes these dtypes only.
CPU_KERNEL_DTYPES = (torch.float32, torch.float64)


def compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a sparse kernel runs in for a weight of ``dtype`` on ``device``."""
    if device.type == "cpu" and dtype.is_floating_point and dtype not in CPU_KERNEL_DTYPES:
        return torch.float32
    return dtype


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Hides torch's notes on its sparse tensors (beta state, invariant checks) inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse (CSR|BSR|CSC|BSC) tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        yield


def sparse_matrix(dense: torch.Tensor, layout: str, blocksize: tuple[int, int] = (4, 4)) -> torch.Tensor:
    """``dense`` (2-D, zeros where pruned) as a CSR or BSR matrix with int32 indices where they fit.

    int32 indices take half the memory and disk of torch's default int64, and MKL's CPU kernel
    runs as fast or faster with them (docs/sparse.md has the timings).

    Args:
        dense: a 2-D tensor; its zeros are left out (with BSR: blocks of zeros only).
        layout: ``"csr"`` or ``"bsr"``.
        blocksize: the block of ``"bsr"``; both dims of ``dense`` must be multiples of it.

    Returns:
        A ``torch.sparse_csr`` or ``torch.sparse_bsr`` tensor equal to ``dense``.

    Raises:
        ValueError: another ``layout``.

    Example:
        >>> import torch
        >>> from fprune.sparse import sparse_matrix
        >>> m = sparse_matrix(torch.tensor([[0.0, 2.0], [3.0, 0.0]]), "csr")
        >>> m.layout, m.col_indices()
        (torch.sparse_csr, tensor([1, 0], dtype=torch.int32))
    """
    if layout not in ("csr", "bsr"):
        raise ValueError(f"Expected layout to be 'csr' or 'bsr', got {layout!r}.")
    with quiet():
        if layout == "csr":
            m, build = dense.to_sparse_csr(), torch.sparse_csr_tensor
        else:
            m, build = dense.to_sparse_bsr(blocksize), torch.sparse_bsr_tensor
        crow, col, values = m.crow_indices(), m.col_indices(), m.values()
        if max(crow.numel(), values.numel(), *dense.shape) < 2**31 - 1:
            crow, col = crow.to(torch.int32), col.to(torch.int32)
        return build(crow, col, values, tuple(dense.shape), check_invariants=False)


class SparseWeight(torch.Tensor):
    """A 2-D weight of a linear layer, held as a sparse CSR or BSR matrix, for inference.

    Made by :func:`fprune.sparse.to_sparse`; use it in place of the dense weight in
    ``torch.func.functional_call``. It has the shape, dtype and device of the weight it stands
    for, and no storage of its own. ``F.linear``, ``torch.addmm`` / ``mm`` / ``matmul`` with
    the weight on the right (and ``.t()``) run a sparse kernel; every other op runs on a dense
    copy (``to_dense()``), with a warning naming the op.

    Args:
        matrix: the sparse matrix (see the attribute).
        transposed: see the attribute.
        dtype: the dtype the weight stands for; by default ``matrix``'s. A bfloat16 or float16
            weight on the CPU keeps its values (rounded to ``dtype``) in a float32 ``matrix``,
            since torch's CPU kernel takes float32 and float64 only: each call casts the input
            to float32, multiplies, and casts the output back to ``dtype``.

    Attributes:
        matrix: the torch sparse tensor (``torch.sparse_csr`` or ``torch.sparse_bsr``) of shape
            ``(out_features, in_features)``: ``y = (matrix @ x.T).T``.
        transposed: whether this tensor is ``matrix.T`` (a ``Conv1D`` weight, ``(in, out)``)
            rather than ``matrix`` (an ``nn.Linear`` weight, ``(out, in)``).
        out_dtype: the dtype of the weight and of its outputs (``matrix.dtype`` but where the
            kernel runs in float32, above).

    It is a constant: it never requires grad. Gradients flow through it to the layer's input
    (and so to every dense parameter before it); for gradients with respect to a pruned weight
    use :func:`fprune.masked_call` on the dense weight and its mask.

    Example:
        >>> import torch
        >>> from fprune.sparse import SparseWeight, sparse_matrix
        >>> w = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
        >>> sw = SparseWeight(sparse_matrix(w, "csr"))
        >>> sw.shape, sw.layout_name
        (torch.Size([2, 2]), 'csr')
        >>> torch.nn.functional.linear(torch.tensor([[1.0, 10.0]]), sw)
        tensor([[20.,  3.]])
    """

    matrix: torch.Tensor
    transposed: bool
    out_dtype: torch.dtype

    if _torch.has_torch_function_passthrough():

        @classmethod
        def __torch_function__(
            cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
        ) -> Any:
            # The inference fast path: F.linear / addmm / mm / matmul straight to the sparse
            # kernel, one Python call instead of torch's decomposition into t() and addmm (each
            # a trip through __torch_dispatch__), which costs a small layer a few microseconds.
            kwargs = kwargs or {}
            fast = _FAST.get(func)
            if fast is not None and _inference(args, kwargs):
                out = fast(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            with _torch.torch_function_passthrough():
                return func(*args, **kwargs)

    else:
        __torch_function__ = _torch.disabled_torch_function()

    @staticmethod
    def __new__(
        cls, matrix: torch.Tensor, transposed: bool = False, dtype: torch.dtype | None = None
    ) -> SparseWeight:
        if not isinstance(matrix, torch.Tensor) or matrix.layout not in SPARSE_LAYOUTS or matrix.dim() != 2:
            got = matrix.layout if isinstance(matrix, torch.Tensor) else type(matrix).__name__
            raise TypeError(
                f"Expected matrix to be a 2-D torch.sparse_csr or torch.sparse_bsr tensor, got {got}."
            )
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"Expected dtype to be None or a floating torch.dtype, got {dtype!r}.")
        rows, cols = matrix.shape
        shape = (cols, rows) if transposed else (rows, cols)
        return _torch.make_wrapper_subclass(cls, shape, dtype or matrix.dtype, matrix.device)

    def __init__(
        self, matrix: torch.Tensor, transposed: bool = False, dtype: torch.dtype | None = None
    ) -> None:
        dtype = dtype or matrix.dtype
        compute = compute_dtype(dtype, matrix.device)
        if matrix.dtype != compute:
            if dtype.itemsize < matrix.dtype.itemsize:  # the values the weight's dtype holds
                matrix = matrix.to(dtype)
            matrix = matrix.to(compute)
        self.matrix = matrix
        self.transposed = bool(transposed)
        self.out_dtype = dtype

    @property
    def layout_name(self) -> str:
        """``"csr"`` or ``"bsr"``: the layout of :attr:`matrix`."""
        return SPARSE_LAYOUTS[self.matrix.layout]

    def nnz(self) -> int:
        """Entries stored (kept weights; with BSR, whole blocks)."""
        return int(self.matrix.values().numel())

    def dense(self) -> torch.Tensor:
        """The weight as a dense tensor (zeros where pruned), in its dtype."""
        with quiet():
            d = self.matrix.to_dense().to(self.out_dtype)
        return d.t() if self.transposed else d

    def requires_grad_(self, requires_grad: bool = True) -> SparseWeight:
        if requires_grad:
            raise RuntimeError(
                "A fprune.sparse.SparseWeight is a constant for inference and cannot require grad. "
                "For gradients with respect to a pruned weight, run the dense weight and its mask "
                "with fprune.masked_call(module, params, masks, args)."
            )
        return self

    def __repr__(self) -> str:  # type: ignore[override]
        total = self.shape[0] * self.shape[1]
        density = self.nnz() / total if total else 0.0
        return (
            f"SparseWeight(shape={tuple(self.shape)}, layout={self.layout_name}, nnz={self.nnz()}, "
            f"density={density:.3f}, transposed={self.transposed}, dtype={self.dtype}, device={self.device})"
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (SparseWeight, (self.matrix, self.transposed, self.out_dtype))

    def __deepcopy__(self, memo: dict) -> SparseWeight:
        return SparseWeight(self.matrix.clone(), self.transposed, self.out_dtype)

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if func not in _QUIET:
            warnings.warn(
                f"fprune.sparse: {func} has no sparse kernel, so it ran on a dense copy of the "
                f"weight (correct, but as slow as the dense layer and with its memory). Sparse "
                f"kernels serve F.linear, torch.addmm, torch.mm and torch.matmul with the weight on "
                f"the right, as nn.Linear and transformers' Conv1D use it.",
                stacklevel=2,
            )
        dense_args, dense_kwargs = optree.tree_map(_densified, (args, kwargs))  # type: ignore[arg-type]
        return func(*dense_args, **dense_kwargs)


def _densified(a: Any) -> Any:
    return a.dense() if isinstance(a, SparseWeight) else a


def _flip(w: SparseWeight) -> SparseWeight:
    # A fresh tensor every time: torch makes the result of a view op (t, transpose) a view of
    # its input in autograd's records, which a tensor returned before cannot become.
    return SparseWeight(w.matrix, not w.transposed, w.out_dtype)


def _t(w: Any) -> Any:
    return _flip(w) if isinstance(w, SparseWeight) else NotImplemented


def _transpose(w: Any, dim0: int, dim1: int) -> Any:
    if isinstance(w, SparseWeight) and {dim0 % 2, dim1 % 2} == {0, 1}:
        return _flip(w)
    if isinstance(w, SparseWeight) and dim0 % 2 == dim1 % 2:
        return SparseWeight(w.matrix, w.transposed, w.out_dtype)
    return NotImplemented


def _permute(w: Any, dims: list) -> Any:
    if isinstance(w, SparseWeight) and [d % 2 for d in dims] == [1, 0]:
        return _flip(w)
    return NotImplemented


def _same(w: Any) -> Any:
    if not isinstance(w, SparseWeight):
        return NotImplemented
    return SparseWeight(w.matrix, w.transposed, w.out_dtype)


def _clone(w: Any, **kwargs: Any) -> Any:
    if isinstance(w, SparseWeight) and kwargs.get("memory_format") in (None, torch.preserve_format):
        return SparseWeight(w.matrix.clone(), w.transposed, w.out_dtype)
    return NotImplemented


def _to_copy(w: Any, **kwargs: Any) -> Any:
    """``w.to(dtype)`` / ``w.to(device)``: the sparse matrix converted, still sparse."""
    if not isinstance(w, SparseWeight) or set(kwargs) - {"dtype", "device", "non_blocking", "layout"}:
        return NotImplemented
    if kwargs.get("layout") not in (None, torch.strided):
        return NotImplemented
    matrix = w.matrix
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    if dtype is not None and not dtype.is_floating_point:
        return NotImplemented  # integer or bool weights: the dense copy gives torch's rounding
    if device is not None:
        matrix = matrix.to(device, non_blocking=bool(kwargs.get("non_blocking", False)))
    # the constructor puts the values in the dtype the kernel runs in on that device
    return SparseWeight(matrix, w.transposed, dtype or w.out_dtype)


def _copy_(dst: Any, src: Any, non_blocking: bool = False) -> Any:
    """``dst.copy_(src)`` (``load_state_dict``): into a SparseWeight, its matrix replaced (a dense
    ``src`` sparsified in ``dst``'s layout: its zeros left out); from one, its dense values."""
    if not isinstance(dst, SparseWeight):
        if not isinstance(src, SparseWeight):
            return NotImplemented
        return dst.copy_(src.dense(), non_blocking=non_blocking)
    if isinstance(src, SparseWeight) and src.transposed == dst.transposed:
        matrix = src.matrix
    elif isinstance(src, SparseWeight) or (isinstance(src, torch.Tensor) and src.layout == torch.strided):
        logical = src.dense() if isinstance(src, SparseWeight) else src
        kernel = (logical.t() if dst.transposed else logical).contiguous()
        blocks = tuple(dst.matrix.values().shape[-2:]) if dst.layout_name == "bsr" else (4, 4)
        matrix = sparse_matrix(kernel, dst.layout_name, blocks)  # type: ignore[arg-type]
    else:
        return NotImplemented
    matrix = matrix.to(device=dst.matrix.device, non_blocking=non_blocking)
    dst.matrix = SparseWeight(matrix, dst.transposed, dst.out_dtype).matrix  # in dst's dtypes
    return dst


def _product(x: torch.Tensor, w: SparseWeight) -> torch.Tensor:
    """``x @ w`` for a dense 2-D ``x`` and ``w = M.T``: ``(M @ x.T).T``, made contiguous."""
    return _kernel(x, w.matrix, None)


def _left(w: SparseWeight, b: torch.Tensor) -> torch.Tensor:
    """``M @ b`` (a matrix or a vector ``b``), in ``b``'s dtype."""
    m = w.matrix
    return m @ b if b.dtype == m.dtype else (m @ b.to(m.dtype)).to(b.dtype)


def _is_dense(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, SparseWeight) and t.layout == torch.strided


def _mm(a: Any, b: Any) -> Any:
    if _is_dense(a) and isinstance(b, SparseWeight) and a.dtype == b.out_dtype:
        if b.transposed:
            return _product(a, b)
        # x @ M: what the backward pass of a linear layer computes for its input's gradient.
        # torch's dense @ CSR is slower here than a dense copy (docs/sparse.md, the kernels table).
        return a @ b.dense()
    if isinstance(a, SparseWeight) and not a.transposed and _is_dense(b) and b.dtype == a.out_dtype:
        return _left(a, b)
    return NotImplemented


def _addmm(bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    if not _is_dense(bias):
        return NotImplemented
    if (
        _is_dense(a)
        and isinstance(b, SparseWeight)
        and b.transposed
        and beta == 1
        and alpha == 1
        and bias.dim() == 1
        and bias.shape[0] == b.shape[1]
        and bias.dtype == a.dtype == b.dtype
    ):
        # the bias of nn.Linear / Conv1D, added by the sparse kernel itself (one pass fewer)
        return _kernel(a, b.matrix, bias)
    out = _mm(a, b)
    if out is NotImplemented:
        return out
    if alpha != 1:
        out = out.mul_(alpha)
    if beta == 0:  # torch ignores the input then (NaN in it does not propagate)
        return out
    if bias.dtype != out.dtype:
        return NotImplemented  # torch raises its own dtype error on the dense copy
    return out.add_(bias, alpha=beta)


def _mv(a: Any, v: Any) -> Any:
    if isinstance(a, SparseWeight) and not a.transposed and _is_dense(v) and v.dtype == a.out_dtype:
        return _left(a, v)
    return NotImplemented


def _inference(args: tuple, kwargs: dict) -> bool:
    """Whether the fast path may run: no gradient to record, no transform or mode above us.

    With gradients, vmap (functorch wrappers) or a dispatch mode (fake tensors), the op goes
    the long way, through autograd and ``__torch_dispatch__``, which handle them. Nothing here
    reads a SparseWeight's tensor attributes: each read would be another ``__torch_function__``.
    """
    grad = torch.is_grad_enabled()
    for a in (*args, *kwargs.values()):
        if (
            isinstance(a, torch.Tensor)
            and not isinstance(a, SparseWeight)
            and ((grad and a.requires_grad) or _torch.is_functorch_wrapped(a))
        ):
            return False
    return not _torch.in_dispatch_mode()


def _rows(x: Any, w: SparseWeight) -> torch.Tensor | None:
    """``x`` as the 2-D ``(rows, in)`` operand of ``w.matrix``, or None where it does not fit."""
    matrix = w.matrix
    if not (_is_dense(x) and x.dim() >= 1 and x.shape[-1] == matrix.shape[1]):
        return None
    if x.dtype != w.out_dtype or x.device != matrix.device:
        return None
    return x.reshape(-1, x.shape[-1])


def _bias_fits(bias: Any, w: SparseWeight) -> bool:
    return bias is None or (
        _is_dense(bias)
        and bias.shape == (w.matrix.shape[0],)
        and bias.dtype == w.out_dtype
        and bias.device == w.matrix.device
    )


def _fast_linear(x: Any, w: Any, bias: Any = None) -> Any:
    """``F.linear(x, w, bias)`` for an ``(out, in)`` weight: ``x @ M.T + bias``."""
    if not isinstance(w, SparseWeight) or w.transposed:
        return NotImplemented
    x2 = _rows(x, w)
    if x2 is None or not _bias_fits(bias, w):
        return NotImplemented
    return _kernel(x2, w.matrix, bias).reshape(*x.shape[:-1], w.matrix.shape[0])


def _fast_addmm(bias: Any, x: Any, w: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """``torch.addmm(bias, x, w)`` for an ``(in, out)`` weight (transformers' Conv1D)."""
    if not (isinstance(w, SparseWeight) and w.transposed and beta == 1 and alpha == 1):
        return NotImplemented
    if not (_is_dense(x) and x.dim() == 2 and bias is not None and _bias_fits(bias, w)):
        return NotImplemented
    x2 = _rows(x, w)
    return NotImplemented if x2 is None else _kernel(x2, w.matrix, bias)


def _fast_matmul(x: Any, w: Any) -> Any:
    """``x @ w`` for an ``(in, out)`` weight, ``x`` of 2 or more dims."""
    if not (isinstance(w, SparseWeight) and w.transposed and _is_dense(x) and x.dim() >= 2):
        return NotImplemented
    x2 = _rows(x, w)
    if x2 is None:
        return NotImplemented
    return _kernel(x2, w.matrix, None).reshape(*x.shape[:-1], w.matrix.shape[0])


def _fast_mm(x: Any, w: Any) -> Any:
    if not (_is_dense(x) and x.dim() == 2):
        return NotImplemented
    return _fast_matmul(x, w)


def _kernel(x2: torch.Tensor, matrix: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x2 @ matrix.T (+ bias)`` as ``(matrix @ x2.T).T``, contiguous like a dense layer's output.

    On the CPU the bias goes into the sparse ``addmm`` as a broadcast column (one pass fewer);
    elsewhere it is added after the product. One row takes the matrix-vector kernel
    (``addmv``) rather than ``addmm`` with a 1-column matrix. An input of another dtype than
    ``matrix`` (a bfloat16 or float16 weight, whose values the CPU kernel takes in float32) is
    cast to ``matrix``'s dtype, and the output back to the input's.
    """
    if x2.dtype != matrix.dtype:
        bias = None if bias is None else bias.to(matrix.dtype)
        return _kernel(x2.to(matrix.dtype), matrix, bias).to(x2.dtype)
    if x2.shape[0] == 1:
        v = x2[0]
        out = torch.mv(matrix, v) if bias is None else torch.addmv(bias, matrix, v)
        return out.unsqueeze(0)
    if bias is not None and matrix.device.type == "cpu":
        return torch.addmm(bias.unsqueeze(1), matrix, x2.t()).t().contiguous()
    out = (matrix @ x2.t()).t().contiguous()
    return out if bias is None else out.add_(bias)


_FAST: dict[Any, Callable[..., Any]] = {
    torch.nn.functional.linear: _fast_linear,
    torch.addmm: _fast_addmm,
    torch.Tensor.addmm: _fast_addmm,
    torch.matmul: _fast_matmul,
    torch.Tensor.matmul: _fast_matmul,
    torch.Tensor.__matmul__: _fast_matmul,
    torch.mm: _fast_mm,
    torch.Tensor.mm: _fast_mm,
}


_HANDLERS: dict[Any, Callable[..., Any]] = {
    aten.t.default: _t,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
    aten.detach.default: _same,
    aten.alias.default: _same,
    aten.clone.default: _clone,
    aten._to_copy.default: _to_copy,
    aten.mm.default: _mm,
    aten.addmm.default: _addmm,
    aten.mv.default: _mv,
    aten.copy_.default: _copy_,
}

# Ops that get the dense copy without a warning: asking for the dense weight is what they do.
_QUIET = {aten.to_dense.default, aten._to_dense.default, aten.equal.default}
