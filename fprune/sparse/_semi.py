"""Private: the rules of torch's 2:4 ("semi-structured") sparse format, checked up front.

``torch.sparse.to_sparse_semi_structured`` checks the device, rank, contiguity, dtype and shape of
the dense matrix it compresses, each with its own message, and nothing else: it neither checks
the GPU's compute capability (cuSPARSELt and CUTLASS's sparse kernels need sm80+, and fail later,
inside a matmul) nor the 2:4 pattern (a group of 4 with 3 or 4 nonzeros is compressed wrongly,
silently). :func:`problems` checks all of them, on any device, so that a CPU run already says
which rule a weight breaks.
"""

from __future__ import annotations

import torch

from fprune import _torch

__all__ = ["MIN_CAPABILITY", "problems"]

#: Semi-structured sparse kernels (cuSPARSELt, CUTLASS) need compute capability 8.0 (Ampere) or newer.
MIN_CAPABILITY = (8, 0)


def problems(
    matrix: torch.Tensor,
    keep: torch.Tensor,
    *,
    device: torch.device | None = None,
    capability: tuple[int, int] | None = None,
    backend: str | None = None,
) -> list[str]:
    """The rules that ``matrix`` (the ``(out, in)`` kernel matrix) and its ``keep`` mask break.

    Args:
        matrix: the matrix to compress, 2-D ``(out, in)``: groups of 4 run along ``in``.
        keep: its mask (``True`` = kept), same shape.
        device: the device to check (default: ``matrix.device``).
        capability: the device's compute capability (default: asked of CUDA for a CUDA device).
        backend: ``"cusparselt"`` or ``"cutlass"`` (default: the one torch would use).

    Returns:
        One line per broken rule, in the order torch checks them (device, capability, rank,
        contiguity, dtype, shape), then the 2:4 pattern; empty when the matrix can be converted.
    """
    device = torch.device(device) if device is not None else matrix.device
    backend = backend or _torch.semi_structured_backend()
    found = []
    if device.type != "cuda":
        found.append(f"device: the 2:4 format runs on CUDA GPUs only, got a tensor on {device}")
    else:
        if capability is None:
            capability = tuple(torch.cuda.get_device_capability(device))  # type: ignore[assignment]
        if tuple(capability) < MIN_CAPABILITY:  # type: ignore[arg-type]
            found.append(
                f"compute capability: the 2:4 kernels need {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                f"(Ampere) or newer, got {capability[0]}.{capability[1]}"  # type: ignore[index]
            )
        if backend == "cusparselt" and not torch.backends.cusparselt.is_available():
            found.append(
                "backend: this torch build has no cuSPARSELt (torch.backends.cusparselt.is_available() "
                "is False); set torch.sparse.SparseSemiStructuredTensor._FORCE_CUTLASS = True"
            )
    if matrix.dim() != 2:
        found.append(f"rank: the 2:4 format holds 2-D matrices, got {matrix.dim()}-D")
        return found
    if not matrix.is_contiguous():
        found.append("contiguity: the matrix must be contiguous")
    shapes = _torch.semi_structured_shapes(backend)
    if matrix.dtype not in shapes:
        allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in shapes))
        found.append(
            f"dtype: the {backend} backend takes {allowed}, got {str(matrix.dtype).removeprefix('torch.')}"
        )
    else:
        min_rows, min_cols = shapes[matrix.dtype]
        rows, cols = matrix.shape
        if rows < min_rows or rows % min_rows or cols < min_cols or cols % min_cols:
            found.append(
                f"shape: with {backend} and {str(matrix.dtype).removeprefix('torch.')}, the (out, in) "
                f"matrix must be at least and a multiple of ({min_rows}, {min_cols}), got "
                f"({rows}, {cols})"
            )
    if matrix.shape[-1] % 4:
        found.append(f"2:4 pattern: in_features ({matrix.shape[-1]}) is not a multiple of 4")
    else:
        kept = keep.reshape(keep.shape[0], -1, 4).sum(-1)
        bad = int((kept > 2).sum())
        if bad:
            row, group = divmod(int((kept > 2).reshape(-1).nonzero()[0]), kept.shape[1])
            found.append(
                f"2:4 pattern: {bad} of {kept.numel()} groups of 4 consecutive inputs keep more than 2 "
                f"weights (the first: output {row}, inputs {4 * group}-{4 * group + 3}, keeping "
                f"{int(kept[row, group])})"
            )
    return found
