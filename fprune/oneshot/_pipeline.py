"""The pipeline of :func:`prune`: the plan, checked before anything runs, then block by block."""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch.func import functional_call

from fprune import _observe, _tree, reconstruct
from fprune._types import Masks, Params
from fprune.calibration import InputNorms, Statistic
from fprune.oneshot._capture import advance, block_names, capture_inputs, local_params
from fprune.oneshot._methods import LayerMethod, as_method, as_statistic
from fprune.oneshot._profiles import Profile, as_profile
from fprune.oneshot._progress import BlockReport, Progress


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
    report = Progress(progress)
    try:
        calls = None
        if plan.needs_data:
            calls = capture_inputs(module, params, batches, kwargs, plan.blocks, report)
        if plan.profile is not None:
            plan.amounts = _profile_amounts(plan, calls, report)
        report.start("prune", len(plan.blocks))
        for b in range(len(plan.blocks)):
            prune_block(plan, b, calls, report)
    finally:
        report.close()
    if masks == "all":
        plan.masks = {
            name: plan.masks[name] if name in plan.masks else torch.ones_like(p, dtype=torch.bool)
            for name, p in plan.params.items()
        }
    return plan.params, plan.masks


class Store:
    """Where the blocks' tensors live. In memory (this class) they are there all along;
    :func:`prune_pretrained`'s store reads each block from a checkpoint, writes its result to
    the output and releases it."""

    def load(self, plan: _Plan, b: int) -> None:
        """Make block ``b``'s tensors real (in ``plan.params`` and ``plan.targets``)."""

    def save(self, plan: _Plan, b: int) -> None:
        """Block ``b`` is pruned: keep its result."""

    def release(self, plan: _Plan, b: int) -> None:
        """Block ``b`` is no longer needed."""


IN_MEMORY = Store()


class _Plan:
    """What :func:`prune` does, decided (and checked) before anything runs."""

    def __init__(self) -> None:
        self.module: torch.nn.Module
        self.method: LayerMethod
        self.statistic: Statistic  # what the method names
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
        return self.statistic.needs_data or bool(getattr(self.profile, "needs_norms", False))


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
    *,
    streamed: bool = False,
) -> _Plan:
    """Every check that can be made before the first forward, and the layers to prune (with
    ``streamed=True`` the weights are on the meta device: their values are checked as each
    block is loaded, :func:`check_layer`)."""
    plan = _Plan()
    _observe.check(module, params, batches, where, kwargs, meta_ok=streamed)
    plan.module = module
    plan.method = as_method(method)
    plan.statistic = as_statistic(plan.method.statistic, "method.statistic")
    plan.n_m, sparsity = _check_sparsity(sparsity, n_m)
    plan.profile = as_profile(profile)
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
    plan.blocks = block_names(module, blocks)
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
        check_layer(layer.name, layer.transposed, layer.weight, plan.n_m, values=not streamed)
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


def check_layer(
    name: str, transposed: bool, weight: torch.Tensor, n_m: tuple[int, int] | None, *, values: bool = True
) -> None:
    """A selected layer's weight: floating-point, finite (``values``), its inputs a multiple of m."""
    if not weight.is_floating_point():
        raise TypeError(
            f"oneshot.prune: expected the weight of layer {name!r} to be floating-point, got {weight.dtype}."
        )
    if values and not bool(torch.isfinite(weight).all()):
        raise ValueError(f"oneshot.prune: the weight of layer {name!r} holds NaN or inf.")
    if n_m is not None:
        cols = weight.shape[0] if transposed else weight.shape[-1]
        if cols % n_m[1]:
            raise ValueError(
                f"oneshot.prune: expected the in_features ({cols}) of layer {name!r} to be a "
                f"multiple of m={n_m[1]} for n_m={n_m!r} (groups of m consecutive inputs)."
            )


def prune_block(plan: _Plan, b: int, calls: list | None, report: Progress, store: Store = IN_MEMORY) -> None:
    """Block ``b``: loaded, its statistics, each layer's solve and write-back, its result kept
    and its outputs replacing ``calls`` in place as the next block's inputs, then released."""
    prefix = plan.blocks[b]
    block = plan.module.get_submodule(prefix)
    store.load(plan, b)  # 1. the block's tensors
    layers = [layer for layer in plan.layers[b] if plan.amounts.get(layer.name) is not None or plan.n_m]
    started = time.perf_counter()
    sums = _accumulate(plan, block, prefix, layers, calls)  # 2. statistics
    gathered = time.perf_counter()
    pruned = 0
    for layer in layers:  # 3. each layer solved, and written back
        if sums is not None and layer.name not in sums.sums:
            continue  # no input reached it: left dense (warned above)
        _write(plan, layer, *_solve(plan, layer, sums))
        pruned += 1
    done = time.perf_counter()
    store.save(plan, b)  # 4. the result kept, and the pruned block's outputs
    if calls is not None and b + 1 < len(plan.blocks):
        _advance(plan, block, prefix, calls)
    store.release(plan, b)  # 5. the block released
    report.step(b, prefix, pruned, (gathered - started, done - gathered, time.perf_counter() - done))


