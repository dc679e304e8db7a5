"""One-shot post-training pruning, layer by layer: SparseGPT, Wanda and magnitude on a model.

:func:`prune` runs the pipeline of SparseGPT's ``opt_sequential`` / ``llama_sequential`` and
Wanda's ``prune_wanda`` (IST-DASLab/sparsegpt, locuslab/wanda) without changing the module:

1. The model's repeated blocks are found (the ``nn.ModuleList`` of transformer layers:
   ``transformer.h``, ``model.layers``, ``bert.encoder.layer``; ``blocks=`` names them
   otherwise), and the first block's inputs are captured once per calibration batch, with the
   keyword arguments the model passes it (attention masks, position ids and embeddings), by a
   forward pre-hook that stops the forward there (their ``Catcher``, as a hook).
2. For each block in turn: its layers' statistics (SparseGPT's hessians ``2/n sum x x^T``,
   Wanda's input norms) are collected from its current inputs, which come from the blocks
   already pruned; its layers are pruned (masks, and SparseGPT's weight updates); then the
   pruned block runs on the same inputs and its outputs become the next block's inputs.

Embeddings, the LM head, norms and every parameter outside the blocks stay dense. Memory: the
model, the returned weights and masks, one set of block inputs (and outputs, one batch at a
time), and one block's statistics. Every forward runs through ``torch.func.functional_call``
with the given params; hooks are removed on exit, also on errors.
"""

from __future__ import annotations

import inspect
import numbers
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
from torch.func import functional_call

from fprune import _amount, _observe, _tree, distributions, reconstruct
from fprune._types import Masks, Params
from fprune.select import NM, Rows, select

__all__ = ["OWL", "BlockReport", "find_blocks", "prune"]

_METHODS = ("sparsegpt", "wanda", "magnitude")


@dataclass(frozen=True)
class OWL:
    """The OWL sparsity profile (:func:`fprune.distributions.owl`): ``m`` and ``lam``.

    ``profile="owl"`` is ``OWL()``: ``m=5``, ``lam=0.08``, the paper's values.
    """

    m: float = 5.0
    lam: float = 0.08


class BlockReport(NamedTuple):
    """What :func:`prune` did for one block, handed to ``progress`` when it is a callable."""

    number: int  # the block's position, 0-based
    total: int  # blocks in all
    name: str  # the block's module name
    layers: int  # layers pruned in it
    statistics_seconds: float  # running the block on its inputs with hooks (hessians, norms)
    pruning_seconds: float  # masks and weight updates
    forward_seconds: float  # running the pruned block for the next block's inputs


class _Stop(Exception):
    """Raised by the capture hook to end the model's forward at the first block."""


