"""One benchmark configuration, run in a fresh process: ``python -m benchmarks.worker CONFIG``.

``CONFIG`` is a JSON object (see :mod:`benchmarks.run`); the worker prints one JSON object
with the measurements as its last line. A fresh process per configuration makes the RSS
high-water (``VmHWM``) measure that configuration alone: the extra peak memory is the
high-water after the runs minus the high-water once the model is built.

:func:`measure` runs a configuration in the calling process (``--quick`` runs them all in the
runner's process): it resets the high-water first, so the figure leaves out the earlier
configurations' peaks, but memory they freed to the allocator can be reused without showing.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import torch.nn.utils.prune as torch_prune

import fprune
from benchmarks import models


def max_rss_bytes() -> int:
    """This process's RSS high-water in bytes: ``VmHWM``, else ``ru_maxrss``.

    ``ru_maxrss`` also counts the resident memory of the process that started this one (the
    memory it held at the ``exec``); ``VmHWM`` is this process's own, and can be reset.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_max_rss() -> None:
    """Hand the allocator's free memory back (glibc's ``malloc_trim``) and reset the RSS
    high-water to the current RSS (Linux's ``/proc/self/clear_refs``), where possible."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def compat_module():
    """``fprune.compat`` when it imports, else None (the runner then prints "not available")."""
    try:
        import fprune.compat as compat
    except ImportError:
        return None
    return compat


def unprune(module: torch.nn.Module, name: str) -> None:
    """Undo torch's (or fprune.compat's) pruning of ``module.name`` without touching the values.

    ``prune.remove`` would bake the mask into the weight; the benchmarks need the original
    weights back for the next repeat.
    """
    for key, hook in list(module._forward_pre_hooks.items()):
        if getattr(hook, "_tensor_name", None) == name:
            del module._forward_pre_hooks[key]
    original = module._parameters.pop(name + "_orig")
    module._buffers.pop(name + "_mask")
    if hasattr(module, name):
        delattr(module, name)
    module.register_parameter(name, original)


# ----------------------------------------------------------------------------- pruning cases


def build(config: dict[str, Any]) -> torch.nn.Module:
    if config["model"] == "vgg":
        return models.vgg_like()
    return models.transformer_like(config["model"])


def pruning_run(config: dict[str, Any], model: torch.nn.Module) -> Callable[[float], Callable[[], int]]:
    """``make(amount)`` -> a function that prunes once, checks, undoes, and returns #pruned."""
    case, impl = config["case"], config["impl"]
    targets = models.weight_modules(model)
    weights = {name + ".weight": m.weight for name, m in targets}
    pairs = [(m, "weight") for _, m in targets]
    compat = compat_module()
    lib = {"torch": torch_prune, "compat": compat}.get(impl)

    def undo_modules() -> None:
        for m, name in pairs:
            unprune(m, name)

    # Counting with count_nonzero: ``(mask == 0).sum()`` would make an int64 copy of the
    # largest mask (8 bytes per entry) and show up as the method's peak memory.
    def pruned_in_buffers() -> int:
        return sum(m.weight_mask.numel() - int(torch.count_nonzero(m.weight_mask)) for m, _ in pairs)

    def make(amount: float):
        if case == "global" and impl == "fprune":
            return lambda: fprune.global_unstructured(weights, amount)
        if case == "global":
            return lambda: lib.global_unstructured(pairs, pruning_method=lib.L1Unstructured, amount=amount)
        if case == "local" and impl == "fprune":
            return lambda: fprune.l1_unstructured(weights, amount)
        if case == "local":
            return lambda: [lib.l1_unstructured(m, "weight", amount) for m, _ in pairs]
        if case == "structured" and impl == "fprune":
            return lambda: fprune.ln_structured(weights, amount, n=2, dim=0)
        if case == "structured":
            return lambda: [lib.ln_structured(m, "weight", amount, n=2, dim=0) for m, _ in pairs]
        raise ValueError(f"unknown case {case!r}")

    def count(result) -> int:
        if impl == "fprune":
            return sum(mask.numel() - int(torch.count_nonzero(mask)) for mask in result.values())
        pruned = pruned_in_buffers()
        undo_modules()
        return pruned

    return make, count


