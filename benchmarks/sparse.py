"""Benchmark section "sparse": pruned linear layers run dense, masked and sparse, side by side.

Usage (from the repository root)::

    python -m benchmarks --only sparse        # the section (about 5 minutes on 2 cores)
    python -m benchmarks.sparse --json benchmarks/results/sparse.json --markdown benchmarks/results/sparse.md
    python -m benchmarks.sparse --crossover   # the table behind layout="auto" (fprune/sparse/_auto.py)
    python -m benchmarks.sparse --kernels     # csr @ x.T against F.linear(x, csr), int64 indices, ...
    python -m benchmarks.sparse --decode --crossover-threads 1 2  # generate: dense vs load_into'd sparse
    python -m benchmarks.sparse --decode --dtype bfloat16 --crossover-threads 1 2  # the same in bfloat16
    python -m benchmarks.sparse --auto --crossover-threads 1 2    # layout="auto"'s timed choice vs dense
    python -m benchmarks.sparse --device cuda # 2:4 (semi-structured) rows, on a GPU
    python -m benchmarks.sparse --quick       # small sizes: under a minute

Forward passes under ``torch.no_grad()``, float32, on the CPU (``--threads``: torch's intra-op
threads, default torch's). Every cell times its variants in interleaved rounds (dense, masked,
auto, csr, bsr, dense, ...), so a change in the machine's load hits them alike; the median of
each is reported, with the dense one's as the unit. The load average is recorded before and after.

* ``forward``: an MLP (1024-4096-1024, ``nn.Linear``) and a transformer block's FFN (GPT-2
  small's, 768-3072-768, transformers' ``Conv1D``), each weight pruned by ``l1_unstructured`` at
  50, 75, 90, 95 and 98%, at batch (rows) 1, 8, 64 and 512: dense (``functional_call`` on the
  unpruned weights), masked (``fprune.masked_call``), and ``fprune.sparse.to_sparse`` with
  ``layout="auto"``, ``"csr"`` and ``"bsr"`` (4x4 blocks).
* ``disk``: the MLP's parameters saved with ``torch.save``: dense against ``to_state`` of the
  sparse params (auto and csr), per sparsity.
* ``end_to_end``: a GPT-2-small-shaped language model (transformers ``GPT2LMHeadModel`` from a
  config: 12 layers, 768 wide, random weights, no download), each Conv1D weight of its blocks
  pruned by ``l1_unstructured`` to 90%: tokens per second, dense / masked / auto, for one
  128-token sequence and for 8 one-token sequences, and the checkpoint's size.
* ``crossover`` (``--crossover``): ``F.linear`` with a CSR :class:`fprune.sparse.SparseWeight`
  against dense ``F.linear`` on a grid of shapes, sparsities and rows (at 1 thread unless
  ``--crossover-threads`` says otherwise); from it, the crossover table of ``fprune/sparse/_auto.py``.
* ``kernels`` (``--kernels``): the ways to multiply by a pruned 4096x1024 weight (``csr @ x.T``
  with int32 and int64 indices, ``F.linear(x, csr)``, a dense copy per call, the backward's
  ``x @ csr``) against dense, the measurements behind SparseWeight's design.
* ``decode`` (``--decode``): greedy ``generate`` (batch 1, KV cache) of a GPT-2-small-shaped and
  a small Llama-shaped model (random weights), the blocks' linear weights pruned to 90%: dense
  against the same module with ``fprune.sparse.load_into`` of ``to_sparse``'s csr / auto params.
  ``--dtype bfloat16`` (or float16): both models in that dtype, csr only (its kernel multiplies in
  float32 and casts the output back).
* ``auto`` (``--auto``): ``layout="auto"``'s choice, timed at conversion, against dense
  ``F.linear`` on a grid of shapes, sparsities (50-99%) and rows.
* ``semi_structured`` (``--device cuda``): fp16 ``nn.Linear`` layers with 2:4 masks, dense
  against ``layout="semi_structured"`` (torch's cuSPARSELt / CUTLASS kernels).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # python benchmarks/sparse.py
    sys.path.insert(0, str(ROOT))

import fprune  # noqa: E402
from fprune import sparse  # noqa: E402
from fprune.sparse import _auto  # noqa: E402

SPARSITIES = [0.5, 0.75, 0.9, 0.95, 0.98]
BATCHES = [1, 8, 64, 512]
VARIANTS = ["dense", "masked", "auto", "csr", "bsr"]
CROSSOVER_SHAPES = [
    (4096, 1024),
    (1024, 4096),
    (3072, 768),
    (768, 3072),
    (2304, 768),
    (768, 768),
    (512, 512),
    (256, 256),
]
AUTO_SHAPES = [(4096, 1024), (768, 3072), (768, 768), (256, 256)]
AUTO_SPARSITIES = [0.5, 0.7, 0.9, 0.95, 0.99]
CROSSOVER_SPARSITIES = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98]
RESULTS = ROOT / "benchmarks" / "results"


# ----------------------------------------------------------------------------------- timing


def interleaved(
    fns: dict[str, Callable[[], Any]], budget_s: float, min_rounds: int = 5, max_rounds: int = 200
) -> dict:
    """Times of each function over interleaved rounds (each round calls every function once, in
    an order shuffled anew each round).

    Two warm-up rounds, then as many rounds as fit in ``budget_s`` (within the bounds).
    Returns ``{name: {"median_s", "min_s", "ratio", "times"}}``, where ``ratio`` is the median over
    rounds of this function's time over the first function's time in the same round: the two
    calls ran a few milliseconds apart, so a change in the machine's load (other processes,
    memory bandwidth) hits both, and the median drops the rounds that one of them lost to a
    scheduler slice.
    """
    for _ in range(2):
        for fn in fns.values():
            fn()
    start = time.perf_counter()
    for fn in fns.values():
        fn()
    one = time.perf_counter() - start
    rounds = max(min_rounds, min(max_rounds, int(budget_s / max(one, 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    shuffler = random.Random(0)
    for _ in range(rounds):
        # a new order every round: a variant that evicts the caches (masked_call writes every
        # weight) does not always run just before the same other one
        shuffler.shuffle(order)
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            fns[name]()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    first, first_cpu = times[next(iter(fns))], cpu[next(iter(fns))]
    return {
        name: {
            "median_s": statistics.median(t),
            "min_s": min(t),
            "ratio": statistics.median(a / b for a, b in zip(t, first, strict=True)),
            "times": t,
            # process CPU time: what the call computed, without the time it waited for a core
            "cpu_min_s": min(cpu[name]),
            "cpu_ratio": statistics.median(
                a / max(b, 1e-9) for a, b in zip(cpu[name], first_cpu, strict=True)
            ),
        }
        for name, t in times.items()
    }


def load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def machine(threads: int) -> dict:
    from benchmarks import run as runner

    info = runner.machine()
    info["torch_threads"] = threads
    return info


# ----------------------------------------------------------------------------------- models


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).eval()


def ffn(seed: int = 0, width: int = 768) -> torch.nn.Module:
    """GPT-2's MLP block (Conv1D width -> 4 width -> width, gelu_new) from a config."""
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    torch.manual_seed(seed)
    config = GPT2Config(
        n_embd=width, n_layer=1, n_head=12, vocab_size=8, n_positions=8, bos_token_id=0, eos_token_id=0
    )
    return GPT2MLP(4 * width, config).eval()


