"""``python -m benchmarks``: the benchmark runner (see :mod:`benchmarks.run`)."""

from benchmarks.run import main

raise SystemExit(main())
