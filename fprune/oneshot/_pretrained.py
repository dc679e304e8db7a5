""":func:`prune_pretrained`: the pipeline of :func:`prune` on a checkpoint read block by block,
its result written to a new checkpoint of the same layout, so that no more than one block is in
memory at a time."""

from __future__ import annotations

import contextlib
import os
import pathlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from fprune import _tree, distributions
from fprune.oneshot import _checkpoint
from fprune.oneshot._capture import capture_inputs
from fprune.oneshot._methods import LayerMethod
from fprune.oneshot._pipeline import (
    Plan,
    Store,
    check_amounts,
    check_layer,
    dense_norms,
    make_plan,
    prune_block,
)
from fprune.oneshot._profiles import OWL, Profile
from fprune.oneshot._progress import BlockReport, Progress

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@torch.no_grad()
def prune_pretrained(
    source: str | os.PathLike,
    output: str | os.PathLike,
    batches: Iterable[Any],
    sparsity: float | dict | None,
    *,
    method: str | LayerMethod = "sparsegpt",
    n_m: tuple[int, int] | None = None,
    profile: str | Profile | None = None,
    where: _tree.Where = None,
    group: Any = None,
    device: str | torch.device | None = None,
    progress: bool | Callable[[BlockReport], None] = False,
    overwrite: bool = False,
) -> pathlib.Path:
    """Prune a transformers checkpoint too large for memory, block by block, into a new one.

    :func:`prune` with ``inplace=True`` on the model that ``source`` holds, without loading it:
    the model is built with its parameters on the meta device (no memory), the modules that run
    before the first block (the embeddings) are read when the capture calls them and released
    after it, and each block's tensors are read from the shards (``safetensors``, one tensor
    at a time) when the block is calibrated, pruned, written to ``output`` and released (back to
    the meta device). The weights written equal those of ``prune(model, params, batches, ...,
    inplace=True)`` on ``AutoModelForCausalLM.from_pretrained(source)`` (the tensors run in
    their stored dtype), bit for bit.

    ``output`` is a new checkpoint directory that ``AutoModelForCausalLM.from_pretrained``
    loads: ``config.json``, the generation config and tokenizer files when present, and the
    weights sharded like the source's (the same shard files, tensor-to-shard map and dtypes);
    every tensor but the pruned weights is copied byte for byte. Each shard is written under the
    name ``<shard>.partial`` with the source's header and offsets, the pruned weights at their
    offsets as their block finishes, and renamed when all blocks are done; the index and
    ``config.json`` come last. A run that fails (an error, a full disk) removes its partial
    shards and leaves no ``config.json``: the output never loads as a half-pruned model.

    Memory: the process holds the embeddings during the capture, then one block (in its stored
    dtype, on ``device``), that block's statistics, one layer's float32 work and the calibration
    activations: nothing grows with the number of blocks (masks are not kept).

    Args:
        source: a transformers checkpoint directory: ``config.json`` and ``model.safetensors``,
            or ``model.safetensors.index.json`` and the shards it names.
        output: the directory to write (created; an existing one must be empty, or
            ``overwrite=True``).
        batches: calibration batches, as for :func:`prune` (``{"input_ids": ...}`` dicts).
        sparsity: as for :func:`prune`.
        method: as for :func:`prune`.
        n_m: as for :func:`prune`.
        profile: as for :func:`prune`; a profile gets the weights on the meta device (names and
            shapes), but for OWL, whose outlier ratios are taken block by block in the dense
            pass. A callable with ``needs_norms`` other than OWL is refused (it would need every
            weight at once).
        where: as for :func:`prune` (``where(name, weight)`` gets the meta weight).
        group: reserved for pruning across processes; only ``None``.
        device: where each block (and the calibration activations) works: ``"cuda"``, a
            ``torch.device``; ``None`` is the CPU. Results come back to the CPU for writing.
        progress: as for :func:`prune`.
        overwrite: write into an existing non-empty ``output`` (its ``config.json``, index and
            ``*.safetensors`` files are removed first).

    Returns:
        The output directory, as a ``pathlib.Path``.

    Raises:
        TypeError / ValueError: before anything is written: ``source`` that is not a checkpoint
            directory, a shard named by the index that is missing, a tensor whose shape
            differs from the model ``config.json`` describes (or a parameter the checkpoint
            lacks), an ``output`` that exists and is not empty (without ``overwrite=True``) or
            is ``source``, ``group`` other than ``None``, a bad ``device``, and every argument
            :func:`prune` checks. NaN or inf in a block's weights or statistics is found when
            the block is loaded. OSError: the disk filled (or another write failed); the output
            is left without ``config.json`` and without shards.

    Example:
        >>> import tempfile, pathlib, torch, transformers, fprune
        >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=16, intermediate_size=32,
        ...     num_attention_heads=4, vocab_size=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> tmp = pathlib.Path(tempfile.mkdtemp())
        >>> transformers.LlamaForCausalLM(config).save_pretrained(tmp / "dense", max_shard_size="20KB")
        >>> batches = [{"input_ids": torch.randint(0, 64, (2, 8))} for _ in range(2)]
        >>> out = fprune.oneshot.prune_pretrained(tmp / "dense", tmp / "sparse", batches, 0.5)
        >>> model = transformers.AutoModelForCausalLM.from_pretrained(out)
        >>> float((model.model.layers[1].mlp.up_proj.weight == 0).float().mean())
        0.5
    """
    if group is not None:
        raise ValueError(
            f"prune_pretrained: expected group=None (one process); pruning a checkpoint across "
            f"processes is not supported yet, got group={group!r}."
        )
    checkpoint = _checkpoint.read(source)
    target = _check_output(output, checkpoint, overwrite)
    device = _check_device(device)
    model, aliases = _empty_model(checkpoint)
    keys = _keys(model, checkpoint, aliases)
    plan = make_plan(
        model,
        {},
        batches,
        sparsity,
        method,
        n_m,
        profile,
        where,
        None,
        True,
        None,
        None,
        progress,
        streamed=True,
    )
    if (
        plan.profile is not None
        and getattr(plan.profile, "needs_norms", False)
        and not isinstance(plan.profile, OWL)
    ):
        raise ValueError(
            f"prune_pretrained: profile={profile!r} needs input norms, and a profile is given every "
            f"weight at once; only OWL (profile='owl' or fprune.oneshot.OWL(...)), whose outlier "
            f"ratios are taken block by block, is supported here."
        )
    selected = [layer.name for layers in plan.layers for layer in layers]
    writer = _checkpoint.Writer(checkpoint, target)
    store = _Stream(model, plan, checkpoint, keys, aliases, writer, device)
    report = Progress(progress)
    try:
        _prepare(target, checkpoint, overwrite)
        writer.start(keys[name] for name in selected)
        store.load_buffers()
        calls = None
        if plan.needs_data:
            with store.outside_loaded(plan.blocks):
                calls = capture_inputs(model, {}, batches, None, plan.blocks, report)
            calls = [_to(call, device) for call in calls] if device is not None else calls
        if plan.profile is not None:
            plan.amounts = _profile_amounts(plan, calls, report, store)
        report.start("prune", len(plan.blocks))
        for b in range(len(plan.blocks)):
            prune_block(plan, b, calls, report, store)
        report.close()
        store.close()
        writer.finish()
    except BaseException:
        report.close()
        store.close()
        writer.abort()
        raise
    return target


