"""Structural pruning across torchvision's classification models, beside Torch-Pruning.

``python -m benchmarks.zoo`` (about 15 minutes on 2 cores) builds each model of :data:`MODELS`
(random init, nothing downloaded; 64x64 images, 224x224 for ViT), finds its groups with
``fprune.structure.groups``, prunes half the channels of every prunable group
(``group_structured(0.5)``), compacts, and checks the compact model against ``masked_call`` on
the default init and on a copy where every channel matters (:func:`every_channel_matters`).
Where ``torch_pruning`` is installed, its ``MagnitudePruner`` (``GroupMagnitudeImportance(p=2)``,
``pruning_ratio=0.5``, the 1000-class layer ignored) prunes the same model in a child process
with a memory cap. Writes ``benchmarks/results/zoo.md`` and ``zoo.json``; ``--models`` picks
some, ``--no-torch-pruning`` skips it.

This module is also the zoo test's helper (``tests/zoo/test_zoo_torchvision.py``): the model
list, :func:`import_torchvision`, :func:`build`, :func:`every_channel_matters` and
:func:`prune_and_compact` live here once.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import pathlib
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent

#: The 18 classification models, in the table's order.
MODELS = (
    "resnet18",
    "resnet50",
    "vgg11_bn",
    "densenet121",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "mnasnet0_5",
    "shufflenet_v2_x1_0",
    "squeezenet1_0",
    "regnet_y_400mf",
    "resnext50_32x4d",
    "wide_resnet50_2",
    "googlenet",
    "alexnet",
    "convnext_tiny",
    "vit_b_16",
    "swin_t",
)
#: The models of the default test run: the rules each needs (in-place ops, squeeze-excitation
#: gates, the channel shuffle, Swin's index/pad/roll and relative-position bias) in little time.
FAST = ("resnet18", "mobilenet_v3_small", "shufflenet_v2_x1_0", "squeezenet1_0", "swin_t")

_LIBRARY: list = []  # keeps the torchvision op schemas defined below alive


#: Where the README's test command installs torchvision (``pip install --no-deps --target``).
DEPS = pathlib.Path(__file__).resolve().parent.parent / ".deps"


def import_torchvision() -> Any:
    """``torchvision.models``, or None when torchvision is not installed.

    torchvision is looked up where Python finds it, else in ``.deps/`` (appended to
    ``sys.path``): the README's test command installs it there, out of site-packages, because
    the PyPI wheel (a CUDA build) fails to import beside a CPU-only torch, and transformers'
    model imports fail with it. That wheel imports on a CPU-only torch once the two operators
    its import looks up (``torchvision::nms`` and ``torchvision::qnms``) have schemas: its C
    extension does not load there, and the classification models never call it. Those schemas
    are defined here, for the tests and this benchmark only, when the import fails for that
    (after which transformers imports too).
    """
    if importlib.util.find_spec("torchvision") is None and (DEPS / "torchvision").is_dir():
        sys.path.append(str(DEPS))
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:
        from torchvision import models
    except RuntimeError as error:
        if "torchvision::" not in str(error):
            raise
        for name in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[name]
        library = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            if not hasattr(torch.ops.torchvision, op):
                library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIBRARY.append(library)
        from torchvision import models
    return models


def image_size(name: str) -> int:
    return 224 if name == "vit_b_16" else 64


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """torchvision's ``name`` with random weights (seeded), in eval mode."""
    models = import_torchvision()
    if models is None:
        raise RuntimeError("torchvision is not installed (pip install -e '.[zoo]').")
    torch.manual_seed(seed)
    extra = {"init_weights": True} if name == "googlenet" else {}
    return getattr(models, name)(weights=None, **extra).eval()


