#!/usr/bin/env bash
# The multi-process tests under load: busy loops keep every core busy while the tests that start
# gloo process groups (tests/distributed, but for launch.py's own tests of hangs and errors, which
# wait on purpose) and the docs page that starts one in its own process (docs/distributed.md) run
# N times in a row (default 20) in 2 pytest-xdist workers, as the suite runs them, stopping at the
# first failure. Usage: bash scripts/stress_distributed.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
cores=$(nproc)
busy=()
stop_busy() { for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_busy EXIT
for _ in $(seq "$cores"); do
    (while :; do :; done) &
    busy+=("$!")
done
echo "$cores busy loops started; $runs runs of the multi-process tests"
for i in $(seq "$runs"); do
    start=$(date +%s)
    if ! python -m pytest -q -p no:cacheprovider -n 2 tests/distributed \
        --deselect tests/distributed/test_distributed_launch.py \
        "tests/docs/test_docs_pages.py::test_docs_page_code_blocks_run[distributed.md]"; then
        echo "run $i of $runs FAILED (load average $(cut -d' ' -f1-3 /proc/loadavg))"
        exit 1
    fi
    echo "run $i of $runs passed in $(($(date +%s) - start)) s (load average $(cut -d' ' -f1-3 /proc/loadavg))"
done
echo "all $runs runs passed, $cores cores kept busy"