@torch.no_grad()
def prune(
    module: torch.nn.Module,
    params: Params,
    batches: Iterable[Any],
    sparsity: float | dict | None,
    *,
    method: str = "sparsegpt",
    n_m: tuple[int, int] | None = None,
    profile: str | OWL | None = None,
    where: _tree.Where = None,
    blocks: str | list[str] | None = None,
    blocksize: int = 128,
    damp: float = 0.01,
    refine: bool | int = False,
    kwargs: dict | None = None,
    progress: bool | Callable[[BlockReport], None] = False,
) -> tuple[Params, Masks]:
    """Prune a model's blocks one at a time from calibration data: SparseGPT, Wanda or magnitude.

    Methods, per layer (``W`` the weight as ``(out, in)``, a ``Conv1D`` weight transposed):

    * ``"sparsegpt"``: :func:`fprune.reconstruct.sparsegpt` with the layer's hessian: the mask
      and the updated kept weights (per block of ``blocksize`` columns, or N:M).
    * ``"wanda"``: scores ``|W| * ||x_j||`` (:func:`fprune.scores.wanda`), the lowest
      ``round(amount * in)`` of each output row pruned (``fprune.select.Rows``), or N:M
      along the inputs; weights unchanged.
    * ``"magnitude"``: the lowest ``|W|`` of the whole layer (``round(amount * numel)``, as
      :func:`fprune.l1_unstructured`), or N:M; needs no data and runs no forward (unless
      ``profile`` or ``refine`` does).

    ``refine=True`` (or a number of steps, default 30) then solves the least squares on the
    chosen mask (:func:`fprune.reconstruct.refine`, from the method's weights).

    Args:
        module: the model (for instance a transformers ``GPT2LMHeadModel``, in ``eval()`` mode).
        params: a flat dict keyed like ``module.named_parameters()`` (a part is fine; the others
            are the module's own).
        batches: calibration batches, read once: a tensor is called as ``module(b)``, a tuple as
            ``module(*b)``, a dict as ``module(**b)`` (``{"input_ids": ...}``).
        sparsity: the fraction of each pruned layer to prune (a float in [0, 1]), or per-leaf
            amounts (a dict ``{weight name: fraction or None}``, as
            :func:`fprune.distributions.owl` gives; ``None`` or a missing name: not pruned);
            ``None`` with ``n_m``.
        method: ``"sparsegpt"``, ``"wanda"`` or ``"magnitude"``.
        n_m: ``(n, m)``: keep ``n`` of every ``m`` consecutive inputs of each output (2:4 is
            ``(2, 4)``), instead of ``sparsity``.
        profile: ``None`` (the same sparsity in every block), ``"owl"`` or :class:`OWL`: OWL's
            per-block sparsities from a dense calibration pass (Yin et al. 2024); not with N:M.
        where: ``where(name, weight) -> bool`` (or ``where(weight)``) picks, among the ``nn.Linear``
            and ``Conv1D`` layers inside the blocks, the ones to prune (all when ``None``).
        blocks: the blocks, in the order the model runs them: the name of a container module
            (``"transformer.h"``) or a list of module names. Default: :func:`find_blocks`.
        blocksize: SparseGPT's columns per block.
        damp: SparseGPT's damping (a fraction of ``mean(diag H)``).
        refine: least squares on the final mask: ``False``, ``True`` (30 steps) or a step count.
        kwargs: keyword arguments added to every call of ``module`` (``use_cache=False`` is added
            for models whose ``forward`` takes ``use_cache``, so that no cache is kept).
        progress: ``True`` prints one line per block to stderr; a callable receives a
            :class:`BlockReport` per block.

    Returns:
        ``(params, masks)``: two flat dicts keyed like ``module.named_parameters()``, the pruned
        weights (new tensors; every other entry is the given or the module's own tensor) and
        ``torch.bool`` keep-masks (all ``True`` where nothing was pruned). Run the pruned model
        with ``torch.func.functional_call(module, params, ...)``.

    Raises:
        TypeError / ValueError: bad arguments, no blocks found, a first block that the batches
            never reach, or what :func:`fprune.reconstruct.sparsegpt` raises.

    Warns:
        UserWarning: a module in training mode (dropout on during calibration); selected layers
            that received no input (left dense by SparseGPT and Wanda).

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
        >>> new, masks = fprune.oneshot.prune(model, params, batches, 0.5)
        >>> sorted(k for k, m in masks.items() if not m.all())          # the blocks' weights
        ['blocks.0.0.weight', 'blocks.1.0.weight', 'blocks.2.0.weight']
        >>> float(fprune.sparsity({"w": masks["blocks.0.0.weight"]}).overall)
        0.5
        >>> bool((new["blocks.0.0.weight"][~masks["blocks.0.0.weight"]] == 0).all())
        True
    """
    options = _check(
        module, params, batches, sparsity, method, n_m, profile, refine, kwargs, progress, blocksize, damp
    )
    if module.training:
        warnings.warn(
            "oneshot.prune: the module is in training mode, so dropout is active while the "
            "statistics are collected; call module.eval() first (prune does not change it).",
            UserWarning,
            stacklevel=3,
        )
    block_names = _block_names(module, blocks)
    modules = dict(module.named_modules())
    layers = _observe.linear_layers(module, params, where)
    by_block: list[list[_observe.Layer]] = [[] for _ in block_names]
    for layer in layers:
        for b, prefix in enumerate(block_names):
            if layer.name.startswith(prefix + "."):
                by_block[b].append(layer)
                break
    own = dict(module.named_parameters())
    out_params = {name: params.get(name, p).detach() for name, p in own.items()}
    out_masks: dict[str, torch.Tensor] = {}

    if isinstance(sparsity, dict):
        prunable = {layer.name for group in by_block for layer in group}
        stray = sorted(k for k, v in sparsity.items() if v is not None and k not in prunable)
        if stray:
            raise ValueError(
                f"sparsity has amounts for {_tree.listing([repr(k) for k in stray])}, which are not "
                f"weights of the linear layers inside the blocks that where= selects; only those "
                f"are pruned (give them None, or leave them out)."
            )
    amounts = _layer_amounts(sparsity, by_block)
    needs_data = method != "magnitude" or options.refine_steps > 0 or options.owl is not None
    if not needs_data:
        for b, prefix in enumerate(block_names):
            started = time.perf_counter()
            group = [layer for layer in by_block[b] if amounts.get(layer.name) is not None or n_m is not None]
            for layer in group:
                _prune_layer(layer, None, None, amounts, method, n_m, options, out_params, out_masks)
            options.report(b, len(block_names), prefix, len(group), 0.0, time.perf_counter() - started, 0.0)
        return out_params, _full_masks(out_params, out_masks)

    calls = _capture(module, params, batches, kwargs, [modules[n] for n in block_names], block_names)
    if options.owl is not None:
        norms = _dense_norms(modules, block_names, by_block, out_params, calls)
        index = {layer.name: b for b, group in enumerate(by_block) for layer in group}
        selected = {layer.name: layer.weight for group in by_block for layer in group}
        amounts = distributions.owl(
            selected,
            norms,
            cast(float, sparsity),  # one float: _check refuses OWL with per-leaf amounts or N:M
            blocks=index,
            m=options.owl.m,
            lam=options.owl.lam,
            where=lambda name, p: name in norms,
        )
    for b, prefix in enumerate(block_names):
        block = modules[prefix]
        local = _local_params(out_params, prefix)
        group = [layer for layer in by_block[b] if amounts.get(layer.name) is not None or n_m is not None]
        started = time.perf_counter()
        gram = _observe.Gram() if method == "sparsegpt" or options.refine_steps else _observe.SumSquares()
        statistics = method != "magnitude" or options.refine_steps > 0
        if group and statistics:
            with _observe.observing(group, gram):
                for args, kw in calls:
                    functional_call(block, local, args, kw)
            _observe.warn_silent("oneshot.prune", group, gram.sums, "They are left dense")
        gathered = time.perf_counter()
        for layer in group:
            if statistics and layer.name not in gram.sums:
                continue
            _prune_layer(
                layer, gram, amounts.get(layer.name), amounts, method, n_m, options, out_params, out_masks
            )
        pruned = time.perf_counter()
        del gram
        local = _local_params(out_params, prefix)
        if b + 1 < len(block_names):
            calls = [_advance(call, functional_call(block, local, *call)) for call in calls]
        options.report(
            b,
            len(block_names),
            prefix,
            len(group),
            gathered - started,
            pruned - gathered,
            time.perf_counter() - pruned,
        )
    return out_params, _full_masks(out_params, out_masks)


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


