"""fprune's one-shot pruning beside llm-compressor's: extra peak memory and time, SparseGPT and Wanda.

Usage (from the repository root, with the venv that has llm-compressor; see pyproject's ``peer``
extra: ``pip install -c <(echo torch==2.13.0) llmcompressor==0.14.0.1``)::

    /work/venv-peer/bin/python -m benchmarks.posttrain_peer --rounds 3 \\
        --json benchmarks/results/posttrain_peer.json --markdown benchmarks/results/posttrain_peer.md
    python -m benchmarks.posttrain_peer --quick      # 2 layers, 16 x 64 tokens (a minute)

The model is a Llama-architecture decoder built from a config with SmolLM-135M's shape
(hidden 576, intermediate 1536, 30 layers, 9 heads, 3 kv heads, vocab 49152, tied embeddings;
134.5M parameters, random init, float32, ``eval()``), calibration 64 sequences of 256 random
tokens in 8 batches of 8, the same batches for both libraries. Each (method, library) runs in a
fresh process of the same interpreter:

* fprune: ``fprune.oneshot.prune(model, params, batches, 0.5, method=...)`` (with
  ``inplace=True`` where ``prune`` takes it: the pruned weights replace the module's own);
* llm-compressor: ``llmcompressor.oneshot(model=model, dataset=<the batches as a DataLoader>,
  recipe=SparseGPTModifier(sparsity=0.5, targets=["LlamaDecoderLayer"], ignore=["re:.*lm_head"]))``
  (``WandaPruningModifier`` alike; SparseGPT's block size 128 and damping 0.01 in both), which
  prunes the model in place.

Extra peak memory is the process's RSS high-water during pruning minus its RSS just before
(model and data built, the library imported, freed memory handed back with ``malloc_trim``, the
kernel's high-water reset with ``/proc/self/clear_refs``). The per-layer sparsities of
the two libraries are compared (the zeros of each pruned weight). llm-compressor is skipped
when it is not installed. Magnitude (fprune only: llm-compressor's magnitude modifier is a
training-time schedule) runs with ``--methods sparsegpt,wanda,magnitude``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import inspect
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # python benchmarks/posttrain_peer.py
    sys.path.insert(0, str(ROOT))

LIBRARIES = ("fprune", "llmcompressor")
MIB = 2**20


def _rss_peak() -> int:
    """The process's RSS high-water mark in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status(field: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> tuple[int, str]:
    """Start a fresh high-water mark here: freed memory is handed back to the system (so that it
    cannot hide later growth), and the kernel's RSS high-water is reset to the current RSS
    (``echo 5 > /proc/self/clear_refs``); returns the RSS now and how the peak is measured."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status("VmRSS"), "VmHWM after clear_refs"
    except OSError:  # no clear_refs: the high-water since the process started
        return _rss_peak(), "ru_maxrss"


def peak_since_reset(how: str) -> int:
    return _status("VmHWM") if how.startswith("VmHWM") else _rss_peak()


def has_llmcompressor() -> bool:
    import importlib.util

    return importlib.util.find_spec("llmcompressor") is not None


def build(quick: bool, layers: int | None) -> tuple[Any, list[dict], dict]:
    """The model (seed 0) and the calibration batches (seed 1)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers or (2 if quick else 30),
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    sequences, length, per_batch = (16, 64, 8) if quick else (64, 256, 8)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (sequences, length), generator=g)
    batches = [{"input_ids": tokens[i : i + per_batch]} for i in range(0, sequences, per_batch)]
    shape = {"layers": config.num_hidden_layers, "calibration_tokens": [sequences, length]}
    return model, batches, shape


def _decoder_weights(model: Any) -> dict:
    import torch

    return {
        f"{name}.weight": module.weight
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.startswith("model.layers.")
    }


BLOCKS: list[list[int]] = []  # per block pruned: [RSS, RSS high-water] when its report came


def _trace(report: Any) -> None:
    if getattr(report, "phase", "prune") == "prune":
        BLOCKS.append([_status("VmRSS"), _status("VmHWM")])


def fprune_options(prune: Any) -> dict:
    """fprune's lowest-memory call that ``prune`` offers: pruned weights written into the
    module's own (``inplace=True``) and no masks kept (``masks=None``), where it takes them."""
    parameters = inspect.signature(prune).parameters
    options: dict = {}
    if "inplace" in parameters:
        options["inplace"] = True
    if "masks" in parameters:
        options["masks"] = None
    return options


def _run_fprune(model: Any, batches: list, method: str) -> tuple[dict, dict]:
    import fprune

    params = {k: v.detach() for k, v in model.named_parameters()}
    options = {"method": method, **fprune_options(fprune.oneshot.prune)}
    new, _ = fprune.oneshot.prune(model, params, batches, 0.5, progress=_trace, **options)
    if not options.get("inplace"):
        fprune.load_into(model, new)  # the module holds the pruned weights, as after llm-compressor
    del new
    weights = _decoder_weights(model)
    sparsity = {k: float((w == 0).float().mean()) for k, w in weights.items()}
    return sparsity, options


