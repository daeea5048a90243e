#!/usr/bin/env bash
# Set up what is missing (with the dev tools), then run everything CI runs:
# ruff (lint + format check), mypy --strict, import-linter (the layers), and pytest.
# The tests against llama.cpp's own llama-server need its binary (scripts/llama_server.sh):
# under CI (CI=true) or with PHASECHAT_BUILD_LLAMA_SERVER=1 it is built here once (about
# 8 minutes, then cached); otherwise an already cached build is used, and without one
# those tests skip, saying how to build it. PHASECHAT_LLAMA_SERVER=PATH names any binary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
if [ -z "${PHASECHAT_LLAMA_SERVER:-}" ]; then
    if [ "${CI:-}" = true ] || [ "${PHASECHAT_BUILD_LLAMA_SERVER:-0}" = 1 ]; then
        PHASECHAT_LLAMA_SERVER=$(scripts/llama_server.sh)
    else
        PHASECHAT_LLAMA_SERVER=$(scripts/llama_server.sh --if-built || true)
    fi
    export PHASECHAT_LLAMA_SERVER
fi
V=.venv/bin
echo "== ruff" && $V/ruff check . && $V/ruff format --check .
echo "== mypy --strict" && $V/mypy
echo "== lint-imports (layers: pyproject.toml [tool.importlinter])" && $V/lint-imports
echo "== pytest" && $V/pytest -q "$@"
