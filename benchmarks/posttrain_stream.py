"""One-shot pruning of a checkpoint larger than memory: ``prune_pretrained`` from disk to disk.

Usage (from the repository root; the checkpoints go outside the repository)::

    python -m benchmarks.posttrain_stream --shape tinyllama --methods wanda,sparsegpt   # quick form
    python -m benchmarks.posttrain_stream --shape 13b --methods wanda \\
        --json benchmarks/results/posttrain_stream.json \\
        --markdown benchmarks/results/posttrain_stream.md
    python -m benchmarks.posttrain_stream --shape 13b --write-only     # the source checkpoint only
    python -m benchmarks.posttrain_stream --shape 13b --delete-source  # remove it afterwards

The source is a ``transformers`` checkpoint directory of a Llama-architecture decoder of the
given shape (``13b``: Llama-2-13B's, hidden 5120, intermediate 13824, 40 blocks, 40 heads,
vocab 32000, 13.0B parameters; ``tinyllama``: TinyLlama-1.1B's, hidden 2048, intermediate
5632, 22 blocks, 32 heads, 4 kv heads), bfloat16, laid out as ``save_pretrained`` lays it out
(``config.json``, ``generation_config.json``, ``model-0000k-of-0000n.safetensors`` shards of at
most 5 GB and ``model.safetensors.index.json``, ``LlamaForCausalLM``'s parameter names). It is
written here shard by shard and tensor by tensor (each safetensors header from the known shapes,
then each tensor's bytes), never the whole model in memory: each matrix is windows of one pool
of 2**24 normal samples (std 0.02) at random offsets, the norms are ones. It is written once
(``--source``, default ``/work/ckpt/<shape>``) and reused while its ``.complete`` marker says it
was written with the same shape.

Each method runs ``fprune.oneshot.prune_pretrained(source, output, batches, 0.5, method=...)``
in a fresh process (calibration: one batch of 8 x 128 random tokens), while this process samples
that process's anonymous resident memory (``RssAnon`` of ``/proc/<pid>/status``, every 0.2 s:
the memory that is the process's own, not the checkpoint's pages mapped from disk) for its peak,
and the load average. Per-block times come from ``progress=`` (a callable). Afterwards every
pruned layer's sparsity is read from the output, one tensor at a time, every other tensor is
compared with the source's, and the output is deleted (``--keep-output`` keeps it). A run still
going after ``--time-limit`` seconds is stopped and recorded as partial (blocks done, seconds per
block, the projected total). Results are merged into the JSON file (one entry per shape and
method, the latest kept) and the markdown is written from all entries.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # python benchmarks/posttrain_stream.py
    sys.path.insert(0, str(ROOT))

from benchmarks.posttrain_peer import _commit, _version  # noqa: E402  (after the path is set)
from benchmarks.record import cpu_model  # noqa: E402

GIB = 2**30
MIB = 2**20
SHARD_BYTES = 5 * 10**9  # save_pretrained's max_shard_size="5GB"
POOL = 2**24
SPARSITY = 0.5
CALIBRATION = (8, 128)
PRUNED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

SHAPES: dict[str, dict[str, Any]] = {
    "13b": {  # meta-llama/Llama-2-13b-hf's config
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 40,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
    "tinyllama": {  # TinyLlama/TinyLlama-1.1B's config
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    },
}
SHAPES["smoke"] = {  # a check of the harness in seconds
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
GOALS = {"13b": {"peak_anon_gib": 6.0, "wall_s": {"wanda": 15 * 60.0, "sparsegpt": 60 * 60.0}}}


# ---------------------------------------------------------------------------------------------
# The checkpoint


def tensors(shape: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """``LlamaForCausalLM``'s parameters in its ``state_dict`` order: (name, shape)."""
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = h // heads
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (shape["vocab_size"], h))]
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (heads * head_dim, h)),
            (p + "self_attn.k_proj.weight", (kv * head_dim, h)),
            (p + "self_attn.v_proj.weight", (kv * head_dim, h)),
            (p + "self_attn.o_proj.weight", (h, heads * head_dim)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (shape["vocab_size"], h))]
    return out


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def shards(shape: dict[str, Any], limit: int = SHARD_BYTES) -> list[list[tuple[str, tuple[int, ...]]]]:
    """The tensors split as ``save_pretrained`` splits them: in order, a new shard whenever the
    next tensor would take the current one past ``limit`` bytes (bfloat16: 2 bytes an entry)."""
    out: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, dims in tensors(shape):
        nbytes = 2 * _numel(dims)
        if out[-1] and size + nbytes > limit:
            out.append([])
            size = 0
        out[-1].append((name, dims))
        size += nbytes
    return out


