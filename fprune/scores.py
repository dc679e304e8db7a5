"""Saliency scores as pure functions of parameter pytrees, by ``torch.func``.

Every function returns a pytree shaped like ``params`` (higher = more important) and mutates
nothing; select with it through ``importance_scores=``::

    scores = fprune.scores.snip(loss_fn, params, [batch])
    masks = fprune.global_unstructured(params, 0.9, importance_scores=scores)

Conventions shared by the gradient scores (:func:`snip`, :func:`fisher`, :func:`obd`,
:func:`grasp`):

* ``loss_fn(params, batch) -> 0-dim tensor``, the ``torch.func`` convention, e.g.
  ``lambda p, b: F.cross_entropy(functional_call(model, p, (b[0],)), b[1])``.
* ``batches`` is an iterable of batches (one batch is ``[batch]``), read once: a generator
  works. Every leaf of a batch carries its examples along dim 0.
* Prior ``masks=``: gradients are those of ``p -> loss_fn(apply_masks(p, masks), batch)`` and
  the weights multiplied in are the pruned ones, as the reference code does, so pruned entries
  score 0. A mask dict may leave keys out (those leaves are unmasked).
* They are one tensor program: they work under ``vmap`` (stacked models) and
  ``torch.compile(fullgraph=True)``, and the results are detached from any autograd graph.

Formulas, references and the reference code compared against: ``docs/scores.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

import optree
import torch
from torch.func import functional_call, grad, jvp, vjp, vmap

from fprune import _torch, _tree
from fprune._types import Masks, Params, Scores

__all__ = ["magnitude", "snip", "fisher", "obd", "grasp", "synflow", "wanda"]

LossFn = Callable[[Any, Any], torch.Tensor]


def magnitude(params: Params, *, masks: Masks = None) -> Scores:
    """``|p|``, the magnitude score (pruned entries score 0 with prior ``masks``).

    Example:
        >>> import torch, fprune
        >>> fprune.scores.magnitude({"w": torch.tensor([-2.0, 1.0])})
        {'w': tensor([2., 1.])}
    """
    flat, prior = _params_and_masks(params, masks)
    return _tree.unflatten(flat, [_masked(p, m).abs() for p, m in zip(flat.leaves, prior, strict=True)])


def snip(loss_fn: LossFn, params: Params, batches: Iterable[Any], *, masks: Masks = None) -> Scores:
    """SNIP connection sensitivity ``|g * p|`` (Lee et al. 2019); the first-order Taylor score.

    ``g`` is the gradient of the loss summed over ``batches``.

    Args:
        loss_fn: ``loss_fn(params, batch) -> 0-dim tensor``.
        params: a pytree of tensors.
        batches: an iterable of batches, read once.
        masks: prior masks (pruned entries score 0).

    Returns:
        A pytree like ``params`` of non-negative scores.

    Raises:
        TypeError / ValueError: a ``loss_fn`` that is not callable or does not return a 0-dim
            tensor, ``batches`` not iterable or empty, ``masks`` not matching ``params``.

    Example:
        >>> import torch, fprune
        >>> loss_fn = lambda p, x: (p["w"] * x).sum()
        >>> fprune.scores.snip(loss_fn, {"w": torch.tensor([2.0, -3.0])}, [torch.tensor([[1.0, 1.0]])])
        {'w': tensor([2., 3.])}
    """
    run = _GradRun(loss_fn, params, batches, masks, "snip")
    g = run.summed_grad()
    return run.result([(gi * p).abs() for gi, p in zip(g, run.pruned, strict=True)])


def fisher(loss_fn: LossFn, params: Params, batches: Iterable[Any], *, masks: Masks = None) -> Scores:
    """The diagonal empirical Fisher: the sum over examples of squared per-example gradients.

    Per-example gradients come from ``vmap(grad(...))``: each example reaches ``loss_fn`` as a
    batch of one (every batch leaf sliced along dim 0, keeping that dim), in one vectorized call
    per batch, not a Python loop. Its memory is one gradient per example of a batch: split
    large batches. Models with BatchNorm must be scored in eval mode (a batch of one has no
    batch statistics, and ``vmap`` forbids the running-stat updates).

    Args:
        loss_fn: ``loss_fn(params, batch) -> 0-dim tensor``.
        params: a pytree of tensors.
        batches: an iterable of batches, read once; every batch leaf a tensor with examples
            along dim 0.
        masks: prior masks (pruned entries score 0).

    Returns:
        A pytree like ``params`` of non-negative scores.

    Example:
        >>> import torch, fprune
        >>> loss_fn = lambda p, x: (p["w"] * x).sum()
        >>> x = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
        >>> fprune.scores.fisher(loss_fn, {"w": torch.zeros(2)}, [x])   # 1 + 9, 4 + 0
        {'w': tensor([10.,  4.])}
    """
    run = _GradRun(loss_fn, params, batches, masks, "fisher")
    return run.result(run.fisher())


def obd(loss_fn: LossFn, params: Params, batches: Iterable[Any], *, masks: Masks = None) -> Scores:
    """Optimal Brain Damage ``0.5 * F * p**2`` with ``F`` the diagonal empirical Fisher.

    LeCun et al. 1990, with :func:`fisher` standing in for the Hessian diagonal (as Torch-Pruning's
    ``HessianImportance`` does). Same arguments as :func:`fisher`.

    Example:
        >>> import torch, fprune
        >>> loss_fn = lambda p, x: (p["w"] * x).sum()
        >>> fprune.scores.obd(loss_fn, {"w": torch.tensor([1.0, 3.0])}, [torch.tensor([[2.0, 1.0]])])
        {'w': tensor([2.0000, 4.5000])}
    """
    run = _GradRun(loss_fn, params, batches, masks, "obd")
    return run.result([0.5 * f * p.square() for f, p in zip(run.fisher(), run.pruned, strict=True)])


def grasp(loss_fn: LossFn, params: Params, batches: Iterable[Any], *, masks: Masks = None) -> Scores:
    """The signed GraSP score ``p * (H g)`` (Wang et al. 2020).

    ``g`` is the gradient summed over ``batches``, held constant, and ``H g`` the
    Hessian-vector product of the summed loss with it, computed as ``jvp`` of ``grad``
    (forward-over-reverse), or ``vjp`` of ``grad`` (reverse-over-reverse) where an op has no
    forward-mode derivative (CPU flash attention in transformers' GPT-2, for one).
    GraSP prunes the entries with the *lowest* ``p * (H g)`` (those
    whose removal reduces the gradient flow least), so rank these scores by value, not by
    magnitude (signed ranking). The batches are kept in a list: ``g`` needs them all before
    ``H g`` can start. Same arguments as :func:`snip`.

    Example:
        >>> import torch, fprune
        >>> loss_fn = lambda p, x: 0.5 * (p["w"] * x).square().sum()   # H = diag(x**2)
        >>> fprune.scores.grasp(loss_fn, {"w": torch.tensor([1.0, -1.0])}, [torch.tensor([[1.0, 2.0]])])
        {'w': tensor([ 1., 16.])}
    """
    run = _GradRun(loss_fn, params, batches, masks, "grasp")
    g = run.summed_grad()
    hg = run.hessian_vector(g)
    return run.result([p * h for p, h in zip(run.pruned, hg, strict=True)])


@_torch.run_eagerly
def synflow(module: torch.nn.Module, params: Params, example_inputs: Any, *, masks: Masks = None) -> Scores:
    """The data-free SynFlow score ``|dR/dp * p|`` (Tanaka et al. 2020).

    ``R`` is the sum of the module's output on all-ones inputs shaped like ``example_inputs``
    (a tensor or a tuple of tensors; integer inputs become ones of their dtype), evaluated with
    ``|p|`` for the given (masked) ``params`` and the absolute values of the module's other
    parameters and buffers, all in float64, with every submodule in eval mode (BatchNorm on
    its running statistics), as the reference implementation computes it. Nothing is mutated:
    the tensors go in through ``functional_call``, and the training flags that eval mode
    changes for the call are restored. The scores are float64 (products of many weights
    overflow float32 in deep networks); on a device without float64 (MPS) the flow runs in
    float64 on the CPU and the scores come back as float32 on the device.
    Iterate it with :func:`fprune.iterative` (SynFlow
    prunes in 100 rounds). Not traceable: ``torch.compile`` runs it eagerly.

    Args:
        module: the ``torch.nn.Module``.
        params: a flat dict keyed like ``module.named_parameters()`` (a part of them is fine:
            the others are the module's own, and are not scored).
        example_inputs: a tensor or tuple of tensors with the input shapes.
        masks: prior masks (pruned entries score 0).

    Returns:
        A dict like ``params`` of float64 non-negative scores.

    Example:
        >>> import torch, fprune
        >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2, bias=False), torch.nn.Linear(2, 1, bias=False))
        >>> with torch.no_grad():
        ...     _ = model[0].weight.fill_(-1.0), model[1].weight.copy_(torch.tensor([[1.0, 2.0]]))
        >>> scores = fprune.scores.synflow(model, dict(model.named_parameters()), torch.zeros(1, 3))
        >>> scores["0.weight"]
        tensor([[1., 1., 1.],
                [2., 2., 2.]], dtype=torch.float64)
    """
    _tree.check_module_and_params(module, params)
    flat, prior = _params_and_masks(params, masks)
    own = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    for name in params:
        if name in buffers and name not in own:
            raise ValueError(
                f"params[{name!r}] is a buffer of the module, not a parameter: SynFlow scores "
                f"parameters only (the module's buffers enter R as their absolute values); leave "
                f"buffers out of params."
            )
        if name not in own:
            raise ValueError(
                f"params[{name!r}] is not a parameter of the module; expected names from "
                f"module.named_parameters()."
            )
    device = flat.leaves[0].device if flat.leaves else None
    on_host = device is not None and not _torch.has_float64(device)  # MPS: see _synflow_host
    moved = (lambda t: t.to(_SYNFLOW_HOST)) if on_host else (lambda t: t)
    inputs = _ones_like_inputs(example_inputs, _SYNFLOW_HOST if on_host else None)
    names = [_tree.dotted(path) for path in flat.paths]
    scored = [
        moved(_masked(p.detach(), m).abs()).to(torch.float64) for p, m in zip(flat.leaves, prior, strict=True)
    ]
    others = {name: _abs64(moved(t.detach())) for name, t in {**own, **buffers}.items() if name not in params}

    def flow(leaves: list[torch.Tensor]) -> torch.Tensor:
        out = functional_call(module, {**others, **dict(zip(names, leaves, strict=True))}, inputs)
        total = [t.sum() for t in optree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not total:
            raise TypeError("Expected the module's output to hold tensors (R is their sum).")
        return torch.stack(total).sum()

    modes = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        g = grad(flow)(scored)
    finally:
        for m, training in modes:
            m.training = training
    out = [(gi * p).abs().detach() for gi, p in zip(g, scored, strict=True)]
    if on_host and device is not None:
        out = _synflow_host_scores(out, device)
    return _tree.unflatten(flat, out)


# Where SynFlow runs for params on a device without float64.
_SYNFLOW_HOST = torch.device("cpu")


def _synflow_host_scores(scores: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """SynFlow's float64 scores, computed on the CPU, as float32 on a device without float64.

    On such a device (MPS) the whole flow runs on CPU copies in float64 (the same numbers as
    on a device with float64) and the scores come back rounded to float32: ties can appear
    where float64 scores differ in their last bits, and scores above float32's range are inf.
    """
    return [t.to(torch.float32).to(device) for t in scores]


def wanda(params: Params, input_norms: dict, *, masks: Masks = None) -> Scores:
    """Wanda's score ``|W| * ||X_j||_2`` (Sun et al. 2023).

    Each weight named in ``input_norms`` (from :func:`fprune.calibration.input_norms`, keyed by
    the weight's name, shaped to broadcast against it) is multiplied by the norms of its input
    features; leaves without norms score ``|p|``. Wanda compares these scores within each
    output row: select with a per-row selection (or N:M).

    Args:
        params: a pytree of tensors (a flat dict, usually).
        input_norms: ``{name: norms}`` with ``name`` a flat key (dotted path) of ``params`` and
            ``norms`` broadcastable to that leaf's shape.
        masks: prior masks (pruned entries score 0).

    Returns:
        A pytree like ``params`` of non-negative scores.

    Example:
        >>> import torch, fprune
        >>> params = {"fc.weight": torch.tensor([[1.0, -1.0]]), "fc.bias": torch.tensor([-3.0])}
        >>> fprune.scores.wanda(params, {"fc.weight": torch.tensor([[2.0, 0.5]])})
        {'fc.weight': tensor([[2.0000, 0.5000]]), 'fc.bias': tensor([3.])}
    """
    flat, prior = _params_and_masks(params, masks)
    if not isinstance(input_norms, dict):
        raise TypeError(
            f"Expected input_norms to be a dict of weight name -> norms, got {type(input_norms).__name__}."
        )
    names = {_tree.dotted(path): i for i, path in enumerate(flat.paths)}
    norms: list[torch.Tensor | None] = [None] * len(flat.leaves)
    for name, n in input_norms.items():
        if name not in names:
            raise ValueError(
                f"input_norms[{name!r}] names no leaf of params; expected keys among {sorted(names)}."
            )
        if not isinstance(n, torch.Tensor):
            raise TypeError(f"Expected input_norms[{name!r}] to be a tensor, got {type(n).__name__}.")
        shape = tuple(flat.leaves[names[name]].shape)
        try:
            ok = tuple(torch.broadcast_shapes(n.shape, shape)) == shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(
                f"Expected input_norms[{name!r}] to broadcast to the shape of params[{name!r}], "
                f"{shape}, got {tuple(n.shape)}."
            )
        norms[names[name]] = n
    out = []
    for p, m, n in zip(flat.leaves, prior, norms, strict=True):
        s = _masked(p.detach(), m).abs()
        out.append(s if n is None else s * n.detach())
    return _tree.unflatten(flat, out)


# ----------------------------------------------------------------------------------------------
# Shared machinery


def _params_and_masks(params: Params, masks: Masks) -> tuple[_tree.Flat, list[torch.Tensor | None]]:
    flat = _tree.flatten(params, "params")
    prior = [None] * len(flat.leaves) if masks is None else _tree.check_masks(flat, masks)
    return flat, prior


def _masked(p: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``p * mask`` as torch.nn.utils.prune (and fprune.apply_masks) computes it."""
    return p if mask is None else p * mask.to(p.dtype)


def _abs64(t: torch.Tensor) -> torch.Tensor:
    t = t.abs() if t.dtype != torch.bool else t
    return t.to(torch.float64) if t.is_floating_point() else t


def _ones_like_inputs(example_inputs: Any, device: Any = None) -> tuple:
    items = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    out = []
    for i, x in enumerate(items):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"Expected example_inputs to be a tensor or a tuple of tensors, got "
                f"{type(x).__name__} at position {i}."
            )
        dtype = torch.float64 if x.is_floating_point() or x.is_complex() else x.dtype
        out.append(torch.ones(x.shape, dtype=dtype, device=x.device if device is None else device))
    return tuple(out)


