"""The benchmark runner: fprune and ``torch.nn.utils.prune`` measured side by side in one run.

Usage (from the repository root)::

    python -m benchmarks            # the full suite (about 20 minutes on 2 cores)
    python -m benchmarks --quick    # small sizes, no inductor, one process: under 20 seconds
    python benchmarks/run.py --quick --json results.json --markdown results.md

Every pruning configuration runs in a fresh subprocess (:mod:`benchmarks.worker`), so its
extra peak memory is the RSS high-water after the runs minus the high-water once the model
is built. ``--quick`` runs its configurations one after another in the runner's own process
(the high-water is reset before each; memory an earlier configuration freed to the allocator
may be reused without showing, so its extra-memory figures can read lower). The runner prints
a markdown table per section and writes the JSON (with the machine's details) where ``--json``
says. Sections:

1. ``global``: global magnitude pruning of every Linear weight of transformer-like float32
   models, amounts 0.5 and 0.9: ``fprune.global_unstructured``, ``torch.nn.utils.prune.
   global_unstructured`` (``L1Unstructured``) and ``fprune.compat.global_unstructured``.
   torch is skipped, with a note, where its ~50 bytes per weight would not fit in memory.
2. ``floor``: one read pass over the same weights (``sum()`` and ``abs().sum()``).
3. ``local``: ``l1_unstructured`` on every weight; ``structured``: ``ln_structured`` (L2,
   dim 0) on the conv and linear weights of a VGG-like net and of a transformer-like model.
4. ``training``: a training step (forward, backward, SGD) of a pruned 4x1024 MLP (4x256 in
   ``--quick``) and of the tutorial's LeNet: dense, torch's hooks, ``masked_call`` eager, and
   (not in ``--quick``) dense and ``masked_call`` under ``torch.compile`` (inductor).
5. ``ensemble``: forward of 8 pruned MLPs: a loop over hook-pruned modules, one ``vmap`` of
   ``masked_call`` over stacked parameters, and the same ``vmap`` without masks.

``--targets`` runs only what the performance targets need (:data:`TARGETS`; about 10 minutes on
2 cores) and prints a table of each target against its figure: global pruning and the read-pass
floor at 50M and 100M weights, the extra memory of global pruning at 50M and of
``l1_unstructured`` at 10M (``memory``: one fresh process per Python hash seed, since the
allocator's layout varies from process to process), and the MLP training step, eager and
compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # python benchmarks/run.py
    sys.path.insert(0, str(ROOT))

# benchmarks.models (and torch) are imported where used: the commands that hand a section to
# its own module and process (--only sparse, --device cuda, ...) start without them.

AMOUNTS = [0.5, 0.9]
# Extra peak memory of global pruning, bytes per weight, as measured (upper ends): torch's
# global_unstructured 47-53, fprune.compat's 8-9 (float mask buffers and the recomputed
# weights that torch's contract requires: 8), fprune's 1-1.5.
GLOBAL_BYTES_PER_WEIGHT = {"torch": 53, "compat": 9.5, "fprune": 2}


def plan(quick: bool) -> list[dict[str, Any]]:
    """Every configuration to run, in order."""
    configs: list[dict[str, Any]] = []
    sizes = ["1M"] if quick else ["10M", "100M", "400M", "1.5B"]
    for size in sizes:
        weights = _weights(size)
        fast_repeats = 3 if quick else (5 if weights <= 1.1e8 else 3)
        torch_repeats = 1 if (quick or weights > 1.1e8) else (3 if weights < 2e7 else 2)
        configs.append({"case": "floor", "model": size, "repeats": fast_repeats})
        for impl, repeats in (("fprune", fast_repeats), ("torch", torch_repeats), ("compat", torch_repeats)):
            amounts = [AMOUNTS] if quick else [[a] for a in AMOUNTS]
            for group in amounts:
                configs.append(
                    {"case": "global", "impl": impl, "model": size, "amounts": group, "repeats": repeats}
                )
    local_sizes = ["1M"] if quick else ["10M", "100M"]
    for size in local_sizes:
        for impl in ("fprune", "torch", "compat"):
            configs.append(
                {"case": "local", "impl": impl, "model": size, "amounts": [0.5], "repeats": 1 if quick else 3}
            )
    for model in ["vgg"] if quick else ["vgg", "100M"]:
        for impl in ("fprune", "torch", "compat"):
            configs.append(
                {
                    "case": "structured",
                    "impl": impl,
                    "model": model,
                    "amounts": [0.5],
                    "repeats": 1 if quick else 3,
                }
            )
    for model in ("mlp", "lenet"):
        config = {"case": "training", "model": model, "compile": not quick, "steps": 5 if quick else 30}
        configs.append(dict(config, width=256) if quick and model == "mlp" else config)
    for batch in [64] if quick else [64, 512]:
        configs.append({"case": "ensemble", "members": 8, "batch": batch, "steps": 5 if quick else 50})
    return configs


# The performance targets ``--targets`` checks: (what, limit); each figure must be at most the limit.
TARGETS = [
    ("global_unstructured at 50M: extra bytes per weight, masks included (max over processes)", 1.0),
    ("l1_unstructured at 10M: extra bytes per weight, masks included (max over processes)", 2.3),
    ("global_unstructured at 50M: time / one abs().sum() pass (amounts 0.5, 0.9)", 5.0),
    ("global_unstructured at 100M: time / one abs().sum() pass (amounts 0.5, 0.9)", 5.0),
    ("MLP training step, masked_call compiled with fprune's bool masks / dense compiled", 1.25),
    ("MLP training step, masked_call eager / torch's hooks", 1.0),
]
MEMORY_SEEDS = (1, 2, 3)


def plan_targets() -> list[dict[str, Any]]:
    """The configurations the targets need (see :data:`TARGETS`)."""
    configs: list[dict[str, Any]] = []
    for size in ("50M", "100M"):
        configs.append({"case": "floor", "model": size, "repeats": 5})
        for amount in AMOUNTS:
            configs.append(
                {"case": "global", "impl": "fprune", "model": size, "amounts": [amount], "repeats": 5}
            )
    for method, size in (("global", "50M"), ("local", "10M")):
        for seed in MEMORY_SEEDS:
            configs.append(
                {
                    "case": "memory",
                    "method": method,
                    "impl": "fprune",
                    "model": size,
                    "amounts": [0.5],
                    "repeats": 2,
                    "hash_seed": seed,
                }
            )
    configs.append({"case": "training", "model": "mlp", "compile": True, "steps": 30})
    return configs


def _weights(size: str) -> int:
    from benchmarks import models

    d, blocks = models.TRANSFORMER_SIZES[size]
    return 12 * d * d * blocks


def available_memory() -> int:
    """MemAvailable from /proc/meminfo, in bytes (0 if unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def skip_reason(config: dict[str, Any]) -> str | None:
    """Why a configuration is not run (where it would not fit in memory), or None."""
    if config["case"] != "global":
        return None
    weights = _weights(config["model"])
    per_weight = GLOBAL_BYTES_PER_WEIGHT[config["impl"]]
    need = weights * (per_weight + 4)  # its extra memory plus the float32 model
    have = available_memory()
    if have and need > have - (2 << 30):
        return (
            f"skipped: would need ~{need / 2**30:.0f} GiB ({per_weight} B/weight extra + the model), "
            f"{have / 2**30:.0f} GiB available"
        )
    return None


def run_config(config: dict[str, Any], threads: int | None, timeout: float) -> dict[str, Any]:
    """Run one configuration in a fresh subprocess; its JSON result, or the error."""
    config = dict(config, threads=threads)
    reason = skip_reason(config)
    if reason:
        return {"config": config, "skipped": reason}
    command = [sys.executable, "-m", "benchmarks.worker", json.dumps(config)]
    env = dict(os.environ)
    if "hash_seed" in config:  # the allocator's layout follows the process's hash seed
        env["PYTHONHASHSEED"] = str(config["hash_seed"])
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"config": config, "error": f"timed out after {timeout:.0f} s"}
    record: dict[str, Any] = {
        "config": config,
        "wall_s": time.perf_counter() - started,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        record["error"] = f"exit {proc.returncode}: " + " | ".join(tail)
        return record
    record["result"] = json.loads(proc.stdout.strip().splitlines()[-1])
    return record


def run_in_process(config: dict[str, Any], threads: int | None) -> dict[str, Any]:
    """Run one configuration in this process (:func:`benchmarks.worker.measure`); a record as
    :func:`run_config` gives."""
    from benchmarks import worker

    config = dict(config, threads=threads)
    reason = skip_reason(config)
    if reason:
        return {"config": config, "skipped": reason}
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    record: dict[str, Any] = {"config": config}
    try:
        result = worker.measure(config)
    except Exception as error:  # reported in the record, as a failed worker is
        result = None
        record["error"] = f"{type(error).__name__}: {error}"
    record.update(
        wall_s=time.perf_counter() - started, load_before=load_before, load_after=os.getloadavg()[0]
    )
    if result is not None:
        record["result"] = json.loads(json.dumps(result))  # what a worker's JSON line gives
    return record


def machine() -> dict[str, Any]:
    import torch

    from benchmarks.record import cpu_model

    cpu = cpu_model()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    total = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        total = int(Path("/proc/meminfo").read_text().split()[1]) * 1024
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(total / 2**30, 1),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "git_commit": commit,
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
    }


