"""Benchmarks on an accelerator: ``python -m benchmarks --device cuda`` (or ``python -m benchmarks.gpu``).

Everything is built on the device (``to_empty`` and ``normal_`` with a device generator), timed
with the device synchronized around each call (the median of ``repeats`` after 2 warm-ups),
with the device's peak memory (``torch.cuda.max_memory_allocated``) and the host syncs of each
call (``torch.cuda.set_sync_debug_mode("warn")`` warnings). Rows:

* ``global``: ``fprune.global_unstructured`` 0.5 / 0.9 on the transformer-like models (every
  Linear weight, float32) of ``--sizes``, against one read pass (``abs().sum()`` over the same
  leaves), torch's ``global_unstructured`` (``L1Unstructured``, where it fits: <= 100M), and the
  traced path (a tensor amount under ``vmap``).
* ``training``: a training step of a 4x1024 MLP, dense against ``masked_call`` (50% pruned).
* ``ensemble``: 8 MLPs under ``vmap``, ``masked_call`` against dense.

The same module runs on the CPU (``--device cpu --quick``), which is how its test checks it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torch.nn.utils.prune as torch_prune
from torch.func import functional_call, stack_module_state, vmap

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

import fprune  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks.worker import unprune  # noqa: E402


def unavailable(device: str) -> str | None:
    """A one-line reason why ``device`` cannot run here, or None when it can."""
    try:
        dev = torch.device(device)
    except RuntimeError as error:
        return f"benchmarks.gpu: --device {device!r} is not a torch device ({error})."
    if dev.type == "cuda" and not torch.cuda.is_available():
        return (
            f"benchmarks.gpu: --device {device} needs a CUDA GPU, and this torch "
            f"({torch.__version__}) sees none (torch.cuda.is_available() is False); nothing was run."
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return (
            f"benchmarks.gpu: --device {device} needs Apple's MPS, which this machine lacks; nothing was run."
        )
    return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> dict[str, Any]:
    for _ in range(2):
        fn()
    synchronize(device)
    times: list[float] = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {"times": times, "median_s": statistics.median(times)}


def host_syncs(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Host syncs of one call, from CUDA's sync debug mode (None off CUDA)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def peak_bytes(fn: Callable[[], Any], device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = fn()
    synchronize(device)
    del result
    return torch.cuda.max_memory_allocated(device) - before


def transformer_on(size: str, device: torch.device) -> torch.nn.Module:
    d, blocks = models.TRANSFORMER_SIZES[size]
    with torch.device("meta"):
        model = models.TransformerLike(d, blocks)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=g)
    return model


def global_rows(size: str, device: torch.device, repeats: int, with_torch: bool) -> dict[str, Any]:
    model = transformer_on(size, device)
    targets = models.weight_modules(model)
    weights = {name + ".weight": m.weight.detach() for name, m in targets}
    count = sum(w.numel() for w in weights.values())
    out: dict[str, Any] = {"weights": count}
    out["abs_sum"] = timed(lambda: sum(w.abs().sum() for w in weights.values()), device, repeats)
    for amount in (0.5, 0.9):
        call = lambda *, amount=amount: fprune.global_unstructured(weights, amount)
        out[f"fprune_{amount}"] = dict(
            timed(call, device, repeats), syncs=host_syncs(call, device), peak_bytes=peak_bytes(call, device)
        )
    levels = torch.tensor([0.5], device=device)
    traced = lambda: vmap(lambda a: fprune.global_unstructured(weights, a))(levels)
    try:
        out["traced_0.5"] = dict(
            timed(traced, device, max(1, repeats // 2)), peak_bytes=peak_bytes(traced, device)
        )
    except torch.OutOfMemoryError as error:  # the sort path holds several bytes per weight
        out["traced_0.5"] = {"error": str(error).splitlines()[0]}
    if with_torch:
        pairs = [(m, "weight") for _, m in targets]

        def torch_global():
            torch_prune.global_unstructured(pairs, pruning_method=torch_prune.L1Unstructured, amount=0.5)
            for m, name in pairs:
                unprune(m, name)

        out["torch_0.5"] = timed(torch_global, device, max(1, repeats // 2))
    return out


def training_rows(device: torch.device, repeats: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = models.MLP(1024, 1024, 4).to(device) if hasattr(models, "MLP") else None
    params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    masks = fprune.l1_unstructured(params, 0.5, where=lambda n, p: p.dim() > 1)
    x = torch.randn(128, 1024, device=device)
    y = torch.randint(0, 10, (128,), device=device)

    def step(masked: bool):
        def run():
            out = (
                fprune.masked_call(model, params, masks, (x,))
                if masked
                else functional_call(model, params, (x,))
            )
            loss = F.cross_entropy(out[:, :10], y)
            grads = torch.autograd.grad(loss, list(params.values()))
            with torch.no_grad():
                for p, g in zip(params.values(), grads, strict=True):
                    p.sub_(0.01 * g)

        return run

    return {"dense": timed(step(False), device, repeats), "masked_call": timed(step(True), device, repeats)}


def ensemble_rows(device: torch.device, repeats: int, batch: int = 512) -> dict[str, Any]:
    torch.manual_seed(0)
    members = [models.MLP(256, 512, 2).to(device) for _ in range(8)]
    params, _ = stack_module_state(members)
    params = {n: p.detach() for n, p in params.items()}
    masks = vmap(lambda p: fprune.l1_unstructured(p, 0.5, where=lambda n, t: n.endswith("weight")))(params)
    base = models.MLP(256, 512, 2).to("meta")
    x = torch.randn(batch, 256, device=device)
    with torch.no_grad():
        masked = lambda: vmap(lambda p, m: fprune.masked_call(base, p, m, (x,)))(params, masks)
        dense = lambda: vmap(lambda p: functional_call(base, p, (x,)))(params)
        return {
            "vmap_masked_call": timed(masked, device, repeats),
            "vmap_dense": timed(dense, device, repeats),
        }


def run(device: str, sizes: list[str], quick: bool) -> dict[str, Any]:
    dev = torch.device(device)
    repeats = 3 if quick else 5
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "global": {},
    }
    for size in sizes:
        report["global"][size] = global_rows(
            size, dev, repeats, with_torch=models.TRANSFORMER_SIZES[size][0] <= 768
        )
        print(f"gpu benchmark: global {size} done", file=sys.stderr, flush=True)
    report["training"] = training_rows(dev, repeats)
    report["ensemble"] = ensemble_rows(dev, repeats)
    return report


def _fmt(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return "error"
    s = entry["median_s"]
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"### On {report['device']} (torch {report['torch']})",
        "",
        (
            "| weights | amount | fprune | abs().sum() | fprune / read pass "
            "| torch | host syncs | peak B/weight "
            "| traced (vmap) | traced peak B/weight |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size, res in report["global"].items():
        read = res["abs_sum"]["median_s"]
        for amount in (0.5, 0.9):
            f = res[f"fprune_{amount}"]
            peak = f"{f['peak_bytes'] / res['weights']:.2f}" if f.get("peak_bytes") is not None else "-"
            tr = res.get("traced_0.5", {}) if amount == 0.5 else {}
            tpeak = f"{tr['peak_bytes'] / res['weights']:.2f}" if tr.get("peak_bytes") is not None else "-"
            lines.append(
                f"| {size} | {amount} | {_fmt(f)} | {_fmt(res['abs_sum'])} | {f['median_s'] / read:.1f}x | "
                f"{_fmt(res.get('torch_0.5')) if amount == 0.5 else '-'} | "
                f"{f.get('syncs') if f.get('syncs') is not None else '-'} | "
                f"{peak} | {_fmt(tr) if tr else '-'} | {tpeak} |"
            )
    t, e = report["training"], report["ensemble"]
    lines += [
        "",
        (
            f"Training step (MLP 4x1024, batch 128): dense {_fmt(t['dense'])}"
            f", masked_call {_fmt(t['masked_call'])} "
            f"({t['masked_call']['median_s'] / t['dense']['median_s']:.2f}x). "
            f"Ensemble of 8 MLPs, batch 512: vmap dense "
            f"{_fmt(e['vmap_dense'])}, vmap masked_call {_fmt(e['vmap_masked_call'])} "
            f"({e['vmap_masked_call']['median_s'] / e['vmap_dense']['median_s']:.2f}x)."
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--sizes", nargs="*", default=None, help="transformer sizes (default 100M 1.5B; --quick: 1M)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    missing = unavailable(args.device)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    sizes = args.sizes or (["1M"] if args.quick else ["100M", "1.5B"])
    report = run(args.device, sizes, args.quick)
    text = markdown(report)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
