#!/usr/bin/env bash
# Idempotent set-up for phasechat: a virtual environment in .venv, llama-cpp-python with
# llama.cpp compiled once with portable flags, and phasechat installed in editable mode.
# Usage: scripts/setup.sh [dev]      (dev adds the test tools)
# A second run does nothing that is already done: the llama.cpp build is kept in
# ~/.cache/phasechat/llama.cpp/<key>, keyed by CMAKE_ARGS, so a new clone on the same
# machine reuses it, and changing CMAKE_ARGS (e.g. for CUDA) builds a new one.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON_VERSION=0.3.36
PYTHON=${PYTHON:-python3}
VENV=.venv
EXTRAS=${1:-}
log() { printf 'phasechat setup: %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# llama-cpp-python is installed in two halves: its Python code from a wheel built without
# its native part (seconds), and llama.cpp's shared libraries from the one llama.cpp build
# that also makes llama-server (scripts/llama_tool.sh): the same vendored sources with the
# same flags, compiled once for the local backend and the server tests instead of twice
# (6 + 6.7 minutes on 2 cores). The build is portable by default: GGML_NATIVE=OFF, because
# a native build on this CPU family segfaults in the AMX matmul on the first decode, and
# native libraries crash (SIGILL) when they move to an older machine. See
# scripts/llama_flags.sh for the choice; CMAKE_ARGS (e.g. -DGGML_CUDA=on) replaces it.
# shellcheck source=scripts/llama_flags.sh
source scripts/llama_flags.sh
export CMAKE_ARGS="${CMAKE_ARGS:-$(phasechat_default_cmake_args)}"
cache_home="${XDG_CACHE_HOME:-$HOME/.cache}/phasechat"
python_key="python-only-$LLAMA_CPP_PYTHON_VERSION"
if [ "$(cat "$VENV/.llama-python-key" 2>/dev/null || true)" != "$python_key" ]; then
    wheel_dir="$cache_home/wheels/$python_key"
    if ! ls "$wheel_dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        log "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's Python part (seconds)"
        mkdir -p "$wheel_dir.tmp"
        # --no-cache-dir: pip's own wheel cache ignores CMAKE_ARGS and would hand back
        # a wheel with a native build in it.
        CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" \
            "${PIP[@]}" wheel --quiet --no-cache-dir --no-deps -w "$wheel_dir.tmp" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
        rm -rf "$wheel_dir" && mv "$wheel_dir.tmp" "$wheel_dir"
    fi
    "${PIP[@]}" install --quiet --force-reinstall --no-deps "$wheel_dir"/llama_cpp_python-*.whl
    rm -f "$VENV/.llama-build-key"  # the reinstall took the libraries out
    echo "$python_key" > "$VENV/.llama-python-key"
fi
target="."
[ "$EXTRAS" = "dev" ] && target=".[dev]"
project_key=$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)
stamp="$VENV/.phasechat-$project_key-${EXTRAS:-run}"
# A dev install is a superset of a run install: after the tests, running needs nothing.
if [ ! -f "$stamp" ] && [ ! -f "$VENV/.phasechat-$project_key-dev" ]; then
    log "installing phasechat${EXTRAS:+ [$EXTRAS]} and its dependencies"
    "${PIP[@]}" install --quiet -e "$target"
    touch "$stamp"
fi

# PHASECHAT_SETUP_PYTHON_ONLY=1 stops here: scripts/test.sh sets vLLM up meanwhile (it
# needs phasechat installed, not llama.cpp), while llama.cpp builds in the background.
[ "${PHASECHAT_SETUP_PYTHON_ONLY:-0}" = 1 ] && exit 0
# The tool's cache folder is keyed by the versions and CMAKE_ARGS: it names the build.
bin_dir=$(PHASECHAT_LLAMA_SERVER_CMAKE_ARGS="$CMAKE_ARGS" scripts/llama_tool.sh llama-server)
bin_dir=$(dirname "$bin_dir")
if [ "$(cat "$VENV/.llama-build-key" 2>/dev/null || true)" != "$bin_dir" ]; then
    lib_dir=$("$VENV/bin/python" -c 'import importlib.util as u, pathlib as p
print(p.Path(u.find_spec("llama_cpp").origin).parent / "lib")')
    log "llama.cpp's libraries from $bin_dir into $lib_dir"
    rm -rf "$lib_dir" && mkdir -p "$lib_dir"
    cp -P "$bin_dir"/lib*.so* "$lib_dir"/
    echo "$bin_dir" > "$VENV/.llama-build-key"
fi

# Bytecode for phasechat's own modules (an editable install has none until a first run
# writes it, and PYTHONDONTWRITEBYTECODE, set on some machines, never does): compiling
# ~100 modules from source costs every launch 30-50 ms before the first frame.
# Quick when nothing changed (only stale files are compiled again).
"$VENV/bin/python" -m compileall -q -j 0 backends chat telemetry tui phasechat themes >/dev/null