# ---------------------------------------------------------------------------------- tables


def _fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _find(records, **want) -> dict[str, Any] | None:
    for r in records:
        c = r["config"]
        if all(c.get(k) == v for k, v in want.items()):
            return r
    return None


def _median(record, amount) -> float | None:
    if not record or "result" not in record:
        return None
    entry = record["result"].get("amounts", {}).get(str(amount))
    return entry["median_s"] if entry else None


def _cell(record, amount) -> str:
    """A time cell: the median, or why there is none."""
    if record is None:
        return "-"
    if "skipped" in record:
        return "skipped (memory)"
    if "error" in record:
        return "error"
    if record["result"].get("available") is False:
        return "not available"
    return _fmt_s(_median(record, amount))


def _bytes(record) -> str:
    if not record or "result" not in record or "extra_bytes_per_weight" not in record["result"]:
        return "-"
    return f"{record['result']['extra_bytes_per_weight']:.2f}"


def _ratio(a: float | None, b: float | None, digits: int = 1) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.{digits}f}x"


def _record_for(records, case, impl, model, amount):
    for r in records:
        c = r["config"]
        if (
            c["case"] == case
            and c.get("impl") == impl
            and c.get("model") == model
            and amount in c.get("amounts", [])
        ):
            return r
    return None


def global_table(records) -> list[str]:
    lines = [
        "### 1-2. Global magnitude pruning (all Linear weights, float32) and the read-pass floor",
        "",
        (
            "| weights | amount | fprune | torch | fprune.compat | torch / fprune | compat: torch / compat "
            "| abs().sum() | sum() | fprune / abs().sum() | extra B/weight: fprune | torch | compat |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    from benchmarks import models

    sizes = [s for s in models.TRANSFORMER_SIZES if _find(records, case="floor", model=s)]
    for size in sizes:
        floor = _find(records, case="floor", model=size)
        floor_abs = floor["result"]["abs_sum"]["median_s"] if floor and "result" in floor else None
        floor_sum = floor["result"]["sum"]["median_s"] if floor and "result" in floor else None
        for amount in AMOUNTS:
            rec = {
                impl: _record_for(records, "global", impl, size, amount)
                for impl in ("fprune", "torch", "compat")
            }
            t = {impl: _median(r, amount) for impl, r in rec.items()}
            weights = _weights(size)
            lines.append(
                f"| {size} ({weights / 1e6:.0f}M) | {amount} | {_cell(rec['fprune'], amount)} | "
                f"{_cell(rec['torch'], amount)} | {_cell(rec['compat'], amount)} | "
                f"{_ratio(t['torch'], t['fprune'])} | {_ratio(t['torch'], t['compat'])} | "
                f"{_fmt_s(floor_abs)} | {_fmt_s(floor_sum)} | {_ratio(t['fprune'], floor_abs)} | "
                f"{_bytes(rec['fprune'])} | {_bytes(rec['torch'])} | {_bytes(rec['compat'])} |"
            )
            for impl, r in rec.items():
                if r and "skipped" in r:
                    notes.append(f"- {size}, {impl}, amount {amount}: {r['skipped']}.")
                if r and "error" in r:
                    notes.append(f"- {size}, {impl}, amount {amount}: {r['error']}.")
    return lines + [""] + sorted(set(notes)) + ([""] if notes else [])


def local_table(records) -> list[str]:
    lines = [
        (
            "### 3. Local pruning: l1_unstructured on every weight"
            ", ln_structured (L2, dim 0) on conv/linear weights"
        ),
        "",
        (
            "| method | model (weights) | fprune | torch | fprune.compat | torch / fprune "
            "| extra B/weight: fprune | torch | compat |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, label in (("local", "l1_unstructured 0.5"), ("structured", "ln_structured 0.5")):
        seen = []
        for r in records:
            if r["config"]["case"] == case and r["config"]["model"] not in seen:
                seen.append(r["config"]["model"])
        for model in seen:
            rec = {
                impl: _record_for(records, case, impl, model, 0.5) for impl in ("fprune", "torch", "compat")
            }
            t = {impl: _median(r, 0.5) for impl, r in rec.items()}
            weights = next(
                (
                    r["result"]["weights"]
                    for r in rec.values()
                    if r and "result" in r and "weights" in r["result"]
                ),
                None,
            )
            name = "VGG-like" if model == "vgg" else f"transformer {model}"
            size = f"{weights / 1e6:.1f}M" if weights else "?"
            lines.append(
                f"| {label} | {name} ({size}) | {_cell(rec['fprune'], 0.5)} | {_cell(rec['torch'], 0.5)} | "
                f"{_cell(rec['compat'], 0.5)} "
                f"| {_ratio(t['torch'], t['fprune'])} | {_bytes(rec['fprune'])} | "
                f"{_bytes(rec['torch'])} | {_bytes(rec['compat'])} |"
            )
    return lines + [""]


def training_table(records) -> list[str]:
    columns = [
        "dense",
        "torch_hooks",
        "masked_call",
        "projected",
        "dense_compiled",
        "masked_call_compiled",
        "masked_call_compiled_float",
        "projected_compiled",
    ]
    lines = [
        "### 4. Training step (forward + backward + SGD), 50% of weights pruned",
        "",
        (
            "Eager: dense, torch's hooks, `masked_call` (bool masks), projected (weights stored pruned, "
            "dense forward, masks applied after each SGD update). Compiled (inductor, the loss only): dense, "
            "`masked_call` with fprune's bool masks, `masked_call` with weight masks cast once to the "
            "weights' dtype, projected. RigL: the projected step plus one mask update "
            "(`fprune.rigl`, drop/grow by sort) every 100 steps, amortized."
        ),
        "",
        (
            "| model | dense | hooks | masked_call | projected | dense comp. | masked_call comp. (bool) "
            "| masked_call comp. (float) | projected comp. | RigL update "
            "| hooks / dense | masked_call / dense "
            "| projected / dense | comp.: masked bool / dense "
            "| comp.: masked float / dense | comp.: projected / dense "
            "| RigL step / dense (every 100, amortized) |"
        ),
        "|---|" + "---|" * 16,
    ]
    for r in records:
        if r["config"]["case"] != "training":
            continue
        width = r["config"].get("width", 1024)
        name = {"mlp": f"MLP 4x{width}, batch 128", "lenet": "LeNet, batch 256"}[r["config"]["model"]]
        if "result" not in r:
            lines.append(f"| {name} | {r.get('error', r.get('skipped'))} |" + " |" * 15)
            continue
        res = r["result"]
        t = {c: res[c]["median_s"] if c in res else None for c in columns + ["rigl_update"]}
        cells = [_fmt_s(t[c]) if t[c] is not None else "skipped (--quick)" for c in columns]
        rigl = None
        if t["projected"] is not None and t["rigl_update"] is not None:
            rigl = t["projected"] + t["rigl_update"] / 100
        lines.append(
            f"| {name} | "
            + " | ".join(cells[:4])
            + " | "
            + " | ".join(cells[4:])
            + f" | {_fmt_s(t['rigl_update'])} | "
            f"{_ratio(t['torch_hooks'], t['dense'], 2)} | {_ratio(t['masked_call'], t['dense'], 2)} | "
            f"{_ratio(t['projected'], t['dense'], 2)} "
            f"| {_ratio(t['masked_call_compiled'], t['dense_compiled'], 2)} | "
            f"{_ratio(t['masked_call_compiled_float'], t['dense_compiled'], 2)} | "
            f"{_ratio(t['projected_compiled'], t['dense_compiled'], 2)} | {_ratio(rigl, t['dense'], 2)} |"
        )
    return lines + [""]


def ensemble_table(records) -> list[str]:
    lines = [
        "### 5. Ensemble of 8 pruned MLPs (256-512-512-10, 50% of weights pruned), forward",
        "",
        (
            "| batch | loop over 8 hook-pruned modules | vmap(masked_call) | vmap without masks "
            "| vmap masked / vmap dense | loop / vmap masked |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        if r["config"]["case"] != "ensemble":
            continue
        if "result" not in r:
            lines.append(f"| {r['config']['batch']} | {r.get('error')} | | | | |")
            continue
        t = {k: v["median_s"] for k, v in r["result"].items() if isinstance(v, dict)}
        lines.append(
            f"| {r['config']['batch']} | {_fmt_s(t['loop_hooks'])} "
            f"| {_fmt_s(t['vmap_masked_call'])} | {_fmt_s(t['vmap_dense'])} | "
            f"{_ratio(t['vmap_masked_call'], t['vmap_dense'], 2)} "
            f"| {_ratio(t['loop_hooks'], t['vmap_masked_call'], 2)} |"
        )
    return lines + [""]


def _memory(records, method: str, model: str) -> list[float]:
    return [
        r["result"]["extra_bytes_per_weight"]
        for r in records
        if r["config"]["case"] == "memory"
        and "result" in r
        and (r["config"]["method"], r["config"]["model"]) == (method, model)
    ]


def memory_table(records) -> list[str]:
    lines = [
        "### Memory: extra peak bytes per weight, masks included (one fresh process per hash seed)",
        "",
        "| call | model | processes | min | median | max |",
        "|---|---|---|---|---|---|",
    ]
    calls = (("global", "50M", "global_unstructured 0.5"), ("local", "10M", "l1_unstructured 0.5"))
    for method, model, label in calls:
        values = sorted(_memory(records, method, model))
        if values:
            lines.append(
                f"| {label} | transformer {model} | {len(values)} | {values[0]:.3f} | "
                f"{values[len(values) // 2]:.3f} | {values[-1]:.3f} |"
            )
    return lines + [""]


def target_figures(records) -> list:
    """For each of :data:`TARGETS`: ``(figure as text, met)``, or None where it was not measured."""

    def worst(values):
        return max(values) if values else None

    def speed(size):
        floor = _find(records, case="floor", model=size)
        if not floor or "result" not in floor:
            return None
        base = floor["result"]["abs_sum"]["median_s"]
        ratios = [_median(_record_for(records, "global", "fprune", size, a), a) for a in AMOUNTS]
        return [r / base for r in ratios if r is not None] or None

    training = _find(records, case="training", model="mlp")
    t = {}
    if training and "result" in training:
        t = {k: v["median_s"] for k, v in training["result"].items() if isinstance(v, dict)}
    compiled = t["masked_call_compiled"] / t["dense_compiled"] if "masked_call_compiled" in t else None
    eager = t["masked_call"] / t["torch_hooks"] if "masked_call" in t else None
    values: list[Any] = [
        worst(_memory(records, "global", "50M")),
        worst(_memory(records, "local", "10M")),
        speed("50M"),
        speed("100M"),
        compiled,
        eager,
    ]
    out: list = []
    for (what, limit), value in zip(TARGETS, values, strict=True):
        if value is None:
            out.append(None)
        elif isinstance(value, list):
            out.append((", ".join(f"{v:.1f}x" for v in value), max(value) <= limit))
        else:
            out.append((f"{value:.3f}" if "bytes" in what else f"{value:.2f}x", value <= limit))
    return out


def targets_table(records) -> list[str]:
    lines = ["### Targets", "", "| target | limit | measured | |", "|---|---|---|---|"]
    for (what, limit), figure in zip(TARGETS, target_figures(records), strict=True):
        if figure is None:
            lines.append(f"| {what} | {limit} | not measured | |")
        else:
            text, met = figure
            lines.append(f"| {what} | {limit} | {text} | {'met' if met else 'missed'} |")
    return lines + [""]


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    where = "the runner's process, reset before each" if report["mode"] == "quick" else "a fresh process per"
    head = [
        f"## Benchmarks ({report['mode']} run, {m['date_utc']} UTC)",
        "",
        (
            f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; torch {m['torch']} "
            f"({report['threads']} intra-op threads), Python {m['python']}; GPU: {m['cuda'] or 'none'}; "
            f"fprune at {m['git_commit']}. Times are medians; extra memory is the RSS high-water of {where}"
            " configuration, minus its high-water once the model is built and the code paths "
            f"are warmed up on a tiny model. Load average (1 min) during the run: "
            f"{report['load_min']:.2f}-{report['load_max']:.2f}."
        ),
        "",
    ]
    records = report["records"]
    if report["mode"] == "targets":
        body = targets_table(records) + memory_table(records) + global_table(records)
        body += training_table(records)
    else:
        tables = (global_table, local_table, training_table, ensemble_table)
        body = [line for table in tables for line in _if_rows(table(records))]
    return "\n".join(head + body)


def _if_rows(lines: list[str]) -> list[str]:
    """A section's lines if its table has a row, else none (sections a run left out, ``--only``)."""
    separator = next((i for i, line in enumerate(lines) if line.startswith("|---")), None)
    if separator is None:
        return lines
    return lines if any(line.startswith("|") for line in lines[separator + 1 :]) else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, no inductor, all in one process (under 20 s)"
    )
    parser.add_argument(
        "--targets", action="store_true", help="only what the performance targets need, and their table"
    )
    parser.add_argument("--json", type=Path, help="write the results (and machine details) here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--only",
        nargs="*",
        help="cases to run: global floor local structured training ensemble"
        " (or many_leaves, posttrain or sparse, alone)",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per configuration")
    parser.add_argument(
        "--device", default="cpu", help="cuda: the accelerator benchmarks (benchmarks/gpu.py)"
    )
    args = parser.parse_args(argv)
    if args.only == ["sparse"]:  # its own section and process: benchmarks/sparse.py
        flags = ["--quick"] if args.quick else []
        for key in ("json", "markdown", "threads", "device"):
            flags += [f"--{key}", str(getattr(args, key))] if getattr(args, key) else []
        return subprocess.call([sys.executable, "-m", "benchmarks.sparse", *flags], cwd=ROOT)
    if args.device != "cpu":  # its own module and process: benchmarks/gpu.py
        flags = ["--device", args.device] + (["--quick"] if args.quick else [])
        for key in ("json", "markdown"):
            flags += [f"--{key}", str(getattr(args, key))] if getattr(args, key) else []
        return subprocess.call([sys.executable, "-m", "benchmarks.gpu", *flags], cwd=ROOT)
    if args.only in (["many_leaves"], ["posttrain"]):  # own sections and processes: benchmarks/<name>.py
        flags = ["--quick"] if args.quick else []
        for key in ("json", "markdown", "threads"):
            flags += [f"--{key}", str(getattr(args, key))] if getattr(args, key) else []
        return subprocess.call([sys.executable, "-m", f"benchmarks.{args.only[0]}", *flags], cwd=ROOT)

    import torch

    threads = args.threads or torch.get_num_threads()
    records = []
    configs = plan_targets() if args.targets else plan(args.quick)
    configs = [c for c in configs if not args.only or c["case"] in args.only]
    for i, config in enumerate(configs, 1):
        if args.quick and not args.targets:
            record = run_in_process(config, args.threads)
        else:
            record = run_config(config, args.threads, args.timeout)
        records.append(record)
        status = record.get("skipped") or record.get("error") or f"{record['wall_s']:.1f} s"
        print(f"[{i}/{len(configs)}] {json.dumps(config)}: {status}", file=sys.stderr, flush=True)
    loads = [r[k] for r in records for k in ("load_before", "load_after") if k in r] or [0.0]
    report = {
        "mode": "targets" if args.targets else ("quick" if args.quick else "full"),
        "threads": threads,
        "machine": machine(),
        "load_min": min(loads),
        "load_max": max(loads),
        "records": records,
    }
    text = markdown(report)
    print(text)
    print("```json")
    print(json.dumps(report))
    print("```")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