def _tokenizer() -> Any:
    """A one-word tokenizer built here (nothing downloaded)."""
    import tokenizers
    import transformers

    model = tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(model), unk_token="<unk>"
    )


def _run_llmcompressor(model: Any, batches: list, method: str) -> tuple[dict, dict]:
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.pruning import SparseGPTModifier, WandaPruningModifier

    common = {"sparsity": 0.5, "targets": ["LlamaDecoderLayer"], "ignore": ["re:.*lm_head"]}
    if method == "sparsegpt":
        recipe = SparseGPTModifier(block_size=128, dampening_frac=0.01, **common)
    elif method == "wanda":
        recipe = WandaPruningModifier(**common)
    else:
        raise ValueError(f"llm-compressor has no one-shot {method!r} here")
    import tempfile

    # oneshot reads the model's config again from config.name_or_path: a folder with config.json.
    folder = tempfile.mkdtemp(prefix="posttrain_peer_")
    model.config.save_pretrained(folder)
    model.config._name_or_path = folder
    loader = torch.utils.data.DataLoader(batches, batch_size=None)  # the batches as they are
    oneshot(
        model=model,
        dataset=loader,
        recipe=recipe,
        processor=_tokenizer(),  # required with a dataset; the token ids are given, never made
        num_calibration_samples=sum(len(b["input_ids"]) for b in batches),
    )
    weights = _decoder_weights(model)
    sparsity = {k: float((w == 0).float().mean()) for k, w in weights.items()}
    return sparsity, {"recipe": repr(recipe)}


