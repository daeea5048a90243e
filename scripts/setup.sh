#!/usr/bin/env bash
# Idempotent set-up for phasechat: a virtual environment in .venv, llama-cpp-python
# compiled once with portable flags, and phasechat installed in editable mode.
# Usage: scripts/setup.sh [dev]      (dev adds the test tools and the test server)
# A second run does nothing that is already done: the llama.cpp build is kept as a wheel
# in ~/.cache/phasechat/wheels/<flags>, keyed by CMAKE_ARGS, so a new clone on the same
# machine reuses it, and changing CMAKE_ARGS (e.g. for CUDA) builds a new one.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
PYTHON=${PYTHON:-python3}
VENV=.venv
EXTRAS=${1:-}
log() { printf 'phasechat setup: %s\n' "$*" >&2; }

# A clone made without symlinks has phasechat/backends, ... as small text files, and
# phasechat/__init__.py refuses to import: stop here with its one line (which names the
# fix), before creating or building anything. (-S: only this folder's phasechat counts.)
"$PYTHON" -S -c 'import sys
try:
    import phasechat
except ImportError as exc:
    sys.exit(str(exc))'

if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# The default build is portable: GGML_NATIVE=OFF, because a native build on this CPU
# family segfaults in the AMX matmul on the first decode, and a native wheel crashes
# (SIGILL) when it moves to an older machine. See scripts/llama_flags.sh for the choice.
# shellcheck source=scripts/llama_flags.sh
source scripts/llama_flags.sh
export CMAKE_ARGS="${CMAKE_ARGS:-$(phasechat_default_cmake_args)}"
flags_key=$(printf '%s %s' "$LLAMA_CPP_PYTHON_VERSION" "$CMAKE_ARGS" | sha256sum | cut -c1-16)
installed_key=$(cat "$VENV/.llama-build-key" 2>/dev/null || true)
if [ "$installed_key" != "$flags_key" ]; then
    wheel_dir="${XDG_CACHE_HOME:-$HOME/.cache}/phasechat/wheels/$flags_key"
    if ! ls "$wheel_dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        log "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION with CMAKE_ARGS='$CMAKE_ARGS' (5-8 minutes, once)"
        mkdir -p "$wheel_dir.tmp"
        # --no-cache-dir: pip's own wheel cache ignores CMAKE_ARGS and would hand back
        # a wheel built with other flags.
        "${PIP[@]}" wheel --no-cache-dir --no-deps -w "$wheel_dir.tmp" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
        rm -rf "$wheel_dir" && mv "$wheel_dir.tmp" "$wheel_dir"
    fi
    "${PIP[@]}" install --quiet --force-reinstall --no-deps "$wheel_dir"/llama_cpp_python-*.whl
    echo "$flags_key" > "$VENV/.llama-build-key"
fi

target="."
[ "$EXTRAS" = "dev" ] && target=".[dev]"
project_key=$(sha256sum < pyproject.toml | cut -c1-16)
stamp="$VENV/.phasechat-$project_key-${EXTRAS:-run}"
# A dev install is a superset of a run install: after the tests, running needs nothing.
if [ ! -f "$stamp" ] && [ ! -f "$VENV/.phasechat-$project_key-dev" ]; then
    log "installing phasechat${EXTRAS:+ [$EXTRAS]} and its dependencies"
    "${PIP[@]}" install --quiet -e "$target"
    touch "$stamp"
fi

# Bytecode for phasechat's own modules (an editable install has none until a first run
# writes it, and PYTHONDONTWRITEBYTECODE, set on some machines, never does): compiling
# ~100 modules from source costs every launch 30-50 ms before the first frame.
# Quick when nothing changed (only stale files are compiled again).
"$VENV/bin/python" -m compileall -q -j 0 backends chat telemetry tui phasechat themes >/dev/null