def _header(entries: list[tuple[str, tuple[int, ...]]]) -> bytes:
    """A safetensors header: 8 bytes of length, then the JSON, padded with spaces to 8 bytes."""
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims in entries:
        nbytes = 2 * _numel(dims)
        meta[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_checkpoint(directory: Path, name: str, log: Any = print) -> dict[str, Any]:
    """Write the checkpoint of shape ``name`` into ``directory`` (see the module's docstring)."""
    import numpy as np
    import torch
    import transformers

    shape = SHAPES[name]
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / ".complete"
    marker.unlink(missing_ok=True)
    config = transformers.LlamaConfig(**shape, bos_token_id=1, eos_token_id=2)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.bfloat16
    config.save_pretrained(directory)
    transformers.GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(directory)

    g = torch.Generator().manual_seed(0)
    pool = (torch.randn(POOL, generator=g) * 0.02).to(torch.bfloat16).view(torch.int16).numpy()
    pool = np.concatenate([pool, pool])  # any window of POOL entries from any offset
    ones = torch.ones(max(d[0] for _, d in tensors(shape) if len(d) == 1), dtype=torch.bfloat16)
    ones_np = ones.view(torch.int16).numpy()
    split = shards(shape)
    files = [f"model-{k + 1:05d}-of-{len(split):05d}.safetensors" for k in range(len(split))]
    if len(split) == 1:
        files = ["model.safetensors"]  # save_pretrained's name for one shard (and no index)
    weight_map, total = {}, 0
    started = time.perf_counter()
    for file, entries in zip(files, split, strict=True):
        with open(directory / file, "wb") as f:
            f.write(_header(entries))
            for tensor_name, dims in entries:
                n = _numel(dims)
                if len(dims) == 1:
                    f.write(memoryview(ones_np[:n]))
                else:
                    for start in range(0, n, POOL):
                        count = min(POOL, n - start)
                        offset = int(torch.randint(0, POOL, (), generator=g))
                        f.write(memoryview(pool[offset : offset + count]))
                weight_map[tensor_name] = file
                total += 2 * n
        log(f"wrote {file}: {len(entries)} tensors, {(directory / file).stat().st_size / GIB:.2f} GiB")
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    seconds = time.perf_counter() - started
    check_checkpoint(directory, name)
    info = {"shape": name, "bytes": total, "shards": len(files), "write_s": seconds}
    marker.write_text(json.dumps(info) + "\n")
    log(f"checkpoint {directory}: {total / GIB:.2f} GiB in {len(files)} shards, written in {seconds:.0f} s")
    return info


def check_checkpoint(directory: Path, name: str) -> None:
    """The checkpoint reads back: ``AutoConfig`` gives the shape, ``safe_open`` gives every
    tensor with ``LlamaForCausalLM``'s names, shapes and dtype (built on the meta device), and
    the tensors read are the ones written (the norms, and each matrix's first row)."""
    import torch
    import transformers
    from safetensors import safe_open

    shape = SHAPES[name]
    config = transformers.AutoConfig.from_pretrained(directory)
    for key, value in shape.items():
        if getattr(config, key) != value:
            raise AssertionError(f"config.json: {key} = {getattr(config, key)!r}, expected {value!r}")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    weight_map = _weight_map(directory)
    seen: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(weight_map.values())):
        with safe_open(directory / file, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118  (safe_open has no __iter__)
                part = f.get_slice(key)
                if part.get_dtype() != "BF16":
                    raise AssertionError(f"{file}: {key} is {part.get_dtype()}, expected BF16")
                seen[key] = tuple(part.get_shape())
                if weight_map[key] != file:
                    raise AssertionError(f"index: {key} in {weight_map[key]}, found in {file}")
                if len(seen[key]) == 1:
                    if not bool((f.get_tensor(key) == 1).all()):
                        raise AssertionError(f"{file}: {key} is not ones")
                else:
                    row = part[0:1]
                    if row.dtype != torch.bfloat16 or not 0.005 < float(row.float().std()) < 0.05:
                        raise AssertionError(f"{file}: {key}'s first row is not the pool's samples")
    if seen != expected:
        missing = sorted(set(expected) - set(seen))[:3]
        extra = sorted(set(seen) - set(expected))[:3]
        wrong = sorted(k for k in set(seen) & set(expected) if seen[k] != expected[k])[:3]
        raise AssertionError(f"names/shapes differ from LlamaForCausalLM: {missing=} {extra=} {wrong=}")


def _weight_map(directory: Path) -> dict[str, str]:
    """Tensor name -> shard file, from the index (or the one ``model.safetensors``)."""
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.exists():
        return json.loads(index.read_text())["weight_map"]
    with safe_open(directory / "model.safetensors", framework="pt") as f:
        return dict.fromkeys(f.keys(), "model.safetensors")


def ensure_checkpoint(directory: Path, name: str, log: Any) -> dict[str, Any]:
    marker = directory / ".complete"
    if marker.exists():
        info = json.loads(marker.read_text())
        if info.get("shape") == name:
            log(f"reusing {directory} ({info['bytes'] / GIB:.2f} GiB)")
            return info
    return write_checkpoint(directory, name, log)


# ---------------------------------------------------------------------------------------------
# The run (a fresh process), measured from here


def worker(source: str, output: str, method: str, threads: int, vocab: int) -> None:
    """In the fresh process: prune ``source`` into ``output``; one JSON line per block on stdout
    (``BLOCK {...}``), then ``RESULT {...}``."""
    import torch

    import fprune

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    batches = [{"input_ids": torch.randint(0, vocab, CALIBRATION, generator=g)}]
    ready = _proc_status(os.getpid())
    print("READY " + json.dumps({"rss_anon": ready.get("RssAnon")}), flush=True)
    started, cpu_started = time.perf_counter(), time.process_time()

    def progress(report: Any) -> None:
        record = {
            "phase": getattr(report, "phase", "prune"),
            "block": report.number,
            "total": report.total,
            "name": report.name,
            "layers": report.layers,
            "seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu_started,
            "statistics_s": report.statistics_seconds,
            "pruning_s": report.pruning_seconds,
            "forward_s": report.forward_seconds,
            "load": os.getloadavg()[0],
        }
        for key in ("read_seconds", "write_seconds"):
            if hasattr(report, key):
                record[key] = getattr(report, key)
        print("BLOCK " + json.dumps(record), flush=True)

    fprune.oneshot.prune_pretrained(source, output, batches, SPARSITY, method=method, progress=progress)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    result = {"wall_s": wall, "cpu_s": cpu, "threads": torch.get_num_threads()}
    print("RESULT " + json.dumps(result), flush=True)


def _proc_status(pid: int) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/<pid>/status``, in bytes (empty once the process is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


class Sampler(threading.Thread):
    """Samples a process's ``RssAnon`` and ``RssFile`` every ``interval`` seconds, and the load
    average every ``load_every`` seconds, until it is gone or :meth:`stop` is called."""

    def __init__(self, pid: int, interval: float = 0.2, load_every: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.load_every = pid, interval, load_every
        self.peak_anon = self.peak_file = self.samples = 0
        self.peak_anon_at = 0.0
        self.loads: list[tuple[float, float]] = []
        self.started = time.perf_counter()
        self._stop_event = threading.Event()

    def run(self) -> None:
        next_load = 0.0
        while not self._stop_event.is_set():
            now = time.perf_counter() - self.started
            status = _proc_status(self.pid)
            if not status:
                break
            anon = status.get("RssAnon", 0)
            if anon > self.peak_anon:
                self.peak_anon, self.peak_anon_at = anon, now
            self.peak_file = max(self.peak_file, status.get("RssFile", 0))
            self.samples += 1
            if now >= next_load:
                self.loads.append((round(now, 1), os.getloadavg()[0]))
                next_load = now + self.load_every
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def run_method(
    source: Path, output: Path, method: str, threads: int, time_limit: float | None, log: Any, vocab: int
) -> dict[str, Any]:
    """Run one method in a fresh process and measure it from here."""
    if output.exists():
        shutil.rmtree(output)
    command = [
        sys.executable,
        "-m",
        "benchmarks.posttrain_stream",
        "--worker",
        str(source),
        str(output),
        method,
        "--threads",
        str(threads),
        "--vocab",
        str(vocab),
    ]
    load_before = os.getloadavg()
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT))
    )
    sampler = Sampler(proc.pid)
    sampler.start()
    blocks: list[dict] = []
    result: dict[str, Any] = {}
    ready: dict[str, Any] = {}
    last_cpu: float | None = None
    timer = None
    stopped = False
    if time_limit:

        def stop() -> None:
            nonlocal stopped, last_cpu
            stopped = True
            last_cpu = _cpu_seconds(proc.pid)
            log(f"{method}: time limit of {time_limit:.0f} s reached, stopping the run")
            proc.send_signal(signal.SIGTERM)

        timer = threading.Timer(time_limit, stop)
        timer.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        kind, _, payload = line.partition(" ")
        if kind == "BLOCK":
            blocks.append(json.loads(payload))
            b = blocks[-1]
            log(
                f"{method} {b['phase']} {b['block'] + 1}/{b['total']}: {b['seconds']:.0f} s, "
                f"statistics {b['statistics_s']:.1f} s, pruning {b['pruning_s']:.1f} s, forward "
                f"{b['forward_s']:.1f} s; RssAnon peak so far {sampler.peak_anon / GIB:.2f} GiB, "
                f"load {b['load']:.1f}"
            )
        elif kind == "RESULT":
            result = json.loads(payload)
        elif kind == "READY":
            ready = json.loads(payload)
        else:
            sys.stderr.write(line)
    returncode = proc.wait()
    wall = time.perf_counter() - started
    if timer is not None:
        timer.cancel()
    sampler.stop()
    load_after = os.getloadavg()
    pruned = [b for b in blocks if b["phase"] == "prune"]
    total = pruned[-1]["total"] if pruned else None
    record: dict[str, Any] = {
        "method": method,
        "command_worker": " ".join(command[1:]),
        "complete": returncode == 0 and bool(result),
        "returncode": returncode,
        "stopped_at_time_limit": stopped,
        "process_wall_s": wall,
        "wall_s": result.get("wall_s"),
        "cpu_s": result.get("cpu_s", last_cpu),
        "threads": result.get("threads", threads),
        "peak_rss_anon": sampler.peak_anon,
        "peak_rss_anon_at_s": sampler.peak_anon_at,
        "rss_anon_ready": ready.get("rss_anon"),
        "peak_rss_file": sampler.peak_file,
        "samples": sampler.samples,
        "sample_interval_s": sampler.interval,
        "load_before": list(load_before),
        "load_during": sampler.loads,
        "load_after": list(load_after),
        "blocks": blocks,
        "blocks_done": len(pruned),
        "blocks_total": total,
    }
    if pruned:
        ends = [p["seconds"] for p in pruned]
        per_block = [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]
        record["block_seconds"] = per_block
        if not record["complete"] and total:
            # From the blocks done after the first (which also reads the embeddings and captures).
            rest = per_block[1:] or per_block
            record["projected_wall_s"] = pruned[-1]["seconds"] + (total - len(pruned)) * sum(rest) / len(rest)
    return record