# ---------------------------------------------------------------------------------------------
# The pipeline's pieces


class _Options:
    def __init__(self, owl: OWL | None, refine_steps: int, blocksize: int, damp: float, progress: Any):
        self.owl = owl
        self.refine_steps = refine_steps
        self.blocksize = blocksize
        self.damp = damp
        self.progress = progress

    def report(
        self,
        number: int,
        total: int,
        name: str,
        layers: int,
        statistics: float,
        pruning: float,
        forward: float,
    ) -> None:
        if not self.progress:
            return
        report = BlockReport(number, total, name, layers, statistics, pruning, forward)
        if callable(self.progress):
            self.progress(report)
        else:
            print(  # noqa: T201 (progress=True reports to stderr, as documented)
                f"oneshot.prune: block {number + 1}/{total} {name}: {layers} layers, statistics "
                f"{statistics:.1f} s, pruning {pruning:.1f} s, outputs {forward:.1f} s",
                file=sys.stderr,
                flush=True,
            )


def _prune_layer(
    layer: _observe.Layer,
    gram: _observe.Gram | _observe.SumSquares | None,
    amount: Any,
    amounts: dict[str, Any],
    method: str,
    n_m: tuple[int, int] | None,
    options: _Options,
    out_params: dict[str, torch.Tensor],
    out_masks: dict[str, torch.Tensor],
) -> None:
    """Prune one layer into ``out_params`` / ``out_masks`` (its statistics popped from ``gram``)."""
    weight = out_params[layer.name]
    W = weight.T if layer.transposed else weight  # (out, in)
    if amount is None and n_m is None:
        amount = amounts.get(layer.name)
    hessian = None
    norms: torch.Tensor | None = None
    if gram is not None and layer.name in gram.sums:
        if isinstance(gram, _observe.SumSquares):
            norms = gram.sums.pop(layer.name).to(torch.float32).sqrt().view(1, -1)
        else:
            hessian = gram.hessian(layer.name, W.dtype)
            norms = hessian.diagonal().sqrt().view(1, -1)  # proportional to ||x_j||: same ranking
    if method == "sparsegpt":
        assert hessian is not None  # layers without statistics were skipped by the caller
        new, keep = reconstruct.sparsegpt(
            W,
            hessian,
            amount if n_m is None else None,
            n_m=n_m,
            blocksize=options.blocksize,
            damp=options.damp,
        )
    else:
        if method == "magnitude":
            scores = W.abs()
        else:
            assert norms is not None  # layers without statistics were skipped by the caller
            scores = W.abs().float() * norms
        if n_m is not None:
            keep = select({"w": scores}, None, scope=NM(n_m[0], n_m[1], -1))["w"]
        elif method == "wanda":
            keep = select({"w": scores}, amount, scope=Rows(0))["w"]
        else:
            keep = select({"w": scores}, amount)["w"]
        new = W * keep
    if options.refine_steps:
        assert hessian is not None
        new = reconstruct.refine(W, hessian, keep, init=new, iters=options.refine_steps)
    if layer.transposed:
        new, keep = new.T.contiguous(), keep.T.contiguous()
    out_params[layer.name] = new.to(weight.dtype)
    out_masks[layer.name] = keep


