# The llama.cpp CMake flags phasechat builds with unless CMAKE_ARGS is set.
# Portable: no -march=native. GGML_NATIVE=OFF keeps the wheel runnable on any x86-64
# with AVX2/FMA/F16C (ggml's non-native defaults), and avoids the AMX path, which
# crashes on the first decode on the CPU this project is developed on.
phasechat_default_cmake_args() {
    echo "-DGGML_NATIVE=OFF"
}