def check_output(source: Path, output: Path, log: Any) -> dict[str, Any]:
    """Every pruned layer's sparsity in the output, one tensor at a time; every other tensor
    compared with the source's; the output's config read back."""
    import torch
    import transformers
    from safetensors import safe_open

    transformers.AutoConfig.from_pretrained(output)
    src_index, out_index = _weight_map(source), _weight_map(output)
    if sorted(src_index) != sorted(out_index):
        raise AssertionError("the output's tensors are not the source's")
    sparsity: dict[str, float] = {}
    unchanged: dict[str, bool] = {}
    started = time.perf_counter()
    by_file: dict[str, list[str]] = {}
    for key, file in out_index.items():
        by_file.setdefault(file, []).append(key)
    for file, keys in sorted(by_file.items()):
        with safe_open(output / file, framework="pt") as f:
            for key in keys:
                t = f.get_tensor(key)
                if key.split(".")[-2] in PRUNED:
                    sparsity[key] = float((t == 0).sum()) / t.numel()
                else:
                    with safe_open(source / src_index[key], framework="pt") as s:
                        unchanged[key] = bool(torch.equal(t, s.get_tensor(key)))
                del t
    values = list(sparsity.values())
    log(f"output checked in {time.perf_counter() - started:.0f} s: {len(values)} pruned layers")
    return {
        "layers_pruned": len(values),
        "sparsity_min": min(values) if values else None,
        "sparsity_max": max(values) if values else None,
        "others_unchanged": all(unchanged.values()),
        "others": len(unchanged),
        "output_bytes": sum(p.stat().st_size for p in output.glob("*.safetensors")),
        "output_files": sorted(p.name for p in output.iterdir()),
    }