def run_pruning(config: dict[str, Any]) -> dict[str, Any]:
    if config["impl"] == "compat" and compat_module() is None:
        return {"available": False}
    model = build(config)
    weights = sum(m.weight.numel() for _, m in models.weight_modules(model))
    # Warm up on a tiny model first: the first call of each kernel pages in library code and
    # allocates thread pools, a one-time cost that would otherwise count as per-weight memory.
    warm_make, warm_count = pruning_run(config, models.transformer_like("tiny"))
    for amount in config["amounts"]:
        warm_count(warm_make(amount)())
    make, count = pruning_run(config, model)
    gc.collect()
    baseline = max_rss_bytes()
    out: dict[str, Any] = {"weights": weights, "baseline_rss": baseline, "amounts": {}}
    for amount in config["amounts"]:
        fn = make(amount)
        times: list[float] = []
        pruned = None
        for _ in range(config["repeats"]):
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
            pruned = count(result)
            del result
            gc.collect()
        out["amounts"][str(amount)] = {
            "times": times,
            "median_s": statistics.median(times),
            "pruned": pruned,
        }
    # RSS counters are approximate by a few pages: a difference below zero is none.
    out["extra_peak_bytes"] = max(0, max_rss_bytes() - baseline)
    out["extra_bytes_per_weight"] = out["extra_peak_bytes"] / weights
    return out


def run_floor(config: dict[str, Any]) -> dict[str, Any]:
    """One read pass over the same weights: ``sum()`` and ``abs().sum()``, leaf by leaf."""
    model = build(config)
    leaves = [m.weight.detach() for _, m in models.weight_modules(model)]
    out: dict[str, Any] = {"weights": sum(p.numel() for p in leaves)}
    for label, fn in (("sum", lambda p: p.sum()), ("abs_sum", lambda p: p.abs().sum())):
        times = []
        for _ in range(config["repeats"]):
            start = time.perf_counter()
            total = sum(float(fn(p)) for p in leaves)
            times.append(time.perf_counter() - start)
        out[label] = {"times": times, "median_s": statistics.median(times), "value": total}
    return out


# ------------------------------------------------------------------------------ training step


def interleaved_medians(
    steps_by_name: dict[str, Callable[[], Any]], warmup: int, steps: int
) -> dict[str, Any]:
    """Median time of one call of each function, the functions taking turns (round robin).

    Taking turns spreads any drift of the machine (other processes, allocator warm-up) over
    all variants alike instead of favouring whichever runs last. The warm-up calls (where
    ``torch.compile`` compiles) are timed separately.
    """
    out: dict[str, Any] = {}
    for name, step in steps_by_name.items():
        start = time.perf_counter()
        for _ in range(warmup):
            step()
        out[name] = {"warmup_s": time.perf_counter() - start, "times": []}
    for _ in range(steps):
        for name, step in steps_by_name.items():
            start = time.perf_counter()
            step()
            out[name]["times"].append(time.perf_counter() - start)
    for entry in out.values():
        entry["median_s"] = statistics.median(entry["times"])
        entry["min_s"] = min(entry["times"])
        entry["steps"] = steps
        del entry["times"]
    return out