def _capture(
    module: torch.nn.Module,
    params: dict[str, torch.Tensor],
    batches: Iterable[Any],
    kwargs: dict | None,
    blocks: list,
    names: list,
) -> list:
    """The first block's ``(args, kwargs)`` for every batch: a pre-hook records them and stops
    the forward (SparseGPT's and Wanda's ``Catcher``, without replacing the block). A later
    block that runs before it means ``blocks`` are out of order: ``ValueError``."""
    extra = dict(kwargs or {})
    if "use_cache" not in extra and "use_cache" in _parameters(module):
        extra["use_cache"] = False
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
        for args, kw in _observe.calls(batches, extra):
            seen += 1
            try:
                functional_call(module, params, args, kw)
            except _Stop:
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
    for args, kw in captured:
        _hidden(args, kw)  # a clear error now if no hidden states can be found
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


def _dense_norms(
    modules: dict[str, torch.nn.Module],
    block_names: list[str],
    by_block: list[list[_observe.Layer]],
    out_params: dict[str, torch.Tensor],
    calls: list,
) -> dict:
    """Input norms of every selected layer from a dense pass, block by block (for OWL)."""
    observe = _observe.SumSquares()
    sums = observe.sums
    for b, prefix in enumerate(block_names):
        block, local = modules[prefix], _local_params(out_params, prefix)
        outputs = []
        with _observe.observing(by_block[b], observe):
            for call in calls:
                outputs.append(_advance(call, functional_call(block, local, *call)))
        calls = outputs
    norms = {}
    for group in by_block:
        for layer in group:
            if layer.name in sums:
                n = sums[layer.name].sqrt().float()
                norms[layer.name] = n.view(-1, 1) if layer.transposed else n.view(1, -1)
    return norms