# ---------------------------------------------------------------------------------------------
# The results


def _parameters(name: str) -> int:
    return sum(_numel(d) for _, d in tensors(SHAPES[name]))


def markdown(record: dict) -> str:
    lines = [
        "### One-shot pruning from disk to disk: `fprune.oneshot.prune_pretrained`, 50%",
        "",
        (
            "Each row: a transformers checkpoint directory (bfloat16 safetensors shards, random weights) "
            "pruned into a new one by a fresh process; calibration 8 x 128 random tokens. Peak "
            "anonymous memory: the largest `RssAnon` of that process (sampled every 0.2 s: its own "
            "memory, not the checkpoint's pages mapped from disk). Sparsity read back from the "
            "output, every pruned layer; every other tensor compared with the source's."
        ),
        "",
        (
            "| shape | parameters | checkpoint (GiB) | method | complete | peak anon (GiB) | anon at start "
            "(GiB) | wall (s) | CPU (s) | blocks | s / block (median) | layer sparsity | load before / "
            "during (max) / after | date, commit |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in record["runs"]:
        during = max((load for _, load in run["load_during"]), default=float("nan"))
        per_block = sorted(run.get("block_seconds") or [float("nan")])
        median = per_block[len(per_block) // 2]
        if run["complete"]:
            wall = f"{run['wall_s']:.0f}"
            done = "yes"
        else:
            wall = f"{run['process_wall_s']:.0f} (projected {run.get('projected_wall_s', float('nan')):.0f})"
            done = "**partial**"
        check = run.get("check") or {}
        sparsity = (
            f"{check['sparsity_min']:.4f}-{check['sparsity_max']:.4f} ({check['layers_pruned']} layers)"
            if check.get("layers_pruned")
            else "not checked"
        )
        cpu = f"{run['cpu_s']:.0f}" if run.get("cpu_s") is not None else "-"
        lines.append(
            f"| {run['shape']} | {run['parameters'] / 1e9:.2f}B | {run['checkpoint_bytes'] / GIB:.1f} | "
            f"{run['method']} | {done} | {run['peak_rss_anon'] / GIB:.2f} | "
            f"{(run['rss_anon_ready'] or 0) / GIB:.2f} | {wall} | {cpu} | "
            f"{run['blocks_done']}/{run['blocks_total']} | {median:.1f} | {sparsity} | "
            f"{run['load_before'][0]:.1f} / {during:.1f} / {run['load_after'][0]:.1f} | "
            f"{run['date']}, {run['commit'][:12]} |"
        )
    lines += ["", *(f"* {summary(run)}" for run in record["runs"])]
    lines += ["", "Commands and machine:", ""]
    for run in record["runs"]:
        lines.append(
            f"* {run['shape']} {run['method']}: `{run['command']}`; {run['cpu']}, {run['threads']} threads "
            f"({run['cpus']} CPUs); python {run['python']}, torch {run['versions']['torch']}, "
            f"transformers {run['versions']['transformers']}, safetensors {run['versions']['safetensors']}."
        )
    return "\n".join(lines)


def summary(run: dict) -> str:
    """One run's figures against its goals, as docs/posttrain.md states them."""
    name = {"13b": "13B", "tinyllama": "1.1B", "smoke": "smoke"}[run["shape"]]
    method = {"wanda": "Wanda", "sparsegpt": "SparseGPT"}.get(run["method"], run["method"])
    goals = run.get("goals") or {}
    peak = run["peak_rss_anon"] / GIB
    text = f"{name}, {method}: peak anonymous memory {peak:.2f} GiB"
    if goals:
        met = "met" if peak <= goals["peak_anon_gib"] else "not met"
        text += f" (goal: at most {goals['peak_anon_gib']:.0f} GiB, {met})"
    per_block = sorted(run.get("block_seconds") or [float("nan")])
    median = per_block[len(per_block) // 2]
    if run["complete"]:
        text += f"; {run['wall_s']:.0f} s of wall time, {run['cpu_s']:.0f} s of CPU time"
        wall = run["wall_s"]
    else:
        projected = run.get("projected_wall_s", float("nan"))
        text += (
            f"; stopped after {run['process_wall_s']:.0f} s with {run['blocks_done']} of "
            f"{run['blocks_total']} blocks done (a median of {median:.0f} s a block): "
            f"{projected:.0f} s projected for all"
        )
        wall = projected
    goal_s = (goals.get("wall_s") or {}).get(run["method"])
    if goal_s:
        text += f" (goal: under {goal_s / 60:.0f} min, {'met' if wall < goal_s else 'not met'})"
    pruned = [b for b in run["blocks"] if b["phase"] == "prune"]
    parts = {k: sum(b[k] for b in pruned) for k in ("statistics_s", "pruning_s", "forward_s")}
    if pruned and pruned[-1]["seconds"] > 0:
        whole = pruned[-1]["seconds"]
        text += (
            f"; of the blocks' time, statistics {parts['statistics_s'] / whole:.0%}, pruning "
            f"{parts['pruning_s'] / whole:.0%}, next inputs {parts['forward_s'] / whole:.0%}"
        )
    during = max((load for _, load in run["load_during"]), default=float("nan"))
    return text + f"; load {run['load_before'][0]:.1f} before, up to {during:.1f} during."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama")
    parser.add_argument("--methods", default="wanda,sparsegpt")
    parser.add_argument("--source", type=Path, help="the checkpoint's directory (default /work/ckpt/<shape>)")
    parser.add_argument("--output", type=Path, help="the pruned checkpoint's (default <source>-pruned)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--time-limit", type=float, help="seconds a run may take before it is stopped")
    parser.add_argument("--keep-output", action="store_true")
    parser.add_argument("--render", action="store_true", help="write --markdown from --json, no run")
    parser.add_argument("--write-only", action="store_true", help="write the source checkpoint, no run")
    parser.add_argument("--delete-source", action="store_true", help="delete the source checkpoint and exit")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--vocab", type=int, default=32000, help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=3, metavar=("SOURCE", "OUTPUT", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker, args.threads, args.vocab)
        return 0

    def log(message: str) -> None:
        print(f"{datetime.datetime.now().strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)

    if args.render:
        text = markdown(json.loads(args.json.read_text()))
        if args.markdown:
            args.markdown.write_text(text + "\n")
        print(text)
        return 0
    source = args.source or Path("/work/ckpt") / args.shape
    output = args.output or source.with_name(source.name + "-pruned")
    if args.delete_source:
        shutil.rmtree(source, ignore_errors=True)
        log(f"deleted {source}")
        return 0
    info = ensure_checkpoint(source, args.shape, log)
    if args.write_only:
        return 0
    previous = json.loads(args.json.read_text()) if args.json and args.json.exists() else {"runs": []}
    flags = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python", "-m", "benchmarks.posttrain_stream", *flags])
    for method in args.methods.split(","):
        log(f"{args.shape} {method}: {source} -> {output}")
        date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        vocab = SHAPES[args.shape]["vocab_size"]
        run = run_method(source, output, method, args.threads, args.time_limit, log, vocab)
        run.update(
            shape=args.shape,
            parameters=_parameters(args.shape),
            checkpoint_bytes=info["bytes"],
            shards=info["shards"],
            date=date,
            commit=_commit(),
            command=command,
            cpu=cpu_model(),
            cpus=os.cpu_count(),
            python=platform.python_version(),
            versions={p: _version(p) for p in ("torch", "transformers", "safetensors")},
            goals=GOALS.get(args.shape),
        )
        if run["complete"]:
            run["check"] = check_output(source, output, log)
        log(
            f"{args.shape} {method}: complete={run['complete']}, "
            f"peak RssAnon {run['peak_rss_anon'] / GIB:.2f} GiB, "
            f"wall {run['process_wall_s']:.0f} s, blocks {run['blocks_done']}/{run['blocks_total']}"
        )
        if not args.keep_output:
            shutil.rmtree(output, ignore_errors=True)
        runs = [r for r in previous["runs"] if (r["shape"], r["method"]) != (args.shape, method)]
        previous = {"runs": [*runs, run]}
        if args.json:
            args.json.write_text(json.dumps(previous, indent=1) + "\n")
        if args.markdown:
            args.markdown.write_text(markdown(previous) + "\n")
        if run["returncode"] and not run["stopped_at_time_limit"]:
            return run["returncode"]
    print(markdown(previous))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
