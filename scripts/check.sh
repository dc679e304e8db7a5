#!/usr/bin/env bash
# The static checks CI runs before the tests (docs/development.md): lint, formatting, types, and
# that docs/api.md is what the public docstrings generate. Needs the `lint` extra
# (pip install -e ".[lint]": the pinned ruff and mypy). Stops at the first check that fails.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== ruff check" >&2
python -m ruff check .
echo "== ruff format --check" >&2
python -m ruff format --check .
echo "== mypy" >&2
python -m mypy
echo "== docs/api.md" >&2
python scripts/api_reference.py --check
