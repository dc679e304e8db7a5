"""``python -m benchmarks --targets``: its plan and its table (no timing is asserted)."""

from benchmarks import run


def _records(memory, ratio, compiled, eager):
    records = []
    for size in ("50M", "100M"):
        records.append(
            {
                "config": {"case": "floor", "model": size},
                "result": {"abs_sum": {"median_s": 1.0}, "sum": {"median_s": 1.0}},
            }
        )
        for amount in run.AMOUNTS:
            records.append(
                {
                    "config": {"case": "global", "impl": "fprune", "model": size, "amounts": [amount]},
                    "result": {"amounts": {str(amount): {"median_s": ratio}}, "extra_bytes_per_weight": 1.0},
                }
            )
    for method, model in (("global", "50M"), ("local", "10M")):
        for value in memory:
            records.append(
                {
                    "config": {"case": "memory", "method": method, "model": model},
                    "result": {"extra_bytes_per_weight": value},
                }
            )
    steps = {
        "dense": 1.0,
        "torch_hooks": 1.0,
        "masked_call": eager,
        "dense_compiled": 1.0,
        "masked_call_compiled": compiled,
    }
    records.append(
        {
            "config": {"case": "training", "model": "mlp"},
            "result": {k: {"median_s": v} for k, v in steps.items()},
        }
    )
    return records


def test_every_target_is_planned_and_judged():
    cases = {c["case"] for c in run.plan_targets()}
    assert cases == {"floor", "global", "memory", "training"}
    seeds = [c["hash_seed"] for c in run.plan_targets() if c["case"] == "memory"]
    assert sorted(set(seeds)) == sorted(run.MEMORY_SEEDS)
    met = run.targets_table(_records([0.9, 1.0], 4.0, 1.2, 0.99))
    assert sum(line.endswith("| met |") for line in met) == len(run.TARGETS)
    missed = run.targets_table(_records([0.9, 2.5], 6.0, 1.3, 1.01))
    assert sum(line.endswith("| missed |") for line in missed) == len(run.TARGETS)
    assert "| 2.500 |" in "\n".join(missed)  # the worst process counts


def test_unmeasured_targets_say_so():
    table = run.targets_table([])
    assert sum("not measured" in line for line in table) == len(run.TARGETS)
    assert run.memory_table([])[-2].startswith("|---")
