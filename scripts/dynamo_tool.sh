#!/usr/bin/env bash
# Idempotent set-up of a real NVIDIA Dynamo for the tests that need one
# (tests/dynamo_server.py): ai-dynamo from PyPI in a Python 3.11 venv of its own, its
# frontend (the OpenAI-compatible HTTP server, KV router) and its mocker (a worker that
# schedules, caches prefixes in blocks and times like an engine, without a model or a
# GPU), serving the tokenizer and config of the bundled SmolLM2 (the Hugging Face folder
# scripts/vllm_tool.sh converts: set up first if it is not). Prints the venv's python
# on stdout (what PHASECHAT_DYNAMO names); logs go to stderr.
#
# Found by trying it on this machine (issue 46):
# - `ai-dynamo` depends on `aisimulate`, a stub whose install downloads from a host not
#   reachable here (only the planner imports it), and on kubernetes (only the operator
#   side): both are installed --no-deps, with the dependencies the frontend and the
#   mocker really import, found by running them. pydantic above 2.13.5 breaks its models.
# - The mocker reads the model folder's config and tokenizer only: the weights are not
#   copied.
#
# Kept in ${XDG_CACHE_HOME:-~/.cache}/phasechat/dynamo/<key>, keyed by this script's text
# from the versions on: a second run builds nothing (about a minute and 650 MB the first
# time). One build at a time per key (scripts/tool_cache.sh).
#
# Usage: scripts/dynamo_tool.sh [--if-built]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PHASECHAT_DYNAMO_PYTHON:-python3.11}
log() { printf 'phasechat dynamo: %s\n' "$*" >&2; }

key=$(sed -n '/^# --- versions ---$/,$p' "$0" | sha256sum | cut -c1-16)
# shellcheck source=scripts/tool_cache.sh
source scripts/tool_cache.sh
tool_cache_lock dynamo "$key" "${1:-}"
# --- versions ---
DYNAMO_VERSION=1.6.1
DEPENDENCIES=(aiohttp msgspec prometheus-client pyzmq tqdm transformers zstandard redis uvloop
    "pydantic<=2.13.5")
if [ ! -f "$dest/ready" ]; then
    start=$(date +%s)
    hf=$(scripts/vllm_tool.sh)/model
    work="$cache/$key.tmp"
    rm -rf "$work" && mkdir -p "$work/model"
    log "creating a venv with ai-dynamo==$DYNAMO_VERSION (about 150 MB to download, once)"
    "$PYTHON" -m venv "$work/venv"
    pip=("$work/venv/bin/pip" install --quiet --disable-pip-version-check)
    "${pip[@]}" --no-deps "ai-dynamo==$DYNAMO_VERSION" "ai-dynamo-runtime==$DYNAMO_VERSION" >&2
    "${pip[@]}" "${DEPENDENCIES[@]}" >&2
    log "the model's config and tokenizer from $hf"
    find "$hf" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$work/model/" \;
    "$work/venv/bin/python" -c 'import dynamo.frontend.main, dynamo.mocker.main' >&2
    touch "$work/ready"
    rm -rf "$dest" && mv "$work" "$dest"
    log "ready in $(( $(date +%s) - start )) s: $dest"
fi
echo "$dest/venv/bin/python"
