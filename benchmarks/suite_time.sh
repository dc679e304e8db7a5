#!/bin/bash
# Times the README's test command (what .ci/run runs) from a fresh clone into a fresh venv (no
# pip cache), CI=true: the installs, the checks (scripts/check.sh) and pytest separately, with the
# load average before and after. Usage, from the repo root:
#   bash benchmarks/suite_time.sh [WORKDIR]      (default WORKDIR: /tmp/fprune-suite-time)
set -e
work=${1:-/tmp/fprune-suite-time}
source "$(dirname "$0")/fresh_clone.sh"
fresh_clone "$work"
export CI=true
echo "commit $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M') UTC, $(python -c 'from benchmarks.record import cpu_model; print(cpu_model())'), $(nproc) cores, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s.%N)
python -m pip install -q torch==2.13.0 && python -m pip install -q -e ".[test,examples,zoo,lint]" && python -m pip install -q --no-deps --upgrade --target .deps torchvision==0.28.0
t1=$(date +%s.%N)
bash scripts/check.sh > "$work/check.txt" 2>&1
t2=$(date +%s.%N)
python -m pytest -q -n auto > "$work/pytest.txt" 2>&1 || { tail -30 "$work/pytest.txt"; exit 1; }
t3=$(date +%s.%N)
python -c "print(f'installs {$t1 - $t0:.1f} s, checks {$t2 - $t1:.1f} s, pytest {$t3 - $t2:.1f} s, total {$t3 - $t0:.1f} s')"
tail -1 "$work/pytest.txt"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