def gpt2_lm(layers: int = 12, width: int = 768, seed: int = 0) -> torch.nn.Module:
    """A GPT-2-small-shaped language model with random weights (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    heads = max(1, width // 64)
    config = GPT2Config(n_embd=width, n_layer=layers, n_head=heads, vocab_size=50257, n_positions=1024)
    return GPT2LMHeadModel(config).eval()


MODELS: dict[str, tuple[Callable[[], torch.nn.Module], int]] = {
    "mlp 1024-4096-1024 (nn.Linear)": (mlp, 1024),
    "ffn 768-3072-768 (GPT-2 Conv1D)": (ffn, 768),
}
QUICK_MODELS: dict[str, tuple[Callable[[], torch.nn.Module], int]] = {
    "mlp 256-1024-256 (nn.Linear)": (
        lambda: torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
        ).eval(),
        256,
    ),
    "ffn 128-512-128 (GPT-2 Conv1D)": (lambda: ffn(width=128), 128),
}


def weights_of(model: torch.nn.Module) -> Callable[[str, torch.Tensor], bool]:
    """``where`` for the 2-D weights of the linear layers of ``model``."""
    return lambda name, p: p.dim() == 2


# ----------------------------------------------------------------------------------- sections


def forward_section(
    models: dict, sparsities: list, batches: list, budget_s: float, min_rounds: int = 5
) -> list[dict]:
    rows = []
    for label, (build, width) in models.items():
        model = build()
        params = {k: v.detach() for k, v in model.named_parameters()}
        for amount in sparsities:
            masks = fprune.l1_unstructured(params, amount, where=weights_of(model))
            converted = {
                "auto": sparse.to_sparse(params, masks, module=model),
                "csr": sparse.to_sparse(params, masks, layout="csr", module=model),
                "bsr": sparse.to_sparse(params, masks, layout="bsr", module=model, blocksize=(4, 4)),
            }
            chosen = [v for k, v in sparse.layouts(converted["auto"]).items() if params[k].dim() == 2]
            # the dense baseline on copies made now, beside the converted weights: memory the
            # model was built in long before can sit in other pages (huge or not) than new tensors,
            # which a one-row call, bound by memory, feels
            fresh = {k: v.clone() for k, v in params.items()}
            for batch in batches:
                g = torch.Generator().manual_seed(batch)
                x = torch.randn(batch, width, generator=g)
                fns = {
                    "dense": lambda *, model=model, fresh=fresh, x=x: functional_call(model, fresh, (x,)),
                    "masked": lambda *, masks=masks, model=model, params=params, x=x: fprune.masked_call(
                        model, params, masks, (x,)
                    ),
                    **{
                        name: (lambda p=p, *, model=model, x=x: functional_call(model, p, (x,)))
                        for name, p in converted.items()
                    },
                }
                before = load()
                with torch.no_grad():
                    ref = fns["masked"]()
                    worst = max(
                        float((fns[name]() - ref).abs().max() / ref.abs().max())
                        for name in ("auto", "csr", "bsr")
                    )
                    timed = interleaved(fns, budget_s, min_rounds=min_rounds)
                row = {
                    "model": label,
                    "sparsity": amount,
                    "batch": batch,
                    "auto_layouts": chosen,
                    "max_rel_diff": worst,
                    "load_before": before,
                    "load_after": load(),
                    "median_s": {k: v["median_s"] for k, v in timed.items()},
                    "min_s": {k: v["min_s"] for k, v in timed.items()},
                    "paired_ratio": {k: v["ratio"] for k, v in timed.items()},
                    "ratio": {k: v["min_s"] / timed["dense"]["min_s"] for k, v in timed.items()},
                }
                rows.append(row)
                print(_forward_line(row), file=sys.stderr, flush=True)
    return rows


def _forward_line(row: dict) -> str:
    ratios = " ".join(f"{k} {v:.2f}" for k, v in row["ratio"].items() if k != "dense")
    return (
        f"{row['model']} {row['sparsity']:.0%} b{row['batch']}: dense {row['min_s']['dense'] * 1e3:.2f} ms, "
        f"{ratios} (load {row['load_after']:.1f})"
    )


def saved_bytes(obj: Any) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return len(buffer.getvalue())


def disk_section(build: Callable[[], torch.nn.Module], sparsities: list) -> list[dict]:
    model = build()
    params = {k: v.detach() for k, v in model.named_parameters()}
    rows = []
    dense_bytes = saved_bytes(params)
    for amount in sparsities:
        masks = fprune.l1_unstructured(params, amount, where=weights_of(model))
        auto = sparse.to_sparse(params, masks, module=model)
        csr = sparse.to_sparse(params, masks, layout="csr", module=model)
        for name, converted in (("auto", auto), ("csr", csr)):
            state = sparse.to_state(converted)
            buffer = io.BytesIO()
            torch.save(state, buffer)
            buffer.seek(0)
            loaded = sparse.from_state(torch.load(buffer, weights_only=True))
            same = all(torch.equal(loaded[k].to_dense(), converted[k].to_dense()) for k in converted)
            rows.append(
                {
                    "sparsity": amount,
                    "layout": name,
                    "dense_bytes": dense_bytes,
                    "sparse_bytes": len(buffer.getvalue()),
                    "round_trip_equal": same,
                }
            )
    return rows


def end_to_end_section(layers: int, width: int, amount: float, budget_s: float, seq: int = 128) -> dict:
    model = gpt2_lm(layers=layers, width=width)
    return lm_speed(model, amount=amount, budget_s=budget_s, seq=seq)


def lm_speed(
    model: torch.nn.Module,
    params: dict | None = None,
    masks: dict | None = None,
    *,
    amount: float = 0.9,
    budget_s: float = 5.0,
    seq: int = 128,
    decode_batch: int = 8,
    vocab: int | None = None,
) -> dict:
    """Tokens per second of a causal language model: dense, masked and ``to_sparse`` (auto).

    The function a post-training example calls with its pruned model: pass ``params`` and
    ``masks`` (``masks`` keyed like ``params``); without them each Conv1D / Linear weight of the
    transformer blocks is pruned by ``l1_unstructured`` to ``amount``. Two shapes: one
    ``seq``-token sequence (a prefill) and ``decode_batch`` one-token sequences (the rows a decoding
    step multiplies, without a KV cache). Also the checkpoint size: ``torch.save`` of the dense
    params against ``to_state`` of the sparse ones.
    """
    if params is None:
        params = {k: v.detach() for k, v in model.named_parameters()}
    if masks is None:
        masks = fprune.l1_unstructured(
            params, amount, where=lambda name, p: p.dim() == 2 and ".h." in f".{name}" and "weight" in name
        )
    vocab = vocab or model.config.vocab_size
    converted = sparse.to_sparse(params, masks, module=model)
    chosen = sparse.layouts(converted)
    g = torch.Generator().manual_seed(0)
    shapes = {"prefill": (1, seq), "decode": (decode_batch, 1)}
    out: dict[str, Any] = {
        "layouts": {k: chosen[k] for k in masks if params[k].dim() == 2 and not bool(masks[k].all())},
        "weights": sum(p.numel() for p in params.values()),
        "pruned_fraction": _pruned_fraction(params, masks),
        "shapes": {},
    }
    for name, (batch, length) in shapes.items():
        ids = torch.randint(0, vocab, (batch, length), generator=g)
        fns = {
            "dense": lambda *, ids=ids: functional_call(model, params, (ids,), {"use_cache": False}),
            "masked": lambda *, ids=ids: fprune.masked_call(
                model, params, masks, (ids,), {"use_cache": False}
            ),
            "auto": lambda *, ids=ids: functional_call(model, converted, (ids,), {"use_cache": False}),
        }
        before = load()
        with torch.no_grad():
            ref = fns["masked"]().logits
            diff = float((fns["auto"]().logits - ref).abs().max() / ref.abs().max())
            timed = interleaved(fns, budget_s, min_rounds=3)
        tokens = batch * length
        out["shapes"][name] = {
            "batch": batch,
            "length": length,
            "max_rel_diff": diff,
            "load_before": before,
            "load_after": load(),
            "median_s": {k: v["median_s"] for k, v in timed.items()},
            "paired_ratio": {k: v["ratio"] for k, v in timed.items()},
            "ratio": {k: v["min_s"] / timed["dense"]["min_s"] for k, v in timed.items()},
            "tokens_per_s": {k: tokens / v["min_s"] for k, v in timed.items()},
        }
        print(
            f"end to end {name}: "
            + ", ".join(f"{k} {v:.0f} tok/s" for k, v in out["shapes"][name]["tokens_per_s"].items()),
            file=sys.stderr,
            flush=True,
        )
    out["dense_bytes"] = saved_bytes(params)
    out["sparse_bytes"] = saved_bytes(sparse.to_state(converted))
    return out


def _pruned_fraction(params: dict, masks: dict) -> float:
    """Of the 2-D weights that have a mask: the fraction pruned."""
    weights = [k for k in masks if params[k].dim() == 2 and not bool(masks[k].all())]
    total = sum(params[k].numel() for k in weights)
    return sum(int((~masks[k]).sum()) for k in weights) / max(total, 1)


def llama_lm(layers: int = 8, width: int = 1024, seed: int = 0) -> torch.nn.Module:
    """A small Llama-shaped language model with random weights (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=width,
        intermediate_size=width * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=max(1, width // 64),
        num_key_value_heads=max(1, width // 64),
        vocab_size=32000,
        max_position_embeddings=2048,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def _block_weights(name: str, p: torch.Tensor) -> bool:
    return p.dim() == 2 and (".h." in f".{name}" or ".layers." in f".{name}")


def decode_section(
    builds: dict[str, Callable[[], torch.nn.Module]],
    threads_list: list[int],
    amount: float,
    prompt: int,
    new_tokens: int,
    budget_s: float,
    dtype: torch.dtype = torch.float32,
) -> list[dict]:
    """Greedy ``generate`` (batch 1, KV cache) of each model: dense (the masked weights) against its
    sparse weights in the module (``fprune.sparse.load_into``), ``layout="csr"`` and ``"auto"``
    (measured, rows 1 and ``prompt``), the blocks' linear weights pruned to ``amount`` by
    ``l1_unstructured``. In another ``dtype`` than float32: csr only (the sparse weights in that
    dtype multiply in float32)."""
    import copy

    rows = []
    saved = torch.get_num_threads()
    try:
        for label, build in builds.items():
            dense = build().to(dtype)
            params = {k: v.detach() for k, v in dense.named_parameters()}
            masks = fprune.l1_unstructured(params, amount, where=_block_weights)
            masks = {k: m for k, m in masks.items() if _block_weights(k, params[k])}
            # the dense baseline runs the masked weights (as fast as the unpruned ones): same tokens
            sparse.load_into(dense, fprune.apply_masks(params, masks))
            vocab = dense.config.vocab_size
            ids = torch.randint(1, vocab, (1, prompt), generator=torch.Generator().manual_seed(0))
            kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
            kwargs["pad_token_id"] = 0
            for threads in threads_list:
                torch.set_num_threads(threads)
                models = {"dense": dense}
                chosen = {}
                f32 = {k: v.float() for k, v in params.items()}
                for layout in ("csr", "auto") if dtype == torch.float32 else ("csr",):
                    model = copy.deepcopy(dense)
                    converted = sparse.to_sparse(f32, masks, layout=layout, module=dense, rows=(1, prompt))
                    sparse.load_into(model, converted)  # in the model's dtype
                    chosen[layout] = [v for k, v in sparse.layouts(converted).items() if k in masks]
                    models[layout] = model
                before = load()
                with torch.no_grad():
                    tokens = {k: m.generate(ids, **kwargs) for k, m in models.items()}
                    timed = interleaved(
                        {
                            k: (lambda *, m=m, i=ids, kw=kwargs: m.generate(i, **kw))
                            for k, m in models.items()
                        },
                        budget_s,
                        min_rounds=3,
                        max_rounds=20,
                    )
                held = sparse.sparse_weights(models["csr"]).values()
                row = {
                    "model": label,
                    "dtype": str(dtype).removeprefix("torch."),
                    "threads": threads,
                    "sparsity": amount,
                    "prompt": prompt,
                    "new_tokens": new_tokens,
                    "weights": sum(p.numel() for p in params.values()),
                    "block_weights": sum(params[k].numel() for k in masks),
                    "block_bytes_dense": sum(params[k].numel() * params[k].element_size() for k in masks),
                    "block_bytes_csr": sum(
                        sum(t.numel() * t.element_size() for t in _csr_parts(w.matrix)) for w in held
                    ),
                    "layouts": {k: {n: v.count(n) for n in dict.fromkeys(v)} for k, v in chosen.items()},
                    "same_tokens": {k: bool(torch.equal(t, tokens["dense"])) for k, t in tokens.items()},
                    "tokens_per_s": {k: new_tokens / v["min_s"] for k, v in timed.items()},
                    "ratio": {k: v["min_s"] / timed["dense"]["min_s"] for k, v in timed.items()},
                    "paired_ratio": {k: v["ratio"] for k, v in timed.items()},
                    "cpu_tokens_per_s": {k: new_tokens / v["cpu_min_s"] for k, v in timed.items()},
                    "cpu_ratio": {k: v["cpu_ratio"] for k, v in timed.items()},
                    "load_before": before,
                    "load_after": load(),
                }
                rows.append(row)
                print(
                    f"decode {label} t{threads}: "
                    + ", ".join(f"{k} {v:.1f} tok/s" for k, v in row["tokens_per_s"].items())
                    + f" (load {load():.1f})",
                    file=sys.stderr,
                    flush=True,
                )
                del models, tokens
    finally:
        torch.set_num_threads(saved)
    return rows


def _csr_parts(m: torch.Tensor) -> list[torch.Tensor]:
    return [m.crow_indices(), m.col_indices(), m.values()]


def decode_markdown(rows: list[dict]) -> list[str]:
    if rows and rows[0].get("dtype", "float32") != "float32":
        return decode_low_precision_markdown(rows)
    lines = [
        (
            "Greedy `generate` (batch 1, KV cache, float32): the dense model (its masked weights, dense "
            "kernels) against the same module with its sparse weights put in by `fprune.sparse.load_into` "
            '(its own forward runs them), `to_sparse(..., layout="csr")` and `layout="auto"` (measured '
            "at conversion, `rows=(1, prompt)`). Wall: tokens/s and time / dense time from each variant's "
            "fastest round. CPU: the median over rounds of the variant's process CPU time over the dense "
            "one's in the same round (the work done, without the time spent waiting for a core on the "
            "shared machine; at 2 threads it counts both threads, waits in the thread pool included). "
            "'same tokens': the greedy tokens equal the dense model's (float32 sums in another order can "
            "flip a near-tie of random weights)."
        ),
        "",
        (
            "| model | threads | dense tok/s | csr tok/s | csr / dense: wall | CPU | auto / dense: wall "
            "| CPU | auto's layouts | same tokens (csr, auto) |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        t, q, c = r["tokens_per_s"], r["ratio"], r["cpu_ratio"]
        auto = ", ".join(f"{n} {k}" for k, n in r["layouts"]["auto"].items())
        same = ", ".join("yes" if r["same_tokens"][k] else "no" for k in ("csr", "auto"))
        lines.append(
            f"| {r['model']} | {r['threads']} | {t['dense']:.1f} | {t['csr']:.1f} | {q['csr']:.2f}x | "
            f"{c['csr']:.2f}x | {q['auto']:.2f}x | {c['auto']:.2f}x | {auto} | {same} |"
        )
    first = rows[0] if rows else None
    if first:
        lines += [
            "",
            f"Each model: the linear weights of its blocks pruned to {first['sparsity']:.0%} "
            f"(`l1_unstructured`, per weight); prompt {first['prompt']} tokens, {first['new_tokens']} new "
            "tokens. Weights (all / in the blocks): "
            + "; ".join(
                f"{r['model']} {r['weights'] / 1e6:.1f}M / {r['block_weights'] / 1e6:.1f}M"
                for r in {r["model"]: r for r in rows}.values()
            )
            + " (the embeddings and LM head stay dense).",
        ]
    return lines + [""]


def decode_low_precision_markdown(rows: list[dict]) -> list[str]:
    dtype = rows[0]["dtype"]
    lines = [
        (
            f"Greedy `generate` (batch 1, KV cache) in {dtype}: the dense model (its masked weights, "
            f"dense {dtype} kernels) against the same module with its sparse weights put in by "
            '`fprune.load_into` of `to_sparse(..., layout="csr")` (made from the float32 weights, '
            f"converted to {dtype} by `load_into`: the values rounded to {dtype}, held in float32, "
            "each call casting its input to float32 and its output back). Wall: tokens/s and time / "
            "dense time from each variant's fastest round; CPU: the median over rounds of the process "
            "CPU time over the dense one's in the same round. 'same tokens': the greedy tokens equal the "
            f"dense model's ({dtype} rounds differently in the two)."
        ),
        "",
        (
            "| model | threads | dense tok/s | csr tok/s | csr / dense: wall | CPU | block weights: dense "
            "| csr | same tokens |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        t, q, c = r["tokens_per_s"], r["ratio"], r["cpu_ratio"]
        lines.append(
            f"| {r['model']} | {r['threads']} | {t['dense']:.1f} | {t['csr']:.1f} | {q['csr']:.2f}x | "
            f"{c['csr']:.2f}x | {_mib(r['block_bytes_dense'])} | {_mib(r['block_bytes_csr'])} | "
            f"{'yes' if r['same_tokens']['csr'] else 'no'} |"
        )
    first = rows[0] if rows else None
    if first:
        lines += [
            "",
            (
                f"Each model: the linear weights of its blocks pruned to {first['sparsity']:.0%} "
                f"(`l1_unstructured`, per weight); prompt {first['prompt']} tokens, {first['new_tokens']} "
                f"new tokens. Block weights: their memory dense in {dtype} and as CSR (float32 values, "
                "int32 indices)."
            ),
        ]
    return lines + [""]


def auto_section(
    threads_list: list[int], shapes: list, sparsities: list, rows_list: list, budget_s: float
) -> list[dict]:
    """``layout="auto"``'s measured choice against dense, per (threads, shape, sparsity, rows).

    Each cell converts one weight with ``to_sparse(..., rows=rows)`` (timed at conversion, as a
    user's conversion is) and then times ``F.linear`` with the dense weight against the chosen
    form in interleaved rounds.
    """
    cells = []
    g = torch.Generator().manual_seed(0)
    saved = torch.get_num_threads()
    try:
        for threads in threads_list:
            torch.set_num_threads(threads)
            for out_features, in_features in shapes:
                w = torch.randn(out_features, in_features, generator=g)
                for amount in sparsities:
                    keep = fprune.l1_unstructured({"w": w}, amount)["w"]
                    for rows in rows_list:
                        start = time.perf_counter()
                        converted = sparse.to_sparse({"w": w}, {"w": keep}, rows=rows)["w"]
                        convert_s = time.perf_counter() - start
                        x = torch.randn(rows, in_features, generator=g)
                        before = load()
                        with torch.no_grad():
                            timed = interleaved(
                                {
                                    "dense": lambda *, x=x, w=w: F.linear(x, w),
                                    "auto": lambda *, x=x, c=converted: F.linear(x, c),
                                },
                                budget_s,
                                min_rounds=9,
                                # calls of ~20 us: up to the budget, not 200 rounds (8 ms), which
                                # one scheduler slice can skew
                                max_rounds=5000,
                            )
                        cells.append(
                            {
                                "threads": threads,
                                "shape": [out_features, in_features],
                                "sparsity": amount,
                                "rows": rows,
                                "choice": sparse.layouts({"w": converted})["w"],
                                # kept dense: the dense kernel itself (a plain strided tensor)
                                "plain_dense": type(converted) is torch.Tensor
                                and converted.layout == torch.strided
                                and converted.is_contiguous(),
                                "convert_s": convert_s,
                                "dense_s": timed["dense"]["min_s"],
                                "auto_s": timed["auto"]["min_s"],
                                "ratio": timed["auto"]["min_s"] / timed["dense"]["min_s"],
                                "paired_ratio": timed["auto"]["ratio"],
                                "cpu_ratio": timed["auto"]["cpu_ratio"],
                                "load_before": before,
                                "load_after": load(),
                            }
                        )
                    print(
                        f"auto t{threads} {out_features}x{in_features} {amount:.0%}: "
                        + " ".join(
                            f"r{c['rows']} {c['choice']} {c['ratio']:.2f}" for c in cells[-len(rows_list) :]
                        )
                        + f" (load {load():.1f})",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        torch.set_num_threads(saved)
    return cells


def auto_markdown(cells: list[dict]) -> list[str]:
    lines = []
    rows_list = sorted({c["rows"] for c in cells})
    for threads in sorted({c["threads"] for c in cells}):
        mine = [c for c in cells if c["threads"] == threads]
        lines += [
            (
                f'#### {threads} thread{"s" if threads > 1 else ""}: `layout="auto"` (timed at conversion) '
                "time / dense time of `F.linear` (paired: the median over rounds of auto / dense in the "
                "same round), and its choice"
            ),
            "",
            "| shape (out, in) | sparsity | " + " | ".join(f"rows {r}" for r in rows_list) + " |",
            "|---|---:|" + "---:|" * len(rows_list),
        ]
        for shape in dict.fromkeys(tuple(c["shape"]) for c in mine):
            for amount in sorted({c["sparsity"] for c in mine}):
                by_rows = {
                    c["rows"]: c for c in mine if tuple(c["shape"]) == shape and c["sparsity"] == amount
                }
                lines.append(
                    f"| {shape[0]}x{shape[1]} | {amount:.0%} | "
                    + " | ".join(
                        f"{by_rows[r]['paired_ratio']:.2f} {by_rows[r]['choice']}" for r in rows_list
                    )
                    + " |"
                )
        csr = [c for c in mine if c["choice"] == "csr"]
        kept = [c for c in mine if c["choice"] == "dense"]
        worst_csr = max(csr, key=lambda c: c["paired_ratio"]) if csr else None
        # where auto kept the weight dense it runs the dense kernel on a plain dense tensor: its
        # ratio is the same kernel timed twice, the noise of the run, not a cost of the choice
        plain = all(c.get("plain_dense") for c in kept)
        met = all(c["paired_ratio"] <= 1.05 for c in csr) and plain
        convert = max(c["convert_s"] for c in mine)
        spread = [c["paired_ratio"] for c in kept]
        lines += [
            "",
            (
                f"At {threads} thread{'s' if threads > 1 else ''}, auto at most 1.05x dense: "
                f"{'met' if met else 'NOT met'}"
                + (
                    f"; where it chose csr ({len(csr)} of {len(mine)} cells) at worst "
                    f"{worst_csr['paired_ratio']:.2f}x ({worst_csr['shape'][0]}x{worst_csr['shape'][1]}, "
                    f"{worst_csr['sparsity']:.0%}, rows {worst_csr['rows']})"
                    if worst_csr
                    else "; it chose csr nowhere"
                )
                + (
                    f"; where it kept dense, the weight is "
                    f"{'a' if plain else 'NOT always a'} plain dense tensor"
                    f" (the dense kernel itself: the spread {min(spread):.2f}-{max(spread):.2f}x is the "
                    f"same kernel timed twice, the timing noise of the run)"
                    if kept
                    else ""
                )
                + f". Fastest-round ratios (the JSON's `ratio`): {min(c['ratio'] for c in mine):.2f}-"
                f"{max(c['ratio'] for c in mine):.2f}x; CPU-time ratios (`cpu_ratio`, paired): worst "
                f"{max(c['cpu_ratio'] for c in mine):.2f}x. Slowest conversion (timing included): "
                f"{convert * 1e3:.0f} ms."
            ),
            "",
        ]
    return lines


def crossover_section(
    threads_list: list[int], shapes: list, sparsities: list, rows_list: list, budget_s: float
) -> list[dict]:
    """csr / dense time ratio of ``F.linear`` on a grid (what ``layout="auto"`` decides from)."""
    cells = []
    g = torch.Generator().manual_seed(0)
    saved = torch.get_num_threads()
    try:
        for threads in threads_list:
            torch.set_num_threads(threads)
            for out_features, in_features in shapes:
                w = torch.randn(out_features, in_features, generator=g)
                for amount in sparsities:
                    keep = torch.rand(out_features, in_features, generator=g) >= amount
                    dense = w * keep
                    sw = sparse.SparseWeight(sparse.sparse_matrix(dense, "csr"))
                    for rows in rows_list:
                        x = torch.randn(rows, in_features, generator=g)
                        before = load()
                        with torch.no_grad():
                            timed = interleaved(
                                {
                                    "dense": lambda *, dense=dense, x=x: F.linear(x, dense),
                                    "csr": lambda *, sw=sw, x=x: F.linear(x, sw),
                                },
                                budget_s,
                                min_rounds=7,
                            )
                        cell = {
                            "threads": threads,
                            "shape": [out_features, in_features],
                            "sparsity": amount,
                            "rows": rows,
                            "dense_s": timed["dense"]["min_s"],
                            "csr_s": timed["csr"]["min_s"],
                            "ratio": timed["csr"]["min_s"] / timed["dense"]["min_s"],
                            "paired_ratio": timed["csr"]["ratio"],
                            "load_before": before,
                            "load_after": load(),
                        }
                        cells.append(cell)
                    print(
                        f"crossover t{threads} {out_features}x{in_features} {amount:.0%}: "
                        + " ".join(f"r{c['rows']} {c['ratio']:.2f}" for c in cells[-len(rows_list) :])
                        + f" (load {load():.1f})",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        torch.set_num_threads(saved)
    return cells


def kernels_section(
    threads_list: list[int], shape: tuple, sparsities: list, rows_list: list, budget_s: float
) -> list[dict]:
    """The ways to multiply by a pruned weight against dense ``F.linear``: why SparseWeight does what it does.

    ``csr @ x.T`` (the kernel SparseWeight runs, ``(M @ x.T).T``), ``F.linear(x, csr)`` (torch's
    path for a plain CSR weight), ``x @ csr`` (what a linear layer's backward needs), and a dense
    copy per call (``F.linear(x, csr.to_dense())``, what a call-time switch to dense would cost
    without keeping both forms).
    """
    from fprune.sparse._weight import quiet

    cells = []
    g = torch.Generator().manual_seed(1)
    saved = torch.get_num_threads()
    try:
        for threads in threads_list:
            torch.set_num_threads(threads)
            w = torch.randn(*shape, generator=g)
            for amount in sparsities:
                dense = w * (torch.rand(*shape, generator=g) >= amount)
                m = sparse.sparse_matrix(dense, "csr")
                with quiet():
                    m64 = dense.to_sparse_csr()
                for rows in rows_list:
                    x = torch.randn(rows, shape[1], generator=g)
                    y = torch.randn(rows, shape[0], generator=g)
                    fns = {
                        "dense": lambda *, dense=dense, x=x: F.linear(x, dense),
                        "csr @ x.T": lambda *, m=m, x=x: (m @ x.t()).t().contiguous(),
                        "csr @ x.T, int64 indices": lambda *, m64=m64, x=x: (m64 @ x.t()).t().contiguous(),
                        "F.linear(x, csr)": lambda *, m=m, x=x: F.linear(x, m),
                        "dense copy per call": lambda *, m=m, x=x: F.linear(x, m.to_dense()),
                        "backward x @ csr": lambda *, m=m, y=y: y @ m,
                        "backward dense": lambda *, dense=dense, y=y: y @ dense,
                    }
                    with torch.no_grad(), quiet():
                        timed = interleaved(fns, budget_s, min_rounds=5)
                    cells.append(
                        {
                            "threads": threads,
                            "shape": list(shape),
                            "sparsity": amount,
                            "rows": rows,
                            "min_s": {k: v["min_s"] for k, v in timed.items()},
                            "paired_ratio": {k: v["ratio"] for k, v in timed.items()},
                            "ratio": {k: v["min_s"] / timed["dense"]["min_s"] for k, v in timed.items()},
                            "load_after": load(),
                        }
                    )
                    print(
                        f"kernels t{threads} {amount:.0%} r{rows}: "
                        + " ".join(f"{k} {v['ratio']:.2f}" for k, v in timed.items()),
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        torch.set_num_threads(saved)
    return cells


def kernels_markdown(cells: list[dict]) -> list[str]:
    names = ["csr @ x.T", "csr @ x.T, int64 indices", "F.linear(x, csr)", "dense copy per call"]
    lines = [
        (
            f"#### Kernels for a pruned {cells[0]['shape'][0]}x{cells[0]['shape'][1]} weight, "
            "time / dense `F.linear` "
            "(backward: `x @ csr` / `x @ dense`)"
        ),
        "",
        "| threads | sparsity | rows | " + " | ".join(f"`{n}`" for n in names) + " | backward `x @ csr` |",
        "|---:|---:|---:|" + "---:|" * (len(names) + 1),
    ]
    for c in cells:
        r, m = c["ratio"], c["min_s"]
        lines.append(
            f"| {c['threads']} | {c['sparsity']:.0%} | {c['rows']} | "
            + " | ".join(f"{r[n]:.2f}" for n in names)
            + f" | {m['backward x @ csr'] / m['backward dense']:.2f} |"
        )
    return lines + [""]


def crossover_table(cells: list[dict], margin: float = _auto.MARGIN) -> dict:
    """threads -> size class -> rows -> the crossover sparsity, as ``fprune/sparse/_auto.py`` holds it.

    The size classes are the weight counts of the measured shapes. For a class, the crossover at
    a row count is the lowest measured sparsity at which csr took at most ``margin`` times the
    dense time on every shape of at least that many weights, at that sparsity and every higher
    one (``_auto.NEVER`` where none did). Classes that never pay off at any row count are left
    out (a layer below the smallest class kept stays dense).
    """
    table: dict[int, dict[int, dict[int, float]]] = {}
    for threads in sorted({c["threads"] for c in cells}):
        mine = [c for c in cells if c["threads"] == threads]
        classes: dict[int, dict[int, float]] = {}
        for size in sorted({c["shape"][0] * c["shape"][1] for c in mine}):
            big = [c for c in mine if c["shape"][0] * c["shape"][1] >= size]
            classes[size] = {}
            for rows in sorted({c["rows"] for c in big}):
                here = [c for c in big if c["rows"] == rows]
                lowest = _auto.NEVER
                for s in sorted({c["sparsity"] for c in here}, reverse=True):
                    if not all(c["ratio"] <= margin for c in here if c["sparsity"] == s):
                        break
                    lowest = s
                classes[size][rows] = lowest
        while classes and all(v == _auto.NEVER for v in classes[min(classes)].values()):
            del classes[min(classes)]
        table[threads] = classes
    return table


def semi_structured_section(device: str, batches: list, budget_s: float) -> list[dict]:
    """fp16 nn.Linear with 2:4 masks: dense against ``layout="semi_structured"`` (CUDA only)."""
    dev = torch.device(device)
    rows = []
    for out_features, in_features in [
        (4096, 1024),
        (1024, 4096),
        (3072, 768),
        (768, 3072),
        (11008, 4096),
        (4096, 11008),
    ]:
        torch.manual_seed(0)
        layer = torch.nn.Linear(in_features, out_features).to(dev, torch.float16).eval()
        params = {k: v.detach() for k, v in layer.named_parameters()}
        masks = fprune.n_m(params, 2, 4, where=lambda name, p: p.dim() == 2)
        converted = sparse.to_sparse(params, masks, layout="semi_structured", module=layer)
        for batch in batches:
            x = torch.randn(batch, in_features, device=dev, dtype=torch.float16)

            def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
                def call() -> Any:
                    out = fn()
                    torch.cuda.synchronize(dev)
                    return out

                return call

            fns = {
                "dense": synced(
                    lambda *, layer=layer, params=params, x=x: functional_call(layer, params, (x,))
                ),
                "masked": synced(
                    lambda *, layer=layer, masks=masks, params=params, x=x: fprune.masked_call(
                        layer, params, masks, (x,)
                    )
                ),
                "semi_structured": synced(
                    lambda *, converted=converted, layer=layer, x=x: functional_call(layer, converted, (x,))
                ),
            }
            with torch.no_grad():
                ref = fns["masked"]().float()
                diff = float((fns["semi_structured"]().float() - ref).abs().max() / ref.abs().max())
                timed = interleaved(fns, budget_s)
            rows.append(
                {
                    "shape": [out_features, in_features],
                    "batch": batch,
                    "max_rel_diff": diff,
                    "median_s": {k: v["median_s"] for k, v in timed.items()},
                }
            )
            print(
                f"2:4 {out_features}x{in_features} b{batch}: "
                + " ".join(f"{k} {v['median_s'] * 1e6:.0f} us" for k, v in timed.items()),
                file=sys.stderr,
                flush=True,
            )
    return rows


# ----------------------------------------------------------------------------------- tables


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 1e-2 else f"{seconds * 1e3:.1f} ms"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def forward_table(rows: list[dict]) -> list[str]:
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        lines += [
            f"#### {model}",
            "",
            "| sparsity | batch | dense | masked | auto | auto's layouts | csr | bsr 4x4 | max rel. diff |",
            "|---:|---:|---:|---:|---:|---|---:|---:|---:|",
        ]
        for r in (r for r in rows if r["model"] == model):
            q = r["ratio"]
            lines.append(
                f"| {r['sparsity']:.0%} | {r['batch']} | {_ms(r['min_s']['dense'])} | {q['masked']:.2f}x | "
                f"**{q['auto']:.2f}x** | {', '.join(r['auto_layouts'])} | {q['csr']:.2f}x | "
                f"{q['bsr']:.2f}x | {r['max_rel_diff']:.1e} |"
            )
        lines.append("")
    return lines


def targets(rows: list[dict]) -> list[str]:
    """The targets: sparse at 90%/batch 8 <= 0.4x dense, at 95% <= 0.25x; auto never > 1.1x.

    Where auto kept every layer dense, it runs the dense computation (on ``p * mask``): its
    ratio there is the timing noise of the run, and is reported apart.
    """

    def paired(r: dict, k: str) -> float:
        return r["paired_ratio"][k]

    lines = ["Targets (each model; the ratios of the table, and in brackets the paired medians):", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        for amount, limit in ((0.9, 0.4), (0.95, 0.25)):
            cell = next((r for r in mine if r["sparsity"] == amount and r["batch"] == 8), None)
            if cell:
                auto, csr = cell["ratio"]["auto"], cell["ratio"]["csr"]
                lines.append(
                    f"- {model}, {amount:.0%} at batch 8: auto {auto:.2f}x [{paired(cell, 'auto'):.2f}x], "
                    f"csr {csr:.2f}x dense (target <= {limit}x): {'met' if auto <= limit else 'NOT met'}"
                )
        sparse_cells = [r for r in mine if any(k != "dense" for k in r["auto_layouts"])]
        dense_cells = [r for r in mine if all(k == "dense" for k in r["auto_layouts"])]
        if sparse_cells:
            worst = max(sparse_cells, key=lambda r: r["ratio"]["auto"])
            ratio = worst["ratio"]["auto"]
            lines.append(
                f"- {model}, auto's worst cell where it made sparse layers: {ratio:.2f}x dense "
                f"[{paired(worst, 'auto'):.2f}x] ({worst['sparsity']:.0%}, batch {worst['batch']}; target "
                f"<= 1.1x): {'met' if ratio <= 1.1 else 'NOT met'}"
            )
        if dense_cells:
            low = min(r["ratio"]["auto"] for r in dense_cells)
            high = max(r["ratio"]["auto"] for r in dense_cells)
            lines.append(
                f"- {model}, where auto kept every layer dense (the dense computation, on p * mask): "
                f"{low:.2f}-{high:.2f}x, the timing noise of this run"
            )
    return lines + [""]


def disk_table(rows: list[dict]) -> list[str]:
    lines = [
        (
            "| sparsity | dense `torch.save` | auto `to_state` | csr `to_state` | csr / dense "
            "| loads back equal (weights_only=True) |"
        ),
        "|---:|---:|---:|---:|---:|---|",
    ]
    for amount in dict.fromkeys(r["sparsity"] for r in rows):
        auto = next(r for r in rows if r["sparsity"] == amount and r["layout"] == "auto")
        csr = next(r for r in rows if r["sparsity"] == amount and r["layout"] == "csr")
        lines.append(
            f"| {amount:.0%} | {_mib(csr['dense_bytes'])} | {_mib(auto['sparse_bytes'])} | "
            f"{_mib(csr['sparse_bytes'])} | {csr['sparse_bytes'] / csr['dense_bytes']:.2f}x | "
            f"{'yes' if auto['round_trip_equal'] and csr['round_trip_equal'] else 'NO'} |"
        )
    return lines + [""]


def end_to_end_table(e2e: dict) -> list[str]:
    layouts = list(e2e["layouts"].values())
    counts = ", ".join(f"{layouts.count(k)} {k}" for k in dict.fromkeys(layouts))
    lines = [
        (
            f"{e2e['label']}: {e2e['weights'] / 1e6:.1f}M weights, {e2e['pruned_fraction']:.0%} of the block "
            f"weights pruned (magnitude, per weight); auto made {counts} (embeddings and LM head: dense)."
        ),
        "",
        "| input | dense tok/s | masked tok/s | auto tok/s | auto / dense time | max rel. diff |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in e2e["shapes"].items():
        t = s["tokens_per_s"]
        lines.append(
            f"| {name} ({s['batch']} x {s['length']} tokens) | {t['dense']:.0f} | {t['masked']:.0f} | "
            f"{t['auto']:.0f} | {s['ratio']['auto']:.2f}x | {s['max_rel_diff']:.1e} |"
        )
    lines += [
        "",
        (
            f"Checkpoint: dense `torch.save` {_mib(e2e['dense_bytes'])}, `to_state` of the sparse params "
            f"{_mib(e2e['sparse_bytes'])} ({e2e['sparse_bytes'] / e2e['dense_bytes']:.2f}x; "
            "the embeddings stay dense)."
        ),
        "",
    ]
    return lines


def crossover_markdown(cells: list[dict]) -> list[str]:
    lines = []
    for threads in sorted({c["threads"] for c in cells}):
        rows_list = sorted({c["rows"] for c in cells})
        lines += [
            f"#### {threads} thread{'s' if threads > 1 else ''}: csr time / dense time of `F.linear`",
            "",
            "| shape (out, in) | sparsity | " + " | ".join(f"rows {r}" for r in rows_list) + " |",
            "|---|---:|" + "---:|" * len(rows_list),
        ]
        mine = [c for c in cells if c["threads"] == threads]
        for shape in dict.fromkeys(tuple(c["shape"]) for c in mine):
            for amount in sorted({c["sparsity"] for c in mine}):
                ratios = {
                    c["rows"]: c["ratio"]
                    for c in mine
                    if tuple(c["shape"]) == shape and c["sparsity"] == amount
                }
                lines.append(
                    f"| {shape[0]}x{shape[1]} | {amount:.0%} | "
                    + " | ".join(f"{ratios[r]:.2f}" for r in rows_list)
                    + " |"
                )
        lines.append("")
    table = crossover_table(cells)
    lines += [
        (
            f"Crossover: per thread count, size class (weights) and rows per call, the lowest sparsity at "
            f"which csr took <= {_auto.MARGIN}x the dense time on every shape of at least that size, at "
            f"it and every higher sparsity ({_auto.NEVER}: never), as `fprune/sparse/_auto.py` holds it:"
        ),
        "",
        "| threads | size class (weights) | "
        + " | ".join(f"rows {r}" for r in sorted({c["rows"] for c in cells}))
        + " |",
        "|---:|---:|" + "---:|" * len({c["rows"] for c in cells}),
    ]
    for threads, classes in table.items():
        for size, by_rows in classes.items():
            lines.append(
                f"| {threads} | {size:,} | " + " | ".join(f"{v:.2f}" for v in by_rows.values()) + " |"
            )
    lines += ["", "```python", "CROSSOVER = " + json.dumps(table), "```", ""]
    return lines


def header(report: dict, title: str) -> list[str]:
    m = report["machine"]
    return [
        f"### {title} ({report['mode']} run, {m['date_utc']} UTC)",
        "",
        (
            f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; torch {m['torch']} "
            f"({m['torch_threads']} intra-op threads), Python {m['python']}; GPU: {m['cuda'] or 'none'}; "
            f"fprune at {m['git_commit']}. Load average (1 min) during the run: {report['load_min']:.1f}-"
            f"{report['load_max']:.1f} (the machine is shared). Each cell runs its variants in interleaved "
            f"rounds; a time is the variant's fastest round and a ratio is to the dense variant's fastest "
            f"round of the same cell (the machine's other processes make most rounds slower: the fastest is "
            f"the nearest to an idle machine). The JSON also has medians and paired ratios (median over "
            f"rounds of variant / dense in the same round)."
        ),
        "",
    ]


def markdown(report: dict) -> str:
    lines = header(report, "Sparse execution")
    if report.get("forward"):
        lines += ["Forward passes (float32, `torch.no_grad()`):", ""]
        lines += forward_table(report["forward"]) + targets(report["forward"])
    if report.get("disk"):
        lines += [f"Checkpoint sizes of the {report['disk_model']}:", ""] + disk_table(report["disk"])
    if report.get("end_to_end"):
        lines += ["End to end:", ""] + end_to_end_table(report["end_to_end"])
    if report.get("semi_structured"):
        lines += [
            "2:4 on the GPU (fp16 nn.Linear, `n_m(2, 4)` masks):",
            "",
            "| shape (out, in) | batch | dense | masked | semi_structured | max rel. diff |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in report["semi_structured"]:
            m = r["median_s"]
            lines.append(
                f"| {r['shape'][0]}x{r['shape'][1]} | {r['batch']} | {m['dense'] * 1e6:.0f} us | "
                f"{m['masked'] / m['dense']:.2f}x | {m['semi_structured'] / m['dense']:.2f}x | "
                f"{r['max_rel_diff']:.1e} |"
            )
        lines.append("")
    if report.get("crossover"):
        lines += crossover_markdown(report["crossover"])
    if report.get("kernels"):
        lines += kernels_markdown(report["kernels"])
    if report.get("decode"):
        lines += decode_markdown(report["decode"])
    if report.get("auto"):
        lines += auto_markdown(report["auto"])
    return "\n".join(lines)


def _loads(report: dict) -> list[float]:
    found = []
    for key in ("forward", "crossover", "kernels", "disk", "semi_structured", "decode", "auto"):
        for r in report.get(key) or []:
            found += [r[k] for k in ("load_before", "load_after") if k in r]
    for s in (report.get("end_to_end") or {}).get("shapes", {}).values():
        found += [s["load_before"], s["load_after"]]
    return found or [load()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, short timings (under a minute)")
    parser.add_argument(
        "--crossover", action="store_true", help="the crossover grid behind layout='auto' instead"
    )
    parser.add_argument(
        "--kernels", action="store_true", help="the ways to multiply by a CSR weight, compared, instead"
    )
    parser.add_argument(
        "--decode",
        action="store_true",
        help="greedy generate of GPT-2 and Llama, dense against sparse, instead",
    )
    parser.add_argument(
        "--auto", action="store_true", help="layout='auto''s measured choice against dense on a grid, instead"
    )
    parser.add_argument("--device", default="cpu", help="cuda: the 2:4 (semi-structured) rows")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="the models' dtype in --decode (default float32)",
    )
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--no-end-to-end", action="store_true", help="skip the GPT-2-shaped model")
    parser.add_argument(
        "--render", type=Path, help="print (and --markdown: write) the tables of a saved JSON report"
    )
    parser.add_argument(
        "--crossover-threads",
        type=int,
        nargs="*",
        default=[1],
        help="thread counts of --crossover, --kernels, --decode and --auto (default 1)",
    )
    args = parser.parse_args(argv)
    if args.render:
        text = markdown(json.loads(args.render.read_text()))
        print(text)
        if args.markdown:
            args.markdown.write_text(text + "\n")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    report: dict[str, Any] = {"mode": "quick" if args.quick else "full", "machine": machine(threads)}
    budget = 0.01 if args.quick else 1.0
    if args.device != "cpu":
        if not (torch.device(args.device).type == "cuda" and torch.cuda.is_available()):
            print(
                f"benchmarks.sparse: --device {args.device} needs a CUDA GPU; nothing was run.",
                file=sys.stderr,
            )
            return 2
        report["mode"] += f" {args.device}"
        report["semi_structured"] = semi_structured_section(
            args.device, BATCHES if not args.quick else [8], budget
        )
        default = "sparse_gpu"
    elif args.crossover:
        cells = crossover_section(
            args.crossover_threads if not args.quick else [threads],
            CROSSOVER_SHAPES if not args.quick else [(512, 256), (256, 256)],
            CROSSOVER_SPARSITIES if not args.quick else [0.5, 0.9],
            BATCHES if not args.quick else [1, 8],
            0.3 if not args.quick else 0.02,
        )
        report["crossover"] = cells
        report["crossover_table"] = crossover_table(cells)
        default = "sparse_crossover"
    elif args.decode:
        builds = (
            {"GPT-2 (12 x 768)": gpt2_lm, "Llama (8 x 1024)": llama_lm}
            if not args.quick
            else {"GPT-2 (2 x 128)": lambda: gpt2_lm(2, 128), "Llama (2 x 128)": lambda: llama_lm(2, 128)}
        )
        report["decode"] = decode_section(
            builds,
            args.crossover_threads if not args.quick else [threads],
            0.9,
            16 if not args.quick else 4,
            16 if not args.quick else 4,
            10.0 if not args.quick else 0.05,
            getattr(torch, args.dtype),
        )
        default = "sparse_decode" if args.dtype == "float32" else f"sparse_decode_{args.dtype}"
    elif args.auto:
        report["auto"] = auto_section(
            args.crossover_threads if not args.quick else [threads],
            AUTO_SHAPES if not args.quick else [(256, 128)],
            AUTO_SPARSITIES if not args.quick else [0.5, 0.99],
            BATCHES if not args.quick else [1, 8],
            0.15 if not args.quick else 0.01,
        )
        default = "sparse_auto"
    elif args.kernels:
        report["kernels"] = kernels_section(
            args.crossover_threads if not args.quick else [threads],
            (4096, 1024) if not args.quick else (512, 256),
            [0.5, 0.9, 0.95] if not args.quick else [0.9],
            BATCHES if not args.quick else [8],
            0.5 if not args.quick else 0.02,
        )
        default = "sparse_kernels"
    else:
        models = QUICK_MODELS if args.quick else MODELS
        sparsities = SPARSITIES if not args.quick else [0.5, 0.95]
        batches = BATCHES if not args.quick else [8]
        report["forward"] = forward_section(models, sparsities, batches, budget, 5 if not args.quick else 2)
        first_label, (first_build, _) = next(iter(models.items()))
        report["disk_model"] = first_label
        report["disk"] = disk_section(first_build, sparsities)
        if not args.no_end_to_end:
            layers, width = (2, 128) if args.quick else (12, 768)
            e2e = end_to_end_section(
                layers, width, 0.9, 0.2 if args.quick else 8.0, seq=16 if args.quick else 128
            )
            e2e["label"] = f"GPT-2-shaped LM ({layers} layers, {width} wide, random weights)"
            report["end_to_end"] = e2e
        default = "sparse"
    loads = _loads(report)
    report["load_min"], report["load_max"] = min(loads), max(loads)
    text = markdown(report)
    print(text)
    if not args.quick and not args.json and not args.markdown:
        args.json, args.markdown = RESULTS / f"{default}.json", RESULTS / f"{default}.md"
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
