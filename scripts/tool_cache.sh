# shellcheck shell=bash
# Sourced by the set-up scripts of the real servers the tests run (scripts/vllm_tool.sh,
# scripts/dynamo_tool.sh): each is kept in ${XDG_CACHE_HOME:-~/.cache}/phasechat/NAME/KEY,
# built once into KEY.tmp and moved there whole, with a `ready` file, so a second run
# builds nothing and a build that died leaves nothing that looks finished.

# `tool_cache_lock NAME KEY [--if-built]`: sets `cache` and `dest`; when `dest` is not
# built yet, exits 1 under --if-built, else takes the build's lock (one build at a time
# per key: a second caller waits here, then finds it built).
tool_cache_lock() {
    cache="${XDG_CACHE_HOME:-$HOME/.cache}/phasechat/$1"
    dest="$cache/$2"
    if [ ! -f "$dest/ready" ]; then
        [ "${3:-}" = "--if-built" ] && exit 1
        mkdir -p "$cache"
        exec 9> "$cache/$2.lock"
        flock 9
    fi
}