def worker(library: str, method: str, quick: bool, layers: int | None, threads: int | None) -> dict[str, Any]:
    import torch
    import transformers

    if threads:
        torch.set_num_threads(threads)
    if library == "llmcompressor":
        import llmcompressor  # noqa: F401  (imported before the baseline, as fprune is)
    else:
        import fprune  # noqa: F401
    start_rss = _rss_now()
    model, batches, shape = build(quick, layers)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    baseline_peak = _rss_peak()
    baseline_rss, how = reset_peak()
    load_before = os.getloadavg()[0]
    started, cpu_started = time.perf_counter(), time.process_time()
    run = _run_fprune if library == "fprune" else _run_llmcompressor
    sparsity, options = run(model, batches, method)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    peak = peak_since_reset(how)
    values = list(sparsity.values())
    return {
        "library": library,
        "method": method,
        **shape,
        "parameters": sum(p.numel() for p in model.parameters()),
        "model_bytes": model_bytes,
        "options": {k: str(v) for k, v in options.items()},
        "threads": torch.get_num_threads(),
        "wall_s": wall,
        "cpu_s": cpu,
        "process_rss_start": start_rss,
        "baseline_rss": baseline_rss,
        "baseline_peak": baseline_peak,
        "peak_rss": peak,
        "extra_peak": peak - baseline_rss,
        "peak_measured_by": how,
        "layers_pruned": len(values),
        "sparsity_min": min(values) if values else None,
        "sparsity_max": max(values) if values else None,
        "sparsity": sparsity,
        "blocks_rss_hwm": [[rss - baseline_rss, hwm - baseline_rss] for rss, hwm in BLOCKS],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "fprune"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def summary(runs: list[dict]) -> dict:
    """Median wall time, CPU time and extra peak per (method, library), and the ratios."""
    table: dict = {}
    for run in runs:
        cell = table.setdefault(run["method"], {}).setdefault(run["library"], {"runs": []})
        cell["runs"].append(run)
    for _method, cells in table.items():
        for cell in cells.values():
            for key in ("wall_s", "cpu_s", "extra_peak"):
                cell[key] = _median([r[key] for r in cell["runs"]])
            cell["rounds"] = len(cell["runs"])
            cell["sparsity_range"] = [
                min(r["sparsity_min"] for r in cell["runs"]),
                max(r["sparsity_max"] for r in cell["runs"]),
            ]
        if "fprune" in cells and "llmcompressor" in cells:
            a, b = cells["fprune"], cells["llmcompressor"]
            sa, sb = a["runs"][0]["sparsity"], b["runs"][0]["sparsity"]
            cells["ratio"] = {key: a[key] / b[key] for key in ("wall_s", "cpu_s", "extra_peak")}
            cells["sparsity_max_difference"] = max((abs(sa[k] - sb[k]) for k in sa), default=None)
            cells["same_layers"] = sorted(sa) == sorted(sb)
    return table


def markdown(record: dict) -> str:
    lines = [
        (
            f"### fprune beside llm-compressor: one-shot pruning at 50%, Llama-architecture decoder of "
            f"SmolLM-135M's shape, {record['layers']} of its 30 layers ({record['parameters'] / 1e6:.1f}M)"
        ),
        "",
        (
            f"{record['date']}, commit {record['commit']}, {record['threads']} threads, load "
            f"{record['load'][0]:.1f} / {record['load'][1]:.1f} (1-minute average at the start / end), "
            f"python {record['python']}, torch {record['versions']['torch']}, transformers "
            f"{record['versions']['transformers']}, llm-compressor {record['versions']['llmcompressor']}. "
            f"Model: {record['parameters'] / 1e6:.1f}M parameters ({record['model_bytes'] / MIB:.0f} MiB "
            f"float32), {record['layers']} layers, calibration {record['calibration_tokens'][0]} x "
            f"{record['calibration_tokens'][1]} tokens in batches of 8; each cell is the median of "
            f"its rounds, each run a fresh process. Extra peak: RSS high-water during pruning minus "
            f"RSS just before (model and data built; high-water reset by /proc/self/clear_refs)."
        ),
        "",
        "| method | library | rounds | extra peak (MiB) | x model | wall (s) | CPU (s) | layer sparsity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, cells in record["table"].items():
        for library in LIBRARIES:
            if library not in cells:
                continue
            c = cells[library]
            lo, hi = c["sparsity_range"]
            lines.append(
                f"| {method} | {library} | {c['rounds']} | {c['extra_peak'] / MIB:.0f} | "
                f"{c['extra_peak'] / record['model_bytes']:.2f} | {c['wall_s']:.1f} | {c['cpu_s']:.1f} | "
                f"{lo:.4f}-{hi:.4f} |"
            )
        if "ratio" in cells:
            r = cells["ratio"]
            lines.append(
                f"| {method} | **fprune / llm-compressor** | | **{r['extra_peak']:.2f}** | | "
                f"**{r['wall_s']:.2f}** | **{r['cpu_s']:.2f}** | max per-layer difference "
                f"{cells['sparsity_max_difference']:.4f} |"
            )
    options = {
        f"{m}/{lib}": c["runs"][0]["options"]
        for m, cells in record["table"].items()
        for lib, c in cells.items()
        if lib in LIBRARIES
    }
    lines += ["", "Calls: " + "; ".join(f"{k}: {v}" for k, v in options.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 layers, 16 x 64 tokens")
    parser.add_argument("--layers", type=int, help="decoder layers (default 30)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default="sparsegpt,wanda")
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run a round's processes at the same time (each its own RSS; compare CPU times)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--worker", nargs=2, metavar=("LIBRARY", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.quick, args.layers, args.threads)))
        return 0
    libraries = [lib for lib in args.libraries.split(",") if lib != "llmcompressor" or has_llmcompressor()]
    if "llmcompressor" in args.libraries and "llmcompressor" not in libraries:
        print("llm-compressor is not installed: fprune only (pip install '.[peer]')", file=sys.stderr)
    load_start = os.getloadavg()[0]
    runs = []
    for round_ in range(args.rounds):
        jobs = []
        for method in args.methods.split(","):
            for library in libraries:
                if library == "llmcompressor" and method == "magnitude":
                    continue
                flags = ["--worker", library, method, "--threads", str(args.threads)]
                flags += ["--quick"] if args.quick else []
                flags += ["--layers", str(args.layers)] if args.layers else []
                command = [sys.executable, "-m", "benchmarks.posttrain_peer", *flags]
                env = dict(os.environ, PYTHONPATH=str(ROOT))
                pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
                jobs.append((method, library, subprocess.Popen(command, cwd=ROOT, env=env, **pipes)))
                if not args.parallel:
                    jobs[-1][2].wait()
        for method, library, proc in jobs:
            out, err = proc.communicate()
            if proc.returncode:
                sys.stderr.write(err[-5000:])
                return proc.returncode
            run = json.loads(out.strip().splitlines()[-1])
            print(
                f"round {round_ + 1} {method} {library}: extra peak {run['extra_peak'] / MIB:.0f} MiB, "
                f"{run['wall_s']:.1f} s wall, {run['cpu_s']:.1f} s CPU, load {run['load_before']:.1f}",
                file=sys.stderr,
                flush=True,
            )
            runs.append(run)
    first = runs[0]
    record = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "command": " ".join(
            [Path(sys.executable).name, "-m", "benchmarks.posttrain_peer", *(argv or sys.argv[1:])]
        ),
        "python": platform.python_version(),
        "threads": first["threads"],
        "load": [load_start, os.getloadavg()[0]],
        "parallel": args.parallel,
        "versions": {
            p: _version(p) for p in ("torch", "transformers", "llmcompressor", "compressed-tensors")
        },
        "parameters": first["parameters"],
        "model_bytes": first["model_bytes"],
        "layers": first["layers"],
        "calibration_tokens": first["calibration_tokens"],
        "table": summary(runs),
    }
    text = markdown(record)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
