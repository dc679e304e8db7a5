#!/bin/bash
# Times the README's main-job command from a fresh clone into a fresh venv (no pip cache): the
# installs and the run (demo + lottery-ticket experiment) separately. Usage, from the repo root:
#   bash benchmarks/main_job.sh [WORKDIR]      (default WORKDIR: /tmp/fprune-main-job)
set -e
work=${1:-/tmp/fprune-main-job}
source "$(dirname "$0")/fresh_clone.sh"
fresh_clone "$work"
t0=$(date +%s.%N)
python -m pip install -q torch==2.13.0 && python -m pip install -q -e ".[examples]"
t1=$(date +%s.%N)
python examples/demo.py > "$work/demo.txt" && python examples/lottery_ticket.py --plot lottery.png > "$work/lottery.txt"
t2=$(date +%s.%N)
python -c "print(f'installs {$t1 - $t0:.1f} s, demo + lottery {$t2 - $t1:.1f} s, total {$t2 - $t0:.1f} s; lottery alone: ' + open('$work/lottery.txt').read().split()[-6] + ' s')"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