def training_variants(model_name: str, compile_too: bool, steps: int, width: int) -> dict[str, Any]:
    torch.manual_seed(0)
    if model_name == "lenet":
        make = models.LeNet
        x, y = torch.randn(256, 1, 28, 28), torch.randint(0, 10, (256,))
    else:
        make = lambda: models.MLP(width, width, 4)
        x, y = torch.randn(128, width), torch.randint(0, 10, (128,))
    amount = 0.5

    def sgd_step(params, loss_fn):
        opt = torch.optim.SGD(params, lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            loss_fn().backward()
            opt.step()

        return step

    def dense(compiled: bool):
        model = make()
        loss = lambda: F.cross_entropy(model(x), y)
        if compiled:
            loss = torch.compile(loss)
        return sgd_step(model.parameters(), loss)

    def hooks():
        model = make()
        for _, m in models.weight_modules(model):
            torch_prune.l1_unstructured(m, "weight", amount)
        return sgd_step(model.parameters(), lambda: F.cross_entropy(model(x), y))

    is_weight = lambda n, p: n.endswith("weight")

    def masked(compiled: bool, float_masks: bool = False):
        model = make()
        params = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
        masks = fprune.l1_unstructured(params, amount, where=is_weight)
        if float_masks:
            # the fix for the compiled step: weight masks in the weights' dtype, cast once here
            # instead of a bool -> float conversion inside every compiled step; no bias masks
            masks = {n: m.to(params[n].dtype) for n, m in masks.items() if is_weight(n, m)}

        def loss_of(params, masks, x, y):
            return F.cross_entropy(fprune.masked_call(model, params, masks, (x,)), y)

        fn = torch.compile(loss_of) if compiled else loss_of
        return sgd_step(list(params.values()), lambda: fn(params, masks, x, y))

    def projected(compiled: bool):
        # jaxpruner's style: the weights are stored pruned, the forward is dense, and the masks
        # are applied once after each optimizer update (float masks, cast once, in place).
        model = make()
        params = dict(model.named_parameters())
        masks = fprune.l1_unstructured(params, amount, where=is_weight)
        weights = [params[n] for n in masks if is_weight(n, None)]
        float_masks = [masks[n].to(params[n].dtype) for n in masks if is_weight(n, None)]
        with torch.no_grad():
            torch._foreach_mul_(weights, float_masks)
        loss = lambda: F.cross_entropy(model(x), y)
        if compiled:
            loss = torch.compile(loss)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            loss().backward()
            opt.step()
            with torch.no_grad():
                torch._foreach_mul_(weights, float_masks)

        return step

    def rigl_update():
        # one RigL mask update (drop by magnitude, grow by dense gradient) on every call
        model = make()
        params = {n: p.detach() for n, p in model.named_parameters()}
        grads = {n: torch.randn_like(p) for n, p in params.items()}
        pruner = fprune.rigl(amount, distribution="uniform", drop_fraction=0.3, every=100, end=10**9)
        state = pruner.init(params)
        return lambda: pruner.update(params, state, grads=grads)

    variants = [
        ("dense", lambda: dense(False)),
        ("torch_hooks", hooks),
        ("masked_call", lambda: masked(False)),
        ("projected", lambda: projected(False)),
        ("rigl_update", rigl_update),
    ]
    if compile_too:
        variants += [
            ("dense_compiled", lambda: dense(True)),
            ("masked_call_compiled", lambda: masked(True)),
            ("masked_call_compiled_float", lambda: masked(True, float_masks=True)),
            ("projected_compiled", lambda: projected(True)),
        ]
    return interleaved_medians({name: factory() for name, factory in variants}, warmup=3, steps=steps)


def run_training(config: dict[str, Any]) -> dict[str, Any]:
    return training_variants(config["model"], config["compile"], config["steps"], config.get("width", 1024))


# ---------------------------------------------------------------------------------- ensemble


def run_ensemble(config: dict[str, Any]) -> dict[str, Any]:
    """Forward of 8 pruned MLPs on one batch: a loop over hook-pruned modules vs one vmap."""
    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(0)
    members, amount = config["members"], 0.5
    make = lambda: models.MLP(256, 512, 2)
    x = torch.randn(config["batch"], 256)
    hooked = [make() for _ in range(members)]
    dense = [make() for _ in range(members)]
    for model in hooked:
        for _, m in models.weight_modules(model):
            torch_prune.l1_unstructured(m, "weight", amount)
    params, _ = stack_module_state(dense)
    params = {n: p.detach() for n, p in params.items()}
    masks = vmap(lambda p: fprune.l1_unstructured(p, amount, where=lambda n, t: n.endswith("weight")))(params)
    base = models.MLP(256, 512, 2).to("meta")

    def loop():
        with torch.no_grad():
            return [m(x) for m in hooked]

    def vmapped_masked():
        with torch.no_grad():
            return vmap(lambda p, m: fprune.masked_call(base, p, m, (x,)))(params, masks)

    def vmapped_dense():
        with torch.no_grad():
            return vmap(lambda p: functional_call(base, p, (x,)))(params)

    functions = {"loop_hooks": loop, "vmap_masked_call": vmapped_masked, "vmap_dense": vmapped_dense}
    return interleaved_medians(functions, warmup=3, steps=config["steps"])


def run_memory(config: dict[str, Any]) -> dict[str, Any]:
    """A pruning configuration (``config["method"]``: global or local) for its extra memory alone."""
    return run_pruning(dict(config, case=config["method"]))


CASES = {
    "memory": run_memory,
    "global": run_pruning,
    "local": run_pruning,
    "structured": run_pruning,
    "floor": run_floor,
    "training": run_training,
    "ensemble": run_ensemble,
}


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this process; its measurements."""
    if config.get("threads"):
        torch.set_num_threads(config["threads"])
    gc.collect()
    # What is alive now (torch's modules, earlier configurations' survivors in a --quick run)
    # is left out of the collections between measurements, which then take milliseconds.
    gc.freeze()
    reset_max_rss()
    result = CASES[config["case"]](config)
    result["threads"] = torch.get_num_threads()
    return result


def main(argv: list[str]) -> int:
    print(json.dumps(measure(json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
