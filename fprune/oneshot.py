"""One-shot post-training pruning, layer by layer: SparseGPT, Wanda and magnitude on a model.

:func:`prune` runs the pipeline of SparseGPT's ``opt_sequential`` / ``llama_sequential`` and
Wanda's ``prune_wanda`` (IST-DASLab/sparsegpt, locuslab/wanda):

1. The model's repeated blocks are found (the ``nn.ModuleList`` of transformer layers:
   ``transformer.h``, ``model.layers``, ``bert.encoder.layer``; ``blocks=`` names them
   otherwise), and the first block's inputs are captured once per calibration batch, with the
   keyword arguments the model passes it (attention masks, position ids and embeddings), by a
   forward pre-hook that stops the forward there (their ``Catcher``, as a hook).
2. For each block in turn: the statistic its layers' method needs (SparseGPT's hessians
   ``2/n sum x x^T``, Wanda's input norms, or none) is collected from the block's current
   inputs, which come from the blocks already pruned; each layer is pruned by the method
   (a :class:`LayerMethod`: a mask, and for SparseGPT a weight update); then the pruned block
   runs on the same inputs and its outputs replace them as the next block's inputs.

A method is an object that says which statistic it needs and solves one layer
(:class:`SparseGPT`, :class:`Wanda`, :class:`Magnitude`, and :class:`Refine` around any of
them); a per-block sparsity profile is any callable (:class:`OWL` is one). Embeddings, the
LM head, norms and every parameter outside the blocks stay dense. Every forward runs through
``torch.func.functional_call`` with the given params; hooks are removed on exit, also on
errors. With ``inplace=True`` the pruned weights are written into the given tensors (the
module's own where ``params`` does not name them), block by block, so that the memory beyond
the model is one block's work.
"""

from __future__ import annotations

import inspect
import math
import numbers
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sized
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch.func import functional_call

from fprune import _observe, _tree, distributions, reconstruct
from fprune._types import Masks, Params
from fprune.select import NM, Rows, select

__all__ = [
    "OWL",
    "BlockReport",
    "LayerMethod",
    "Magnitude",
    "Refine",
    "SparseGPT",
    "Wanda",
    "find_blocks",
    "prune",
]

_STATISTICS = ("hessian", "norms", "none")


# ---------------------------------------------------------------------------------------------
# Layer methods