def _read_batches(batches: Any, name: str) -> list:
    if isinstance(batches, torch.Tensor) or not isinstance(batches, Iterable):
        raise TypeError(
            f"Expected batches to be an iterable of batches (one batch is [batch]), got "
            f"{type(batches).__name__}."
        )
    if isinstance(batches, Mapping):
        raise TypeError(
            f"Expected batches to be an iterable of batches, got a {type(batches).__name__} "
            f"(one batch? pass [batch])."
        )
    out = list(batches)
    if not out:
        raise ValueError(f"Expected at least one batch in batches for {name}, got none.")
    return out


_CAPTURED_HINT = (
    "{name}: loss_fn updates a tensor it does not take as an input, in place ({error}). Most "
    "often that is BatchNorm's running statistics in training mode: call model.eval() before "
    "scoring, or pass copies of the buffers in, e.g. lambda p, b: loss(functional_call(model, "
    "{{**{{k: v.clone() for k, v in model.named_buffers()}}, **p}}, (b[0],)), b[1])."
)


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _explained(method: _Method) -> _Method:
    """torch.func's error for an in-place update of a captured tensor, said in the user's terms."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any) -> Any:
        try:
            return method(self, *args)
        except RuntimeError as error:
            if "mutate a captured Tensor" not in str(error):
                raise
            first = str(error).split(".")[0]
            raise RuntimeError(_CAPTURED_HINT.format(name=self.name, error=first)) from error

    return cast(_Method, wrapper)


class _GradRun:
    """The checked inputs of a gradient score: detached leaves, masks, batches, the loss."""

    def __init__(self, loss_fn: Any, params: Params, batches: Any, masks: Masks, name: str):
        if not callable(loss_fn):
            raise TypeError(
                f"Expected loss_fn to be a callable (params, batch) -> 0-dim tensor, got {loss_fn!r}."
            )
        self.flat, self.prior = _params_and_masks(params, masks)
        for path, p in zip(self.flat.paths, self.flat.leaves, strict=True):
            if not (p.is_floating_point() or p.is_complex()):
                raise TypeError(
                    f"Expected every leaf of params to be a floating-point tensor ({name} "
                    f"differentiates the loss with respect to each), got {p.dtype} at "
                    f"params[{_tree.dotted(path)!r}]. Leave buffers out of params: loss_fn can "
                    f"run the module on its own buffers."
                )
        self.batches = _read_batches(batches, name)
        self.loss_fn = loss_fn
        self.name = name
        self.leaves = [p.detach() for p in self.flat.leaves]
        # The weights multiplied into a score: the pruned ones, so pruned entries score 0.
        self.pruned = [_masked(p, m) for p, m in zip(self.leaves, self.prior, strict=True)]

    def loss(self, leaves: list[torch.Tensor], batch: Any) -> torch.Tensor:
        masked = [_masked(p, m) for p, m in zip(leaves, self.prior, strict=True)]
        out = self.loss_fn(_tree.unflatten(self.flat, masked), batch)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"Expected loss_fn to return a 0-dim tensor, got {type(out).__name__}.")
        if out.dim() != 0:
            raise ValueError(
                f"Expected loss_fn to return a 0-dim tensor (a scalar loss), got shape {tuple(out.shape)}."
            )
        return out

    @_explained
    def summed_grad(self) -> list[torch.Tensor]:
        total: list[torch.Tensor] | None = None
        for batch in self.batches:
            g = grad(self.loss)(self.leaves, batch)
            total = g if total is None else [a + b for a, b in zip(total, g, strict=True)]
        assert total is not None  # batches is not empty (checked on construction)
        return total

    @_explained
    def fisher(self) -> list[torch.Tensor]:
        def one(leaves: list[torch.Tensor], example: Any) -> list[torch.Tensor]:
            return grad(self.loss)(leaves, optree.tree_map(lambda t: t.unsqueeze(0), example))

        total: list[torch.Tensor] | None = None
        for batch in self.batches:
            for t in optree.tree_leaves(batch):
                if not isinstance(t, torch.Tensor) or t.dim() == 0:
                    raise TypeError(
                        "Expected every leaf of a batch to be a tensor with examples along dim 0, "
                        f"got {type(t).__name__ if not isinstance(t, torch.Tensor) else 'a 0-dim tensor'}."
                    )
            per_example = vmap(one, in_dims=(None, 0))(self.leaves, batch)
            sq = [g.square().sum(0) for g in per_example]
            total = sq if total is None else [a + b for a, b in zip(total, sq, strict=True)]
        assert total is not None  # batches is not empty (checked on construction)
        return total

    @_explained
    def hessian_vector(self, v: list[torch.Tensor]) -> list[torch.Tensor]:
        total: list[torch.Tensor] | None = None
        for batch in self.batches:
            gradient = lambda leaves, *, batch=batch: grad(self.loss)(leaves, batch)
            try:
                hv = jvp(gradient, (self.leaves,), (v,))[1]
            except NotImplementedError as error:
                # Some ops have no forward-mode derivative (CPU flash attention, for one):
                # reverse over reverse gives the same product, H being symmetric.
                if "forward AD" not in str(error):
                    raise
                vjp_fn = vjp(gradient, self.leaves)[1]
                (hv,) = vjp_fn(v)
            total = hv if total is None else [a + b for a, b in zip(total, hv, strict=True)]
        assert total is not None  # batches is not empty (checked on construction)
        return total

    def result(self, leaves: list[torch.Tensor]) -> Scores:
        # Detached: loss_fn may close over tensors that require grad (a module's own params).
        return _tree.unflatten(self.flat, [t.detach() for t in leaves])
