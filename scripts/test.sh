#!/usr/bin/env bash
# Set up what is missing (with the dev tools), then run everything CI runs:
# ruff (lint + format check), mypy --strict, import-linter (the layers), and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
V=.venv/bin
echo "== ruff" && $V/ruff check . && $V/ruff format --check .
echo "== mypy --strict" && $V/mypy
echo "== lint-imports (layers: pyproject.toml [tool.importlinter])" && $V/lint-imports
echo "== pytest" && $V/pytest -q "$@"