def _check_output(output: Any, checkpoint: _checkpoint.Checkpoint, overwrite: Any) -> pathlib.Path:
    if not isinstance(output, (str, os.PathLike)):
        raise TypeError(f"Expected output to be a path (str or os.PathLike), got {type(output).__name__}.")
    if not isinstance(overwrite, bool):
        raise TypeError(f"Expected overwrite to be a bool, got {overwrite!r}.")
    path = pathlib.Path(output)
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"Expected output to be a directory to write, got {str(output)!r}: a file.")
        if path.resolve() == checkpoint.path.resolve():
            raise ValueError(
                f"Expected output to be another directory than source, got {str(output)!r} for both."
            )
        held = sorted(p.name for p in path.iterdir())
        if held and not overwrite:
            raise ValueError(
                f"Expected output to be a new or empty directory, got {str(output)!r}, which holds "
                f"{_tree.listing([repr(n) for n in held])}; pass overwrite=True to write into it."
            )
    return path


def _check_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    try:
        device = torch.device(device)
        torch.empty(0, device=device)
    except (TypeError, RuntimeError) as error:
        raise ValueError(
            f"Expected device to be None or a device tensors can live on, got {device!r} ({error})."
        ) from error
    if device.type == "meta":
        raise ValueError("Expected device to hold values, got 'meta'; pass None (the CPU) or an accelerator.")
    return device