def _layer_amounts(sparsity: Any, by_block: list) -> dict:
    names = [layer.name for group in by_block for layer in group]
    if isinstance(sparsity, dict):
        return {name: sparsity.get(name) for name in names}
    return dict.fromkeys(names, sparsity)


def _full_masks(out_params: dict, out_masks: dict) -> dict:
    return {
        name: out_masks[name] if name in out_masks else torch.ones_like(p, dtype=torch.bool)
        for name, p in out_params.items()
    }


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


# ---------------------------------------------------------------------------------------------
# Checks


def _check(
    module: Any,
    params: Any,
    batches: Any,
    sparsity: Any,
    method: Any,
    n_m: Any,
    profile: Any,
    refine: Any,
    kwargs: Any,
    progress: Any,
    blocksize: Any,
    damp: Any,
) -> _Options:
    _observe.check(module, params, batches, None, kwargs)
    if method not in _METHODS:
        raise ValueError(f"Expected method to be one of {', '.join(map(repr, _METHODS))}, got {method!r}.")
    if n_m is not None:
        reconstruct.check_n_m(n_m, 0)  # the pair itself; each layer's width is checked when pruned
        if sparsity is not None:
            raise ValueError(
                f"Expected sparsity=None with n_m={n_m!r} (N:M fixes what each group keeps), got "
                f"sparsity={sparsity!r}."
            )
    elif isinstance(sparsity, dict):
        for name, value in sparsity.items():
            if value is not None:
                try:
                    reconstruct.check_fraction(value)
                except (TypeError, ValueError) as error:
                    raise type(error)(f"sparsity[{name!r}]: {error}") from None
    elif sparsity is None:
        raise ValueError("Expected sparsity (a fraction in [0, 1] or per-leaf amounts), or n_m, got neither.")
    else:
        reconstruct.check_fraction(sparsity)
        _amount.check_amount(sparsity)
    owl: OWL | None
    if profile is None:
        owl = None
    elif profile == "owl":
        owl = OWL()
    elif isinstance(profile, OWL):
        owl = profile
    else:
        raise ValueError(
            f"Expected profile to be None, 'owl' or fprune.oneshot.OWL(m, lam), got {profile!r}."
        )
    if owl is not None and (n_m is not None or isinstance(sparsity, dict)):
        raise ValueError(
            "Expected profile='owl' with one sparsity (a float): OWL sets per-block fractions, "
            "which N:M and given per-leaf amounts leave no room for."
        )
    if isinstance(refine, bool):
        steps = 30 if refine else 0
    elif isinstance(refine, numbers.Integral) and int(refine) >= 0:
        steps = int(refine)
    else:
        raise TypeError(f"Expected refine to be a bool or a non-negative int (steps), got {refine!r}.")
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        raise TypeError(f"Expected progress to be a bool or a callable, got {progress!r}.")
    blocksize = reconstruct.check_positive_int(blocksize, "blocksize")
    damp = reconstruct.check_damp(damp)
    return _Options(owl, steps, blocksize, damp, progress)
