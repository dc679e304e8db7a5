"""The first block's inputs, captured per batch, and block calls (hidden states in, out)."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Sized
from typing import Any

import torch
from torch.func import functional_call

from fprune import _observe, _tree
from fprune.oneshot._progress import Progress


class _Stop(Exception):
    """Raised by the capture hook to end the model's forward at the first block."""


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


def capture_inputs(
    module: torch.nn.Module,
    params: dict[str, torch.Tensor],
    batches: Iterable[Any],
    kwargs: dict | None,
    names: list[str],
    report: Progress,
    empty_ok: bool = False,
) -> list:
    """The first block's ``(args, kwargs)`` for every batch: a pre-hook records them and stops
    the forward (SparseGPT's and Wanda's ``Catcher``, without replacing the block). A later
    block that runs before it means ``blocks`` are out of order: ``ValueError``. Each batch is
    checked on its way: a dict's keys against the inputs ``module.forward`` names, and the ids
    every ``nn.Embedding`` receives (integers in ``[0, num_embeddings)``). No batch at all is
    an error unless ``empty_ok`` (a rank's share may be empty)."""
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

    seen = 0
    ours: list[BaseException] = []  # the errors of the checks below, which name the batch already
    handles = [blocks[0].register_forward_pre_hook(hook, with_kwargs=True)]
    try:
        for i, block in enumerate(blocks[1:], start=1):
            if block is not blocks[0]:
                handles.append(block.register_forward_pre_hook(too_early(i)))
        for name, embedding in module.named_modules():
            if isinstance(embedding, torch.nn.Embedding):
                handles.append(embedding.register_forward_pre_hook(_check_ids(name, lambda: seen - 1, ours)))
        inputs = _forward_inputs(module)
        report.start("capture", len(batches) if isinstance(batches, Sized) else 0)
        for batch in batches:
            seen += 1
            if isinstance(batch, dict):
                _check_keys(module, batch, seen - 1, inputs)
            ((args, kw),) = _observe.calls([batch], extra)
            try:
                functional_call(module, params, args, kw)
            except _Stop:
                report.step(seen - 1, names[0])
                continue
            except Exception as error:
                if not any(error is e for e in ours):
                    error.add_note(
                        f"oneshot.prune: raised by calibration batch {seen - 1} (batches[{seen - 1}]), "
                        f"in the model's forward before its first block."
                    )
                raise
            raise ValueError(
                "oneshot.prune: a calibration batch ran the whole model without calling its first "
                "block; pass blocks= with the blocks the model runs, in order."
            )
        if not seen and not empty_ok:
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


def _check_ids(name: str, index: Callable[[], int], ours: list) -> Callable[[torch.nn.Module, tuple], None]:
    """A pre-hook on the embedding ``name``: integer ids within its table, else an error naming
    the batch (``index()``), kept in ``ours``."""

    def check(embedding: torch.nn.Module, args: tuple) -> None:
        ids = args[0] if args else None
        if not isinstance(ids, torch.Tensor) or not isinstance(embedding, torch.nn.Embedding):
            return
        size, i = embedding.num_embeddings, index()
        error: Exception | None = None
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            error = TypeError(
                f"oneshot.prune: batches[{i}] gives the embedding {name!r} ({size} entries) "
                f"{ids.dtype} values; expected integer token ids (torch.long, as a tokenizer returns "
                f"them): convert them with .long()."
            )
        elif ids.numel() and (bool((ids < 0).any()) or bool((ids >= size).any())):
            error = ValueError(
                f"oneshot.prune: batches[{i}] gives the embedding {name!r} ids from "
                f"{int(ids.min())} to {int(ids.max())}; expected ids in [0, {size}) (its "
                f"num_embeddings). Larger ids come from a tokenizer of another vocabulary or, for a "
                f"position embedding, a sequence longer than the model's positions."
            )
        if error is not None:
            ours.append(error)
            raise error

    return check


def _forward_inputs(module: torch.nn.Module) -> tuple[list[str], bool] | None:
    """The inputs ``module.forward`` names, and whether it takes ``**kwargs`` too (``None``: no
    signature to read)."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None
    kinds = signature.parameters.values()
    named = [p.name for p in kinds if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return named, any(p.kind == p.VAR_KEYWORD for p in kinds)


def _check_keys(module: torch.nn.Module, batch: dict, index: int, inputs: Any) -> None:
    """A dict batch's keys: each one an input ``module.forward`` names, or (for a forward that
    takes ``**kwargs``) no near miss of one, and at least one named input."""
    if inputs is None:
        return
    named, takes_more = inputs
    unknown = [key for key in batch if key not in named]
    if not unknown:
        return
    forward = f"{type(module).__name__}.forward"
    for key in unknown:
        close = difflib.get_close_matches(str(key), named, n=1)
        if close or not takes_more:
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"oneshot.prune: batches[{index}] has the key {key!r}, which {forward} does not "
                f"take{hint}; expected keys among its inputs: {_tree.listing(named)}."
            )
    if len(unknown) == len(batch):
        raise ValueError(
            f"oneshot.prune: batches[{index}] has the keys {_tree.listing([repr(k) for k in batch])}, "
            f"none of them an input {forward} names; expected keys among {_tree.listing(named)} "
            f"(input_ids, for a language model)."
        )


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


def advance(call: tuple, output: Any) -> tuple:
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


def local_params(out_params: dict, prefix: str) -> dict:
    start = len(prefix) + 1
    return {name[start:]: p for name, p in out_params.items() if name.startswith(prefix + ".")}


def block_names(module: torch.nn.Module, blocks: Any) -> list[str]:
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