def _prepare(target: pathlib.Path, checkpoint: _checkpoint.Checkpoint, overwrite: bool) -> None:
    """The output directory made (with ``overwrite``: a previous checkpoint's files removed
    first, config.json before anything, so that it never loads half-written)."""
    target.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in [_checkpoint.CONFIG, _checkpoint.INDEX]:
            (target / name).unlink(missing_ok=True)
        for file in target.iterdir():
            if file.is_file() and file.name.endswith((".safetensors", _checkpoint.PARTIAL)):
                file.unlink()
    _checkpoint.copy_extras(checkpoint, target)


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter a module registers goes to the meta device (buffers stay real, so that
    those computed at construction, as rotary frequencies, keep their values)."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _empty_model(checkpoint: _checkpoint.Checkpoint) -> tuple[torch.nn.Module, dict[str, list[str]]]:
    """The model ``config.json`` describes, its parameters on the meta device, in eval mode and
    in the checkpoint's dtype; and each parameter's names (tied weights have several)."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(checkpoint.path)
    counts: dict[torch.dtype, int] = {}
    for entry in checkpoint.entries.values():
        if entry.dtype in _DTYPES:
            counts[_DTYPES[entry.dtype]] = counts.get(_DTYPES[entry.dtype], 0) + 1
    dtype = max(counts, key=lambda d: counts[d]) if counts else torch.float32
    with _parameters_on_meta():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return model, {group[0]: group for group in names.values()}


def _keys(
    model: torch.nn.Module, checkpoint: _checkpoint.Checkpoint, aliases: dict[str, list[str]]
) -> dict[str, str]:
    """Each parameter's (and stored buffer's) key in the checkpoint, its shape checked."""
    prefix = getattr(model, "base_model_prefix", "") + "."
    own: dict[str, torch.Tensor] = dict(model.named_parameters())
    keys, missing = {}, []
    for name in own:
        candidates = [
            n
            for alias in aliases[name]
            for n in (alias, alias[len(prefix) :] if alias.startswith(prefix) else None)
            if n
        ]
        key = next((c for c in candidates if c in checkpoint.entries), None)
        if key is None:
            missing.append(name)
            continue
        keys[name] = key
    for name, b in model.named_buffers():
        if name in checkpoint.entries:
            keys[name] = name
            own[name] = b
    if missing:
        raise ValueError(
            f"The checkpoint {str(checkpoint.path)!r} has no tensor for the parameter(s) "
            f"{_tree.listing([repr(n) for n in missing])} of the model its config.json describes."
        )
    for name, key in keys.items():
        entry = checkpoint.entries[key]
        if entry.shape != tuple(own[name].shape):
            raise ValueError(
                f"Tensor {key!r} in {entry.shard!r} has shape {entry.shape}, but the model that "
                f"config.json describes has {name!r} of shape {tuple(own[name].shape)}; the "
                f"checkpoint does not match its config."
            )
        if entry.dtype not in _DTYPES and own[name].is_floating_point():
            raise ValueError(f"Tensor {key!r} in {entry.shard!r} has dtype {entry.dtype}, not a float dtype.")
    return keys


def _trim() -> None:
    """Freed memory handed back to the system (glibc's ``malloc_trim``; nothing elsewhere). The
    allocator keeps the pages of freed blocks otherwise: their sizes raise its threshold for
    memory maps, so the next block's tensors come from a heap that fragments, and the
    process's memory grows by a part of a block with every block."""
    global _LIBC
    if _LIBC is None:
        _LIBC = _libc()
    if _LIBC:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    """glibc, or False where there is none (macOS, musl: their allocators return memory)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return libc if hasattr(libc, "malloc_trim") else False


_LIBC: Any = None


def _set(model: torch.nn.Module, names: list[str], value: torch.Tensor) -> None:
    """``value`` put in place of the module attribute under every one of ``names``."""
    for name in names:
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, value)


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    if isinstance(value, list):
        return [_to(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


class _Stream(Store):
    """Blocks read from the checkpoint (on ``device``), written to the output and released."""

    def __init__(
        self,
        model: torch.nn.Module,
        plan: Plan,
        checkpoint: _checkpoint.Checkpoint,
        keys: dict[str, str],
        aliases: dict[str, list[str]],
        writer: _checkpoint.Writer,
        device: torch.device | None,
    ) -> None:
        self.model, self.checkpoint, self.keys, self.aliases = model, checkpoint, keys, aliases
        self.writer, self.device = writer, device
        self.reader = _checkpoint.Reader(checkpoint)
        own = dict(model.named_parameters())
        self.params = [[n for n in own if n.startswith(prefix + ".")] for prefix in plan.blocks]
        buffers = dict(model.named_buffers())
        self.buffers = [[n for n in buffers if n.startswith(prefix + ".")] for prefix in plan.blocks]

    def read(self, name: str) -> torch.Tensor:
        """The tensor of parameter (or buffer) ``name`` from its shard."""
        return self.reader.get(self.keys[name])

    def close(self) -> None:
        self.reader.close()

    def _put(self, plan: Plan | None, name: str, tensor: torch.Tensor) -> None:
        param = torch.nn.Parameter(tensor, requires_grad=False)
        _set(self.model, self.aliases[name], param)
        if plan is not None:
            plan.params[name] = plan.targets[name] = param

    def _empty(self, plan: Plan | None, name: str) -> None:
        current = self.model.get_parameter(name)
        self._put(plan, name, torch.empty(current.shape, dtype=current.dtype, device="meta"))

    def load_buffers(self) -> None:
        """The buffers the checkpoint stores, read (the others keep their constructed values)."""
        own = dict(self.model.named_buffers())
        for name in self.keys:
            if name in own:
                _set(self.model, [name], self.read(name))

    def load(self, plan: Plan, b: int) -> None:
        for name in self.params[b]:
            tensor = self.read(name)
            self._put(plan, name, tensor.to(self.device) if self.device is not None else tensor)
        if self.device is not None:
            for name in self.buffers[b]:
                _set(self.model, [name], self.model.get_buffer(name).to(self.device))
        for layer in plan.layers[b]:
            check_layer(layer.name, layer.transposed, plan.params[layer.name], plan.n_m)

    def save(self, plan: Plan, b: int) -> None:
        for layer in plan.layers[b]:
            self.writer.write(self.keys[layer.name], plan.params[layer.name])

    def release(self, plan: Plan, b: int) -> None:
        for name in self.params[b]:
            self._empty(plan, name)
        if self.device is not None:
            for name in self.buffers[b]:
                _set(self.model, [name], self.model.get_buffer(name).to("cpu"))
        _trim()

    @contextlib.contextmanager
    def outside_loaded(self, blocks: list[str]) -> Iterator[None]:
        """Parameters outside the blocks read when their module is called (the embeddings,
        during the capture) and released on exit."""
        inside = tuple(prefix + "." for prefix in blocks)
        canonical = {alias: name for name, group in self.aliases.items() for alias in group}
        loaded: list[str] = []

        def loader(prefix: str) -> Callable[..., None]:
            def hook(module: torch.nn.Module, args: Any) -> None:
                for leaf, p in module.named_parameters(recurse=False):
                    name = canonical[f"{prefix}.{leaf}" if prefix else leaf]
                    if p.device.type == "meta":
                        self._put(None, name, self.read(name))
                        loaded.append(name)

            return hook

        handles = []
        try:
            for prefix, module in self.model.named_modules():
                if (prefix + ".").startswith(inside) or not any(
                    True for _ in module.parameters(recurse=False)
                ):
                    continue
                handles.append(module.register_forward_pre_hook(loader(prefix)))
            yield
        finally:
            for handle in handles:
                handle.remove()
            for name in loaded:
                self._empty(None, name)


def _profile_amounts(plan: Plan, calls: list | None, report: Progress, store: _Stream) -> dict[str, Any]:
    """The profile's amounts; OWL's from outlier ratios taken block by block in the dense pass."""
    assert plan.profile is not None and plan.sparsity is not None
    index = {layer.name: b for b, layers in enumerate(plan.layers) for layer in layers}
    if not isinstance(plan.profile, OWL):
        weights = {name: plan.params[name] for name in index}
        return check_amounts(plan, plan.profile(weights, plan.sparsity, blocks=index, norms=None))
    assert calls is not None
    owl = plan.profile
    ratios: dict[int, float] = {}

    def ratio(b: int, norms: dict[str, torch.Tensor]) -> None:
        # distributions.owl's outlier ratio of one block: its layers in name order, as it flattens them
        scores = [
            (plan.params[n].detach().abs().double() * norms[n].double()).reshape(-1) for n in sorted(norms)
        ]
        if scores:
            joined = torch.cat(scores)
            ratios[b] = float((joined > owl.m * joined.mean()).double().mean()) if joined.numel() else 0.0

    norms = dense_norms(plan, calls, report, store, each=ratio)
    amounts = distributions.owl_amounts(ratios, plan.sparsity, owl.lam)
    clipped = {b: min(1.0, max(0.0, a)) for b, a in amounts.items()}
    if clipped != amounts:
        warnings.warn(
            f"owl: some block sparsities fell outside [0, 1] (sparsity={plan.sparsity}, lam={owl.lam}) "
            f"and were clipped; the mean over blocks is {sum(clipped.values()) / len(clipped):.4f} "
            f"instead of {plan.sparsity}.",
            UserWarning,
            stacklevel=4,
        )
    return check_amounts(plan, {name: clipped[index[name]] if name in norms else None for name in index})