class LayerMethod:
    """A post-training method for one linear layer: the statistic it needs, and the solve.

    A subclass sets ``statistic`` (``"hessian"``: ``H = 2/n sum x x^T`` of the layer's inputs,
    ``(in, in)``; ``"norms"``: the L2 norm of each input feature over the calibration rows,
    ``(1, in)``; ``"none"``: no data) and overrides :meth:`prune_layer`. :func:`prune` runs
    the rest: the blocks, the statistics, the float32 work copy, the write-back.

    Example:
        >>> import torch, fprune
        >>> class Random(fprune.oneshot.LayerMethod):     # a method that needs no data
        ...     statistic = "none"
        ...     def prune_layer(self, weight, statistic, amount=None, *, n_m=None):
        ...         scores = torch.rand(weight.shape, generator=torch.Generator().manual_seed(0))
        ...         keep = fprune.l1_unstructured({"w": weight}, amount, importance_scores={"w": scores})["w"]
        ...         return weight * keep, keep
        >>> new, keep = Random().prune_layer(torch.ones(4, 4), None, 0.25)
        >>> int((~keep).sum()), float(new.sum())
        (4, 12.0)
    """

    statistic: ClassVar[str] = "none"

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prune one layer: ``(weight, keep-mask)`` for ``weight`` ``(out, in)``.

        Args:
            weight: ``(out, in)`` float32 work copy (float64 for a float64 model; a ``Conv1D``
                weight transposed). Do not modify it.
            statistic: what ``statistic`` names (``None`` for ``"none"``).
            amount: the fraction of the layer to prune, or ``None`` with ``n_m``.
            n_m: ``(n, m)``: keep ``n`` of every ``m`` consecutive inputs of each output.

        Returns:
            The new weight (zero where pruned) and its ``torch.bool`` keep-mask, both
            ``(out, in)``.
        """
        raise NotImplementedError(f"{type(self).__name__} must override prune_layer")


@dataclass(frozen=True)
class SparseGPT(LayerMethod):
    """SparseGPT (Frantar & Alistarh 2023): :func:`fprune.reconstruct.sparsegpt` with the
    layer's hessian, the mask and the update of the kept weights.

    Args:
        blocksize: columns per block (the reference's 128).
        damp: the damping, a fraction of the mean of ``diag H`` (the reference's ``percdamp``).
    """

    blocksize: int = 128
    damp: float = 0.01
    statistic: ClassVar[str] = "hessian"

    def __post_init__(self) -> None:
        reconstruct.check_positive_int(self.blocksize, "blocksize")
        reconstruct.check_damp(self.damp)

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert statistic is not None  # the pipeline gives the hessian
        return reconstruct.sparsegpt(
            weight, statistic, amount, n_m=n_m, blocksize=self.blocksize, damp=self.damp
        )


@dataclass(frozen=True)
class Wanda(LayerMethod):
    """Wanda (Sun et al. 2024): scores ``|W| * ||x_j||`` (:func:`fprune.scores.wanda`), the
    lowest ``round(amount * in)`` of each output row pruned (``fprune.select.Rows``), or N:M
    along the inputs; the kept weights unchanged."""

    statistic: ClassVar[str] = "norms"

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert statistic is not None  # the pipeline gives the norms
        scores = weight.abs().float() * statistic
        if n_m is not None:
            keep = select({"w": scores}, None, scope=NM(n_m[0], n_m[1], -1))["w"]
        else:
            keep = select({"w": scores}, amount, scope=Rows(0))["w"]
        return weight * keep, keep


@dataclass(frozen=True)
class Magnitude(LayerMethod):
    """Magnitude: the lowest ``|W|`` of the whole layer (``round(amount * numel)``, as
    :func:`fprune.l1_unstructured`), or N:M; needs no data (no forward runs unless a profile or
    :class:`Refine` asks for one)."""

    statistic: ClassVar[str] = "none"

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = weight.abs()
        if n_m is not None:
            keep = select({"w": scores}, None, scope=NM(n_m[0], n_m[1], -1))["w"]
        else:
            keep = select({"w": scores}, amount)["w"]
        return weight * keep, keep


@dataclass(frozen=True)
class Refine(LayerMethod):
    """Any method, then the least squares on its mask (:func:`fprune.reconstruct.refine`, from
    the method's weights): needs the hessian (a method that needs norms gets ``sqrt(diag H)``,
    which ranks as the norms do).

    Args:
        method: the :class:`LayerMethod` (or its name) that chooses the mask.
        iters: conjugate-gradient steps.
        damp: ridge, a fraction of ``mean(diag H)``.
    """

    method: LayerMethod | str = "sparsegpt"
    iters: int = 30
    damp: float = 0.0
    statistic: ClassVar[str] = "hessian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", _method(self.method, "Refine's method"))
        reconstruct.check_positive_int(self.iters, "iters", zero_ok=True)
        reconstruct.check_damp(self.damp)

    def prune_layer(
        self,
        weight: torch.Tensor,
        statistic: torch.Tensor | None,
        amount: float | None = None,
        *,
        n_m: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert statistic is not None and isinstance(self.method, LayerMethod)
        inner = {"hessian": statistic, "norms": statistic.diagonal().sqrt().view(1, -1), "none": None}
        new, keep = self.method.prune_layer(weight, inner[self.method.statistic], amount, n_m=n_m)
        return reconstruct.refine(weight, statistic, keep, init=new, iters=self.iters, damp=self.damp), keep


_SHORTHANDS: dict[str, Callable[[], LayerMethod]] = {
    "sparsegpt": SparseGPT,
    "wanda": Wanda,
    "magnitude": Magnitude,
}


def _method(method: Any, name: str = "method") -> LayerMethod:
    if isinstance(method, str) and method in _SHORTHANDS:
        return _SHORTHANDS[method]()
    if not isinstance(method, LayerMethod):
        raise (TypeError if not isinstance(method, str) else ValueError)(
            f"Expected {name} to be one of {', '.join(map(repr, _SHORTHANDS))} or a "
            f"fprune.oneshot.LayerMethod (SparseGPT(), Wanda(), Magnitude(), Refine(...)), got {method!r}."
        )
    if method.statistic not in _STATISTICS:
        raise ValueError(
            f"Expected {name}.statistic to be one of {', '.join(map(repr, _STATISTICS))}, got "
            f"{method.statistic!r}."
        )
    return method


# ---------------------------------------------------------------------------------------------
# Sparsity profiles


@dataclass(frozen=True)
class OWL:
    """The OWL sparsity profile (:func:`fprune.distributions.owl`, Yin et al. 2024): per-block
    sparsities from the outlier ratios of a dense calibration pass; ``m`` and ``lam``.

    ``profile="owl"`` is ``OWL()``: ``m=5``, ``lam=0.08``, the paper's values. As every
    profile, it is called ``profile(weights, sparsity, blocks=..., norms=...)`` and returns
    per-layer amounts; ``needs_norms`` asks :func:`prune` for the dense pass.
    """

    m: float = 5.0
    lam: float = 0.08
    needs_norms: ClassVar[bool] = True

    def __call__(
        self,
        weights: dict[str, torch.Tensor],
        sparsity: float,
        *,
        blocks: dict[str, int],
        norms: dict[str, torch.Tensor] | None,
    ) -> dict[str, float | None]:
        assert norms is not None
        return distributions.owl(
            weights,
            norms,
            sparsity,
            blocks=blocks,
            m=self.m,
            lam=self.lam,
            where=lambda name, p: name in norms,
        )


Profile = Callable[..., Mapping[str, Any]]


def _profile(profile: Any) -> Profile | None:
    if profile is None:
        return None
    if profile == "owl":
        return OWL()
    if not callable(profile) or isinstance(profile, str):
        raise TypeError(
            f"Expected profile to be None, 'owl', fprune.oneshot.OWL(m, lam) or a callable "
            f"(weights, sparsity, *, blocks, norms) -> amounts, got {profile!r}."
        )
    return profile


# ---------------------------------------------------------------------------------------------
# Progress


class BlockReport(NamedTuple):
    """One step of :func:`prune`, handed to ``progress`` when it is a callable.

    ``phase`` is ``"capture"`` (a batch run up to the first block: ``number`` counts batches,
    ``total`` is 0 when ``batches`` has no length), ``"norms"`` (OWL's dense pass over one
    block; its time in ``statistics_seconds``) or ``"prune"`` (one block).
    """

    number: int  # the step's position in its phase, 0-based
    total: int  # steps in the phase (0: unknown)
    name: str  # the block's module name
    layers: int  # layers pruned in it
    statistics_seconds: float  # running the block on its inputs with hooks (hessians, norms)
    pruning_seconds: float  # masks and weight updates
    forward_seconds: float  # running the pruned block for the next block's inputs
    phase: str = "prune"
    elapsed_seconds: float = 0.0  # since prune was called
    remaining_seconds: float | None = None  # estimate for the rest of the phase (None: unknown)


class _Progress:
    """Reports to a callable, to tqdm bars (one per phase) or to stderr lines."""

    _LABELS: ClassVar[dict[str, str]] = {"capture": "capture", "norms": "OWL norms", "prune": "blocks"}

    def __init__(self, progress: Any) -> None:
        self.callback = progress if callable(progress) and not isinstance(progress, bool) else None
        self.on = bool(progress)
        self.tqdm = _tqdm() if progress is True else None
        self.bar: Any = None
        self.started = time.perf_counter()
        self.phase_started = self.started
        self.phase = ""
        self.total = 0

    def start(self, phase: str, total: int) -> None:
        self.close()
        self.phase, self.total, self.phase_started = phase, total, time.perf_counter()
        if self.on and self.tqdm is not None:
            self.bar = self.tqdm(
                total=total or None,
                desc=f"oneshot.prune: {self._LABELS[phase]}",
                file=sys.stderr,
                unit="step",
            )

    def step(
        self, number: int, name: str, layers: int = 0, seconds: tuple[float, float, float] = (0.0, 0.0, 0.0)
    ) -> None:
        if not self.on:
            return
        now = time.perf_counter()
        done = number + 1
        remaining = (now - self.phase_started) / done * (self.total - done) if self.total else None
        report = BlockReport(
            number,
            self.total,
            name,
            layers,
            *seconds,
            phase=self.phase,
            elapsed_seconds=now - self.started,
            remaining_seconds=remaining,
        )
        if self.callback is not None:
            self.callback(report)
        elif self.bar is not None:
            self.bar.set_postfix_str(name, refresh=False)
            self.bar.update(1)
        else:
            print(_line(report), file=sys.stderr, flush=True)  # noqa: T201 (progress=True, documented)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _line(r: BlockReport) -> str:
    of = f"{r.number + 1}/{r.total}" if r.total else f"{r.number + 1}"
    left = "" if r.remaining_seconds is None else f", ~{r.remaining_seconds:.1f} s left"
    times = f"{r.elapsed_seconds:.1f} s elapsed{left}"
    if r.phase == "capture":
        return f"oneshot.prune: capture of {r.name}'s inputs, batch {of}: {times}"
    if r.phase == "norms":
        return f"oneshot.prune: OWL's dense pass, block {of} {r.name}: {r.statistics_seconds:.1f} s; {times}"
    return (
        f"oneshot.prune: block {of} {r.name}: {r.layers} layers, statistics {r.statistics_seconds:.1f} s, "
        f"pruning {r.pruning_seconds:.1f} s, outputs {r.forward_seconds:.1f} s; {times}"
    )


def _tqdm() -> Any:
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]  # optional: plain stderr lines without it
    except ImportError:
        return None
    return tqdm


# ---------------------------------------------------------------------------------------------
# The pipeline


class _Stop(Exception):
    """Raised by the capture hook to end the model's forward at the first block."""


@torch.no_grad()
def prune(
    module: torch.nn.Module,
    params: Params,
    batches: Iterable[Any],
    sparsity: float | dict | None,
    *,
    method: str | LayerMethod = "sparsegpt",
    n_m: tuple[int, int] | None = None,
    profile: str | Profile | None = None,
    where: _tree.Where = None,
    blocks: str | list[str] | None = None,
    inplace: bool = False,
    masks: str | None = "pruned",
    kwargs: dict | None = None,
    progress: bool | Callable[[BlockReport], None] = False,
) -> tuple[Params, Masks]:
    """Prune a model's blocks one at a time from calibration data: SparseGPT, Wanda, magnitude.

    Each linear layer (``nn.Linear``, transformers' ``Conv1D``) inside the blocks that ``where``
    selects is pruned by ``method``, a :class:`LayerMethod` (or its shorthand):
    ``"sparsegpt"`` is :class:`SparseGPT` ``()``, ``"wanda"`` :class:`Wanda` ``()``,
    ``"magnitude"`` :class:`Magnitude` ``()``; :class:`Refine` ``(method)`` adds the least
    squares on the method's mask. The method sees the weight as ``(out, in)`` in float32
    (float64 for a float64 model), one layer at a time, and its result is written back in the
    weight's dtype.

    Memory: besides the model, the captured inputs of the current block (replaced by its
    outputs batch by batch), one block's statistics (a hessian is freed once its layer is
    pruned), one layer's float32 work, and what is returned. ``inplace=False`` returns new
    weights for the pruned layers beside the given ones; ``inplace=True`` writes each block's
    pruned weights into the given tensors (``params[name]``, or the module's own parameter
    where ``params`` does not name it), so nothing grows with the number of blocks but the
    masks (``masks=None``: none).

    Args:
        module: the model (for instance a transformers ``GPT2LMHeadModel``, in ``eval()`` mode).
        params: a flat dict keyed like ``module.named_parameters()`` (a part is fine; the others
            are the module's own).
        batches: calibration batches, read once: a tensor is called as ``module(b)``, a tuple as
            ``module(*b)``, a dict as ``module(**b)`` (``{"input_ids": ...}``).
        sparsity: the fraction of each pruned layer to prune (a float in [0, 1]), or per-leaf
            amounts (a dict ``{weight name: fraction or None}``; ``None`` or a missing name: not
            pruned). With ``n_m``: ``None``, or ``1 - n / m`` (``0.5`` with ``(2, 4)``).
        method: a :class:`LayerMethod`, or ``"sparsegpt"``, ``"wanda"``, ``"magnitude"``.
        n_m: ``(n, m)``: keep ``n`` of every ``m`` consecutive inputs of each output (2:4 is
            ``(2, 4)``).
        profile: per-block sparsities from one float ``sparsity``: ``"owl"`` or :class:`OWL`
            (OWL's, from a dense calibration pass), or any callable
            ``profile(weights, sparsity, *, blocks, norms) -> {weight name: fraction or None}``
            (``weights``: the selected layers' weights by name; ``blocks``: their block's
            position; ``norms``: their dense input norms if the callable has a true
            ``needs_norms`` attribute, else ``None``). Not with N:M.
        where: ``where(name, weight) -> bool`` (or ``where(weight)``) picks, among the linear
            layers inside the blocks, the ones to prune (all when ``None``).
        blocks: the blocks, in the order the model runs them: the name of a container module
            (``"transformer.h"``) or a list of module names. Default: :func:`find_blocks`.
        inplace: write the pruned weights into the given tensors, block by block (see Memory).
        masks: the keep-masks returned: ``"pruned"`` (the layers pruned), ``"all"`` (all
            ``True`` for every other parameter too, as the whole-model mask functions give), or
            ``None`` (none: ``weight != 0`` gives them back but for kept zeros).
        kwargs: keyword arguments added to every call of ``module`` (``use_cache=False`` is added
            for models whose ``forward`` takes ``use_cache``, so that no cache is kept).
        progress: ``True`` reports every step (each batch of the capture, each block of OWL's
            dense pass, each block pruned) with the time elapsed and an estimate of what remains
            of the phase: tqdm bars when tqdm is installed, lines on stderr otherwise; a callable
            receives a :class:`BlockReport` per step.

    Returns:
        ``(params, masks)``: a flat dict keyed like ``module.named_parameters()`` of every
        parameter (with ``inplace=False`` new tensors for the pruned weights, the given or the
        module's own for the others; with ``inplace=True`` the given or the module's own tensors
        themselves, now pruned), and the ``torch.bool`` keep-masks as ``masks`` asks. Run the
        pruned model with ``torch.func.functional_call(module, params, ...)`` (or, after
        ``inplace=True``, as it is).

    Raises:
        TypeError / ValueError: bad arguments (each named), ``blocks``/``where`` that select no
            linear layer, a meta-device module, a param of the wrong shape or an unknown key,
            NaN or inf in a selected weight or in a layer's statistics (naming the layer), an
            empty calibration batch, no blocks found, a first block that the batches never
            reach; all before anything is changed, except a failure inside a layer's solve
            (:func:`fprune.reconstruct.sparsegpt`'s factorization, a statistic that turns NaN
            after the first block), which with ``inplace=True`` leaves the blocks before it
            pruned.

    Warns:
        UserWarning: a module in training mode (dropout on during calibration); selected layers
            that received no input (left dense by methods that need data).

    Example:
        >>> import torch, fprune
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.embed = torch.nn.Linear(8, 16)
        ...         self.blocks = torch.nn.ModuleList(
        ...             torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()) for _ in range(3))
        ...     def forward(self, x):
        ...         x = self.embed(x)
        ...         for block in self.blocks:
        ...             x = block(x)
        ...         return x
        >>> model = Net().eval()
        >>> params = dict(model.named_parameters())
        >>> batches = [torch.randn(32, 8) for _ in range(4)]
        >>> new, masks = fprune.oneshot.prune(model, params, batches, 0.5,
        ...                                   method=fprune.oneshot.SparseGPT(blocksize=8))
        >>> sorted(masks)                                  # the blocks' weights
        ['blocks.0.0.weight', 'blocks.1.0.weight', 'blocks.2.0.weight']
        >>> float(fprune.sparsity({"w": masks["blocks.0.0.weight"]}).overall)
        0.5
        >>> _ = fprune.oneshot.prune(model, params, batches, 0.5, inplace=True)
        >>> float((model.blocks[0][0].weight == 0).float().mean())    # the module's own, pruned
        0.5
    """
    plan = _plan(
        module,
        params,
        batches,
        sparsity,
        method,
        n_m,
        profile,
        where,
        blocks,
        inplace,
        masks,
        kwargs,
        progress,
    )
    if module.training:
        warnings.warn(
            "oneshot.prune: the module is in training mode, so dropout is active while the "
            "statistics are collected; call module.eval() first (prune does not change it).",
            UserWarning,
            stacklevel=3,
        )
    report = _Progress(progress)
    try:
        calls = None
        if plan.needs_data:
            calls = _capture(module, params, batches, kwargs, plan.blocks, report)
        if plan.profile is not None:
            plan.amounts = _profile_amounts(plan, calls, report)
        report.start("prune", len(plan.blocks))
        for b in range(len(plan.blocks)):
            _prune_block(plan, b, calls, report)
    finally:
        report.close()
    if masks == "all":
        plan.masks = {
            name: plan.masks[name] if name in plan.masks else torch.ones_like(p, dtype=torch.bool)
            for name, p in plan.params.items()
        }
    return plan.params, plan.masks


class _Plan:
    """What :func:`prune` does, decided (and checked) before anything runs."""

    def __init__(self) -> None:
        self.module: torch.nn.Module
        self.method: LayerMethod
        self.n_m: tuple[int, int] | None = None
        self.sparsity: float | None = None  # the one float a profile spreads
        self.profile: Profile | None = None
        self.blocks: list[str] = []
        self.layers: list[list[_observe.Layer]] = []  # by block
        self.amounts: dict[str, Any] = {}
        self.inplace = False
        self.keep_masks = True
        self.targets: dict[str, torch.Tensor] = {}  # where inplace=True writes
        self.params: dict[str, torch.Tensor] = {}  # what the blocks run with, and is returned
        self.masks: dict[str, torch.Tensor] = {}

    @property
    def needs_data(self) -> bool:
        return self.method.statistic != "none" or bool(getattr(self.profile, "needs_norms", False))


def _plan(
    module: Any,
    params: Any,
    batches: Any,
    sparsity: Any,
    method: Any,
    n_m: Any,
    profile: Any,
    where: Any,
    blocks: Any,
    inplace: Any,
    masks: Any,
    kwargs: Any,
    progress: Any,
) -> _Plan:
    """Every check that can be made before the first forward, and the layers to prune."""
    plan = _Plan()
    _observe.check(module, params, batches, where, kwargs)
    plan.module = module
    plan.method = _method(method)
    plan.n_m, sparsity = _check_sparsity(sparsity, n_m)
    plan.profile = _profile(profile)
    if plan.profile is not None:
        if plan.n_m is not None or isinstance(sparsity, dict):
            raise ValueError(
                f"Expected profile={profile!r} with one sparsity (a float): a profile sets "
                f"per-block fractions, which N:M and given per-leaf amounts leave no room for."
            )
        plan.sparsity = float(sparsity)
    for name, value in (("inplace", inplace),):
        if not isinstance(value, bool):
            raise TypeError(f"Expected {name} to be a bool, got {value!r}.")
    if masks not in ("pruned", "all", None):
        raise ValueError(f"Expected masks to be 'pruned', 'all' or None, got {masks!r}.")
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        raise TypeError(f"Expected progress to be a bool or a callable, got {progress!r}.")
    plan.inplace, plan.keep_masks = inplace, masks is not None
    plan.blocks = _block_names(module, blocks)
    plan.layers = [[] for _ in plan.blocks]
    for layer in _observe.linear_layers(module, params, where):
        for b, prefix in enumerate(plan.blocks):
            if layer.name.startswith(prefix + "."):
                plan.layers[b].append(layer)
                break
    selected = [layer for group in plan.layers for layer in group]
    if not selected:
        raise ValueError(
            f"oneshot.prune: no linear layer (nn.Linear, Conv1D) to prune: blocks={blocks!r} "
            f"({_tree.listing(plan.blocks)}) and where={where!r} select none; check them "
            f"(find_blocks(module) gives the default blocks)."
        )
    names = {layer.name for layer in selected}
    if isinstance(sparsity, dict):
        stray = sorted(k for k, v in sparsity.items() if v is not None and k not in names)
        if stray:
            raise ValueError(
                f"sparsity has amounts for {_tree.listing([repr(k) for k in stray])}, which are not "
                f"weights of the linear layers inside the blocks that where= selects; only those "
                f"are pruned (give them None, or leave them out)."
            )
        plan.amounts = {name: sparsity.get(name) for name in names}
    else:
        plan.amounts = dict.fromkeys(names, sparsity)
    if plan.n_m is None and all(v is None for v in plan.amounts.values()):
        raise ValueError(
            "oneshot.prune: sparsity gives no amount to any of the linear layers selected "
            f"({_tree.listing(sorted(map(repr, names)))}); nothing would be pruned."
        )
    for layer in selected:
        _check_layer(layer, plan.n_m)
    own = dict(module.named_parameters())
    plan.targets = {name: params.get(name, p) for name, p in own.items()}
    plan.params = {name: t if inplace else t.detach() for name, t in plan.targets.items()}
    return plan


def _check_sparsity(sparsity: Any, n_m: Any) -> tuple[tuple[int, int] | None, Any]:
    """``(n_m, sparsity)`` checked; ``sparsity`` equal to ``1 - n/m`` with ``n_m`` becomes None."""
    if n_m is not None:
        n, m = reconstruct.check_n_m(n_m, 0)  # the pair; each layer's width is checked later
        if sparsity is not None and (
            isinstance(sparsity, bool)
            or not isinstance(sparsity, numbers.Real)
            or not math.isclose(float(sparsity), 1 - n / m, rel_tol=0, abs_tol=1e-9)
        ):
            raise ValueError(
                f"Expected sparsity=None or {1 - n / m:.6g} (= 1 - {n}/{m}) with n_m={n_m!r}: N:M "
                f"prunes {m - n} of every {m}; got sparsity={sparsity!r}."
            )
        return (n, m), None
    if isinstance(sparsity, dict):
        for name, value in sparsity.items():
            if value is not None:
                reconstruct.check_fraction(value, f"sparsity[{name!r}]")
        return None, sparsity
    if sparsity is None:
        raise ValueError(
            "Expected sparsity (a fraction in [0, 1], or per-leaf amounts), or n_m, got neither."
        )
    reconstruct.check_fraction(sparsity, "sparsity")
    return None, float(sparsity)


def _check_layer(layer: _observe.Layer, n_m: tuple[int, int] | None) -> None:
    weight = layer.weight
    if not weight.is_floating_point():
        raise TypeError(
            f"oneshot.prune: expected the weight of layer {layer.name!r} to be floating-point, got "
            f"{weight.dtype}."
        )
    if not bool(torch.isfinite(weight).all()):
        raise ValueError(f"oneshot.prune: the weight of layer {layer.name!r} holds NaN or inf.")
    if n_m is not None:
        cols = weight.shape[0] if layer.transposed else weight.shape[-1]
        if cols % n_m[1]:
            raise ValueError(
                f"oneshot.prune: expected the in_features ({cols}) of layer {layer.name!r} to be a "
                f"multiple of m={n_m[1]} for n_m={n_m!r} (groups of m consecutive inputs)."
            )


def _prune_block(plan: _Plan, b: int, calls: list | None, report: _Progress) -> None:
    """Statistics, pruning and outputs of block ``b``; its outputs replace ``calls`` in place."""
    prefix = plan.blocks[b]
    block = plan.module.get_submodule(prefix)
    group = [layer for layer in plan.layers[b] if plan.amounts.get(layer.name) is not None or plan.n_m]
    statistic = plan.method.statistic
    started = time.perf_counter()
    sums: Any = None
    if group and statistic != "none" and calls is not None:
        sums = _observe.Gram() if statistic == "hessian" else _observe.SumSquares()
        local = _local_params(plan.params, prefix)
        with _observe.observing(group, sums):
            for args, kw in calls:
                functional_call(block, local, args, kw)
        _observe.warn_silent("oneshot.prune", group, sums.sums, "They are left dense", stacklevel=5)
        bad = sorted(name for name, total in sums.sums.items() if not bool(torch.isfinite(total).all()))
        if bad:
            raise ValueError(
                f"oneshot.prune: the inputs of {_tree.listing([repr(n) for n in bad])} in block "
                f"{prefix!r} hold NaN or inf (their statistics are not finite); check the model "
                f"and the calibration batches."
            )
    gathered = time.perf_counter()
    pruned = 0
    for layer in group:
        if sums is not None and layer.name not in sums.sums:
            continue  # no input reached it: left dense (warned above)
        _prune_layer(plan, layer, sums)
        pruned += 1
    done = time.perf_counter()
    if calls is not None and b + 1 < len(plan.blocks):
        local = _local_params(plan.params, prefix)
        for i, call in enumerate(calls):  # replaced one by one: one set of activations at a time
            calls[i] = _advance(call, functional_call(block, local, *call))
    report.step(b, prefix, pruned, (gathered - started, done - gathered, time.perf_counter() - done))


def _prune_layer(plan: _Plan, layer: _observe.Layer, sums: Any) -> None:
    """Prune one layer by the plan's method; write the result back (in the weight's dtype)."""
    weight = plan.params[layer.name]
    W = weight.T if layer.transposed else weight  # (out, in)
    work = W.to(torch.promote_types(W.dtype, torch.float32))
    statistic = None
    if isinstance(sums, _observe.Gram):
        statistic = sums.hessian(layer.name, work.dtype)  # the float64 sum is freed
    elif isinstance(sums, _observe.SumSquares):
        statistic = sums.sums.pop(layer.name).to(torch.float32).sqrt().view(1, -1)
    amount = None if plan.n_m is not None else plan.amounts[layer.name]
    new, keep = plan.method.prune_layer(work, statistic, amount, n_m=plan.n_m)
    del statistic, work
    if layer.transposed:
        new, keep = new.T, keep.T
    if plan.inplace:
        plan.targets[layer.name].copy_(new)
    else:
        plan.params[layer.name] = new.to(weight.dtype).contiguous()
    if plan.keep_masks:
        plan.masks[layer.name] = keep.contiguous()


def _profile_amounts(plan: _Plan, calls: list | None, report: _Progress) -> dict[str, Any]:
    """The profile's per-layer amounts (after OWL's dense pass, for a profile that needs norms)."""
    assert plan.profile is not None and plan.sparsity is not None
    index = {layer.name: b for b, group in enumerate(plan.layers) for layer in group}
    weights = {layer.name: plan.params[layer.name] for group in plan.layers for layer in group}
    norms = None
    if getattr(plan.profile, "needs_norms", False):
        assert calls is not None
        norms = _dense_norms(plan, calls, report)
    amounts = plan.profile(weights, plan.sparsity, blocks=index, norms=norms)
    if not isinstance(amounts, Mapping):
        raise TypeError(f"Expected the profile to return a dict of weight name -> fraction, got {amounts!r}.")
    stray = sorted(str(k) for k in amounts if k not in index and amounts[k] is not None)
    if stray:
        raise ValueError(
            f"The profile gave amounts for {_tree.listing([repr(k) for k in stray])}, which are not "
            f"among the layers selected."
        )
    for name, value in amounts.items():
        if value is not None:
            reconstruct.check_fraction(value, f"the profile's amount for {name!r}")
    return {name: amounts.get(name) for name in index}


def _dense_norms(plan: _Plan, calls: list, report: _Progress) -> dict:
    """Input norms of every selected layer from a dense pass, block by block (for OWL)."""
    report.start("norms", len(plan.blocks))
    observe = _observe.SumSquares()
    sums = observe.sums
    dense = list(calls)  # the first block's inputs stay for the pruning pass
    for b, prefix in enumerate(plan.blocks):
        started = time.perf_counter()
        block, local = plan.module.get_submodule(prefix), _local_params(plan.params, prefix)
        with _observe.observing(plan.layers[b], observe):
            for i, call in enumerate(dense):
                dense[i] = _advance(call, functional_call(block, local, *call))
        report.step(b, prefix, 0, (time.perf_counter() - started, 0.0, 0.0))
    del dense
    norms = {}
    for group in plan.layers:
        for layer in group:
            if layer.name in sums:
                n = sums[layer.name].sqrt().float()
                norms[layer.name] = n.view(-1, 1) if layer.transposed else n.view(1, -1)
    return norms


def find_blocks(module: torch.nn.Module) -> list[str]:
    """The names of a model's repeated blocks, in order: the children of the ``nn.ModuleList``
    (or ``nn.Sequential``) whose children are all of one class and hold linear layers, the one
    with the most parameters (``transformer.h.0`` ... for GPT-2, ``model.layers.0`` ... for
    Llama, ``bert.encoder.layer.0`` ... for BERT).

    Args:
        module: the model.

    Returns:
        The blocks' module names.

    Raises:
        ValueError: no such container (pass ``blocks=`` to :func:`prune`).

    Example:
        >>> import torch, fprune
        >>> layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        >>> fprune.oneshot.find_blocks(torch.nn.ModuleDict({"embed": torch.nn.Embedding(9, 4), "h": layers}))
        ['h.0', 'h.1', 'h.2']
    """
    best: tuple[int, str, list[str]] | None = None
    for name, container in module.named_modules():
        if not isinstance(container, (torch.nn.ModuleList, torch.nn.Sequential)) or len(container) == 0:
            continue
        children = list(container.named_children())
        kinds = {type(child) for _, child in children}
        if len(kinds) != 1:
            continue
        if not all(any(_observe.is_linear(m) for m in child.modules()) for _, child in children):
            continue
        size = sum(p.numel() for p in container.parameters())
        names = [f"{name}.{child}" if name else child for child, _ in children]
        if best is None or size > best[0]:
            best = (size, name, names)
    if best is None:
        raise ValueError(
            f"Found no repeated blocks in {type(module).__name__} (an nn.ModuleList of modules of one "
            f"class holding linear layers); pass blocks= with the blocks' module names, in the order "
            f"the model runs them."
        )
    return best[2]


# Capture and block calls


def _capture(
    module: torch.nn.Module,
    params: dict[str, torch.Tensor],
    batches: Iterable[Any],
    kwargs: dict | None,
    names: list[str],
    report: _Progress,
) -> list:
    """The first block's ``(args, kwargs)`` for every batch: a pre-hook records them and stops
    the forward (SparseGPT's and Wanda's ``Catcher``, without replacing the block). A later
    block that runs before it means ``blocks`` are out of order: ``ValueError``."""
    extra = dict(kwargs or {})
    if "use_cache" not in extra and "use_cache" in _parameters(module):
        extra["use_cache"] = False
    blocks = [module.get_submodule(name) for name in names]
    captured: list = []

    def hook(block: torch.nn.Module, args: tuple, kw: dict) -> None:
        captured.append((_without_caches(args), _without_caches(kw)))
        raise _Stop

    def too_early(index: int) -> Callable[[torch.nn.Module, tuple], None]:
        def check(block: torch.nn.Module, args: tuple) -> None:
            raise ValueError(
                f"oneshot.prune: block {names[index]!r} ran before the first block {names[0]!r}; "
                f"pass blocks= in the order the model runs them."
            )

        return check

    handles = [blocks[0].register_forward_pre_hook(hook, with_kwargs=True)]
    try:
        for i, block in enumerate(blocks[1:], start=1):
            if block is not blocks[0]:
                handles.append(block.register_forward_pre_hook(too_early(i)))
        seen = 0
        report.start("capture", len(batches) if isinstance(batches, Sized) else 0)
        for args, kw in _observe.calls(batches, extra):
            seen += 1
            try:
                functional_call(module, params, args, kw)
            except _Stop:
                report.step(seen - 1, names[0])
                continue
            raise ValueError(
                "oneshot.prune: a calibration batch ran the whole model without calling its first "
                "block; pass blocks= with the blocks the model runs, in order."
            )
        if not seen:
            raise ValueError("Expected at least one batch in batches, got none.")
    finally:
        for handle in handles:
            handle.remove()
    for i, (args, kw) in enumerate(captured):
        kind, key = _hidden(args, kw)  # a clear error now if no hidden states can be found
        if (args[key] if kind == "arg" else kw[key]).numel() == 0:
            raise ValueError(
                f"oneshot.prune: calibration batch {i} reaches the first block with no rows (an "
                f"empty batch); give batches with at least one row."
            )
    return captured


def _parameters(module: torch.nn.Module) -> set:
    try:
        return set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _without_caches(value: Any) -> Any:
    """``None`` for transformers ``Cache`` objects (a cache would grow with every re-run)."""
    if isinstance(value, tuple):
        return tuple(_without_caches(v) for v in value)
    if isinstance(value, dict):
        return {k: _without_caches(v) for k, v in value.items()}
    if any(c.__name__ == "Cache" and c.__module__.startswith("transformers") for c in type(value).__mro__):
        return None
    return value


def _hidden(args: tuple, kw: dict) -> tuple[str, Any]:
    """Where a block call's hidden states are: the first positional argument, else the keyword
    ``hidden_states``, else the first tensor keyword."""
    if args:
        if not isinstance(args[0], torch.Tensor):
            raise TypeError(
                f"oneshot.prune: expected the first block's first argument to be the hidden states "
                f"(a tensor), got {type(args[0]).__name__}."
            )
        return "arg", 0
    if isinstance(kw.get("hidden_states"), torch.Tensor):
        return "kw", "hidden_states"
    for key, value in kw.items():
        if isinstance(value, torch.Tensor):
            return "kw", key
    raise TypeError("oneshot.prune: the first block was called without any tensor input.")


def _advance(call: tuple, output: Any) -> tuple:
    """The call with its hidden states replaced by a block's output (the output itself, or its
    first element for a tuple, list or dict)."""
    if isinstance(output, (tuple, list)):
        output = output[0]
    elif isinstance(output, dict):
        output = next(iter(output.values()))
    if not isinstance(output, torch.Tensor):
        raise TypeError(
            f"oneshot.prune: expected a block to return its hidden states (a tensor, or a tuple "
            f"whose first element is one), got {type(output).__name__}."
        )
    args, kw = call
    kind, key = _hidden(args, kw)
    if kind == "arg":
        return (output, *args[1:]), kw
    return args, {**kw, key: output}


def _local_params(out_params: dict, prefix: str) -> dict:
    start = len(prefix) + 1
    return {name[start:]: p for name, p in out_params.items() if name.startswith(prefix + ".")}


def _block_names(module: torch.nn.Module, blocks: Any) -> list[str]:
    modules = dict(module.named_modules())
    if blocks is None:
        return find_blocks(module)
    if isinstance(blocks, str):
        if blocks not in modules:
            raise ValueError(f"blocks={blocks!r} names no submodule of the module.")
        return [f"{blocks}.{child}" if blocks else child for child, _ in modules[blocks].named_children()]
    names = list(blocks)
    for name in names:
        if not isinstance(name, str) or name not in modules or not name:
            raise ValueError(f"Expected blocks to name submodules of the module, got {name!r}.")
    if not names:
        raise ValueError("Expected at least one block in blocks, got none.")
    return names