def _accumulate(
    plan: _Plan, block: torch.nn.Module, prefix: str, layers: list[_observe.Layer], calls: list | None
) -> _observe.Accumulator | None:
    """The partial sums of the method's statistic for ``layers`` over the block's inputs (one
    table for layers fed the same input), checked finite; ``None`` for a method without data."""
    if not layers or not plan.statistic.needs_data or calls is None:
        return None
    sums = _observe.Accumulator(plan.statistic)
    local = local_params(plan.params, prefix)
    with _observe.observing(layers, sums):
        for args, kw in calls:
            functional_call(block, local, args, kw)
    _observe.warn_silent("oneshot.prune", layers, sums.sums, "They are left dense", stacklevel=6)
    bad = sums.nonfinite()
    if bad:
        raise ValueError(
            f"oneshot.prune: the inputs of {_tree.listing([repr(n) for n in bad])} in block "
            f"{prefix!r} hold NaN or inf (their statistics are not finite); check the model "
            f"and the calibration batches."
        )
    return sums


def _solve(
    plan: _Plan, layer: _observe.Layer, sums: _observe.Accumulator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer pruned by the plan's method: ``(new weight, keep)`` in the weight's layout, the
    weight in float32 (float64 for a float64 model); its statistic is released."""
    weight = plan.params[layer.name]
    W = weight.T if layer.transposed else weight  # (out, in)
    work = W.to(torch.promote_types(W.dtype, torch.float32))
    statistic = None if sums is None else sums.finish(layer.name, work.dtype)
    amount = None if plan.n_m is not None else plan.amounts[layer.name]
    new, keep = plan.method.prune_layer(work, statistic, amount, n_m=plan.n_m)
    del statistic, work
    return (new.T, keep.T) if layer.transposed else (new, keep)


def _write(plan: _Plan, layer: _observe.Layer, new: torch.Tensor, keep: torch.Tensor) -> None:
    """A layer's result written back (in the weight's dtype): into the target with inplace=True,
    else as a new tensor in the returned params; its mask kept as ``masks=`` asks."""
    if plan.inplace:
        plan.targets[layer.name].copy_(new)
    else:
        plan.params[layer.name] = new.to(plan.params[layer.name].dtype).contiguous()
    if plan.keep_masks:
        plan.masks[layer.name] = keep.contiguous()


def _advance(plan: _Plan, block: torch.nn.Module, prefix: str, calls: list) -> None:
    """The pruned block run on its inputs; its outputs replace them one by one (one set of
    activations at a time)."""
    local = local_params(plan.params, prefix)
    for i, call in enumerate(calls):
        calls[i] = advance(call, functional_call(block, local, *call))


def _profile_amounts(plan: _Plan, calls: list | None, report: Progress) -> dict[str, Any]:
    """The profile's per-layer amounts (after OWL's dense pass, for a profile that needs norms)."""
    assert plan.profile is not None and plan.sparsity is not None
    index = {layer.name: b for b, group in enumerate(plan.layers) for layer in group}
    weights = {layer.name: plan.params[layer.name] for group in plan.layers for layer in group}
    norms = None
    if getattr(plan.profile, "needs_norms", False):
        assert calls is not None
        norms = dense_norms(plan, calls, report)
    amounts = plan.profile(weights, plan.sparsity, blocks=index, norms=norms)
    return check_amounts(plan, amounts)


def check_amounts(plan: _Plan, amounts: Any) -> dict[str, Any]:
    """A profile's amounts checked: a dict of fractions for the selected layers."""
    index = [layer.name for group in plan.layers for layer in group]
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


def dense_norms(
    plan: _Plan,
    calls: list,
    report: Progress,
    store: Store = IN_MEMORY,
    each: Callable[[int, dict[str, torch.Tensor]], None] | None = None,
) -> dict:
    """Input norms of every selected layer from a dense pass, block by block (for OWL); with
    ``each``, ``each(b, norms of block b)`` is called while the block is loaded."""
    report.start("norms", len(plan.blocks))
    dense = list(calls)  # the first block's inputs stay for the pruning pass
    norms = {}
    for b, prefix in enumerate(plan.blocks):
        started = time.perf_counter()
        store.load(plan, b)
        block, local = plan.module.get_submodule(prefix), local_params(plan.params, prefix)
        observe = _observe.Accumulator(InputNorms())
        with _observe.observing(plan.layers[b], observe):
            for i, call in enumerate(dense):
                dense[i] = advance(call, functional_call(block, local, *call))
        found = {}
        for layer in plan.layers[b]:
            if layer.name in observe.sums:
                n = observe.finish(layer.name, torch.float32, copy=True)
                found[layer.name] = n.view(-1, 1) if layer.transposed else n
        if each is not None:
            each(b, found)
        norms.update(found)
        store.release(plan, b)
        report.step(b, prefix, 0, (time.perf_counter() - started, 0.0, 0.0))
    return norms


# Package-internal names (fprune.oneshot.prune_pretrained runs the same plan).
Plan = _Plan
make_plan = _plan