def example(name: str, batch: int = 2, seed: int = 1) -> torch.Tensor:
    size = image_size(name)
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def every_channel_matters(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """A copy whose outputs depend on every channel.

    The default init leaves BatchNorm an identity (weight 1, bias 0, running mean 0 and variance
    1), zeros biases, ViT's head and class token, and ConvNeXt's layer scales at 1e-6: there
    pruned channels can look harmless. Here BatchNorm and LayerNorm get random affines and
    statistics, and every parameter whose entries are all equal gets random values.
    """
    return _make_channels_matter(copy.deepcopy(model), seed)


@contextlib.contextmanager
def channels_matter(model: torch.nn.Module, seed: int = 0) -> Iterator[torch.nn.Module]:
    """``model`` itself with the values :func:`every_channel_matters` gives its copy, changed in
    place for the ``with`` block and restored after (the same module, so that what is kept
    per module, such as its export, is reused)."""
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    _make_channels_matter(model, seed)
    try:
        yield model
    finally:
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                v.copy_(saved[k])


@torch.no_grad()
def _make_channels_matter(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)

    def uniform(t: torch.Tensor, lo: float, hi: float) -> None:
        t.copy_(lo + (hi - lo) * torch.rand(t.shape, generator=g))

    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            if module.affine:
                uniform(module.weight, 0.5, 1.5)
                uniform(module.bias, -0.5, 0.5)
            if module.running_mean is not None:
                uniform(module.running_mean, -0.5, 0.5)
                uniform(module.running_var, 0.5, 1.5)
        elif isinstance(module, torch.nn.LayerNorm) and module.elementwise_affine:
            uniform(module.weight, 0.5, 1.5)
            if module.bias is not None:
                uniform(module.bias, -0.5, 0.5)
    for p in model.parameters():
        flat = p.reshape(-1)
        if flat.numel() > 1 and bool((flat == flat[0]).all()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
            else:
                uniform(p, -0.5, 0.5)
    return model


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |out - ref| / max |ref|`` (0 when both are all zeros)."""
    diff = float((out - ref).abs().max())
    scale = float(ref.abs().max())
    return diff / scale if scale > 0 else diff


def parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def prune_and_compact(
    model: torch.nn.Module,
    structure: Any,
    x: torch.Tensor,
    *,
    amount: float = 0.5,
    allow_inexact: bool = False,
    dynamic_batch: bool = False,
) -> dict[str, Any]:
    """Half (``amount``) of every prunable group (exact ones only unless ``allow_inexact``),
    compacted; the compact model's output against ``masked_call``'s on ``x``."""
    import fprune

    params = {k: v.detach() for k, v in model.named_parameters()}
    where = (lambda name, g: True) if allow_inexact else None
    masks = fprune.group_structured(params, amount, structure, where=where)
    dynamic = ({0: torch.export.Dim.AUTO},) if dynamic_batch else None
    small = fprune.compact_graph(
        model, params, masks, structure, (x,), allow_inexact=allow_inexact, dynamic_shapes=dynamic
    )
    with torch.no_grad():
        ref = fprune.masked_call(model, params, masks, (x,))
        out = small(x)
    return {
        "small": small,
        "masks": masks,
        "error": relative_error(out, ref),
        "parameters": sum(p.numel() for p in small.parameters()),
    }


# ---------------------------------------------------------------------------------- Torch-Pruning


def _torch_pruning_child(name: str, path: str) -> dict[str, Any]:
    """Prune ``name`` with Torch-Pruning (in this process); save the pruned module to ``path``."""
    import torch_pruning as tp

    torch.set_num_threads(1)
    model = build(name)
    x = example(name)
    ignored = [
        m
        for m in model.modules()
        if (isinstance(m, torch.nn.Linear) and m.out_features == 1000)
        or (isinstance(m, torch.nn.Conv2d) and m.out_channels == 1000)
    ]
    start = time.perf_counter()
    pruner = tp.pruner.MagnitudePruner(
        model, x, tp.importance.GroupMagnitudeImportance(p=2), pruning_ratio=0.5, ignored_layers=ignored
    )
    pruner.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        model(x)
    torch.save(model, path)  # Torch-Pruning's way to keep a pruned model: the whole module
    return {"parameters": parameters(model), "prune_s": seconds}


def torch_pruning(name: str, memory_gib: float = 8, timeout: float = 600) -> tuple[dict[str, Any], Any]:
    """:func:`_torch_pruning_child` in a child process (address space capped at ``memory_gib``):
    ``({"parameters", "prune_s"}, pruned module)`` or ``({"error": ...}, None)``."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "pruned.pt")
        cap = int(memory_gib * 2**30)
        code = (
            f"import json, resource; resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap})); "
            "from benchmarks.zoo import _torch_pruning_child; "
            f"print(json.dumps(_torch_pruning_child({name!r}, {path!r})))"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"error": f"no result in {timeout:.0f} s"}, None
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln and not ln.startswith(" ")]
            return {"error": lines[-1][:160] if lines else f"exit {proc.returncode}"}, None
        return json.loads(proc.stdout.strip().splitlines()[-1]), torch.load(path, weights_only=False).eval()


# ---------------------------------------------------------------------------------- the benchmark


def forward_time(module: Any, x: torch.Tensor, rounds: int) -> float:
    """Best of ``rounds`` forward passes (seconds), after one warm-up."""
    best = float("inf")
    with torch.no_grad():
        module(x)
        for _ in range(rounds):
            start = time.perf_counter()
            module(x)
            best = min(best, time.perf_counter() - start)
    return best


def measure(name: str, batch: int, rounds: int, threads: int, with_torch_pruning: bool) -> dict[str, Any]:
    """Every figure of one model's row (see the module docstring)."""
    import fprune

    torch.set_num_threads(threads)
    model = build(name)
    x = example(name)
    wall, cpu = time.perf_counter(), time.process_time()
    structure = fprune.structure.groups(model, (x,))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    prunable = [g for g in structure.groups if g.prunable]
    row: dict[str, Any] = {
        "model": name,
        "groups": len(structure.groups),
        "prunable": len(prunable),
        "inexact": sum(not g.exact for g in prunable),
        "groups_wall_s": wall,
        "groups_cpu_s": cpu,
        "load": os.getloadavg()[0],
        "parameters": parameters(model),
    }
    reasons: dict[str, int] = {}
    for g in structure.groups:
        if not g.prunable:
            key = (g.reason or "").split(" (node")[0]
            reasons[key] = reasons.get(key, 0) + 1
    row["unprunable"] = reasons
    big = example(name, batch, seed=2)
    theirs = None
    if with_torch_pruning:
        row["torch_pruning"], theirs = torch_pruning(name)
    variants = [("exact", False)] + ([("allow_inexact", True)] if row["inexact"] else [])
    for label, inexact in variants:
        done = prune_and_compact(model, structure, x, allow_inexact=inexact, dynamic_batch=True)
        matters = every_channel_matters(model)
        again = prune_and_compact(matters, structure, x, allow_inexact=inexact)
        row[label] = {
            "parameters": done["parameters"],
            "error": done["error"],
            "error_every_channel": again["error"],
        }
        if label == "exact":
            row["own_class"] = own_class(model, structure, x, done["masks"])
        times = {"dense": model, "compact": done["small"]}
        if theirs is not None:
            times["torch_pruning"] = theirs
        best = {k: float("inf") for k in times}
        for _ in range(rounds):  # side by side, round after round
            for k, m in times.items():
                best[k] = min(best[k], forward_time(m, big, 1))
        row[label]["dense_s"], row[label]["compact_s"] = best["dense"], best["compact"]
        row[label]["torch_pruning_s"] = best.get("torch_pruning")
    return row


def own_class(model: torch.nn.Module, structure: Any, x: torch.Tensor, masks: Any) -> str:
    """Whether ``fprune.compact`` (the user's own class) builds the compact model: ``"yes"``, or
    the module its error names."""
    import fprune

    params = {k: v.detach() for k, v in model.named_parameters()}
    try:
        fprune.compact(model, params, masks, structure, (x,))
    except fprune.structure.CompactError as error:
        text = str(error)
        if "MultiheadAttention" in text:
            return "no: nn.MultiheadAttention heads"
        where = text.split("in module ", 1)[-1].split(",", 1)[0] if "in module " in text else text[:40]
        return f"no: {where}"
    return "yes"


def _m(n: int) -> str:
    return f"{n / 1e6:.2f}M"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.1f} ms"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"## Structural pruning across torchvision's classifiers ({m['date_utc']} UTC)",
        "",
        (
            f"`python -m benchmarks.zoo`: fprune at {m['git_commit']}, torch {m['torch']}, torchvision "
            f"{report['torchvision']}, Torch-Pruning {report['torch_pruning'] or 'not installed'}; "
            f"{m['cores']} cores, {report['threads']} intra-op thread(s); load average (1 min) during "
            f"the run {report['load'][0]:.1f}-{report['load'][1]:.1f}. Random init, 64x64 images "
            f"(224x224 for vit_b_16). Half the channels of every prunable exact group "
            f"(`group_structured(0.5)`, local); *inexact* rows prune the inexact groups too "
            f"(`allow_inexact=True`). Forward: batch {report['batch']}, best of {report['rounds']}, "
            f"the dense, compact and Torch-Pruning models "
            f"(the module Torch-Pruning pruned in a child process, saved with `torch.save`) "
            f"side by side in one process. Error: max |compact - masked| "
            f"/ max |masked| on the default init and on a copy where every channel matters."
        ),
        "",
        (
            "| model | groups prunable / total | `groups` wall (CPU) | params dense | fprune | "
            "Torch-Pruning | fprune / TP | forward dense | fprune | TP | error default | every channel | "
            "`compact`: own class |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        tp = row.get("torch_pruning") or {}
        for label in ("exact", "allow_inexact"):
            if label not in row:
                continue
            r = row[label]
            name = row["model"] + (" (inexact)" if label == "allow_inexact" else "")
            groups = f"{row['prunable']} / {row['groups']}" + (
                f" ({row['inexact']} inexact)" if row["inexact"] else ""
            )
            if "parameters" in tp:
                tp_p, ratio, tp_t = (
                    _m(tp["parameters"]),
                    f"{r['parameters'] / tp['parameters']:.2f}x",
                    f"{_ms(r['torch_pruning_s'])} ({r['torch_pruning_s'] / r['dense_s']:.2f}x)",
                )
            elif tp:
                tp_p, ratio, tp_t = f"failed: {tp['error']}"[:70], "-", "-"
            else:
                tp_p, ratio, tp_t = "not run", "-", "-"
            lines.append(
                f"| {name} | {groups} | {row['groups_wall_s']:.1f} s ({row['groups_cpu_s']:.1f} s) | "
                f"{_m(row['parameters'])} | {_m(r['parameters'])} | {tp_p} | {ratio} | "
                f"{_ms(r['dense_s'])} | {_ms(r['compact_s'])} ({r['compact_s'] / r['dense_s']:.2f}x) | "
                f"{tp_t} | {r['error']:.1e} | {r['error_every_channel']:.1e} | "
                f"{row.get('own_class', '-') if label == 'exact' else '-'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.run import machine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-torch-pruning", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "zoo"))
    args = parser.parse_args(argv)
    models = import_torchvision()
    if models is None:
        print("torchvision is not installed: pip install -e '.[zoo]'", file=sys.stderr)
        return 1
    has_tp = importlib.util.find_spec("torch_pruning") is not None and not args.no_torch_pruning
    tp_version = None
    if has_tp:
        from importlib.metadata import version

        tp_version = version("torch-pruning")
    loads, rows = [os.getloadavg()[0]], []
    for name in args.models:
        row = measure(name, args.batch, args.rounds, args.threads, has_tp)
        loads.append(os.getloadavg()[0])
        rows.append(row)
        print(json.dumps(row), flush=True)
    import torchvision

    report = {
        "machine": machine(),
        "torchvision": torchvision.__version__,
        "torch_pruning": tp_version,
        "threads": args.threads,
        "batch": args.batch,
        "rounds": args.rounds,
        "load": [min(loads), max(loads)],
        "rows": rows,
        "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    Path(args.out + ".json").write_text(json.dumps(report, indent=1) + "\n")
    Path(args.out + ".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
