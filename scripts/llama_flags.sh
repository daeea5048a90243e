# The llama.cpp CMake flags phasechat builds with unless CMAKE_ARGS is set.
# Portable: no -march=native. GGML_NATIVE=OFF keeps the wheel runnable on any x86-64
# with AVX2/FMA/F16C (ggml's non-native defaults), and avoids the AMX path, which
# crashes on the first decode on the CPU this project is developed on (the CPU reports
# AMX, the kernel has not enabled its state, so -march=native emits tile instructions).
#
# An AVX-512 build (GGML_AVX512 + VBMI + VNNI, no AMX) is safe on that CPU (the local
# model tests pass with it) but was not measurably faster for the bundled model
# (bench/README.md), so it is opt-in: PHASECHAT_LLAMA_AVX512=1 adds the AVX-512 flags
# that /proc/cpuinfo shows. The flags are part of CMAKE_ARGS, and setup.sh keys its
# wheel cache by CMAKE_ARGS, so an AVX-512 wheel is never reused on a machine whose
# probe differs; a machine without AVX-512 probes no flags and gets the portable wheel.
# (Runtime variant selection, GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS, is not usable
# with llama-cpp-python 0.3.36: see bench/README.md.)
phasechat_default_cmake_args() {
    local args="-DGGML_NATIVE=OFF"
    if [ "${PHASECHAT_LLAMA_AVX512:-0}" = 1 ]; then
        local extra
        extra=$(phasechat_avx512_cmake_args)
        [ -n "$extra" ] && args="$args $extra"
    fi
    echo "$args"
}

# The AVX-512 flags this CPU supports, from its cpuinfo (default /proc/cpuinfo); nothing
# unless it has every extension ggml's GGML_AVX512 compiles for (F, CD, VL, DQ, BW).
phasechat_avx512_cmake_args() {
    local flags
    flags=" $(grep -m1 '^flags' "${1:-/proc/cpuinfo}" 2>/dev/null | cut -d: -f2 || true) "
    local ext
    for ext in avx512f avx512cd avx512vl avx512dq avx512bw; do
        case "$flags" in *" $ext "*) ;; *) return 0 ;; esac
    done
    local out="-DGGML_AVX512=ON"
    case "$flags" in *" avx512vbmi "*) out="$out -DGGML_AVX512_VBMI=ON" ;; esac
    case "$flags" in *" avx512_vnni "*) out="$out -DGGML_AVX512_VNNI=ON" ;; esac
    case "$flags" in *" avx512_bf16 "*) out="$out -DGGML_AVX512_BF16=ON" ;; esac
    echo "$out"
}
