#!/usr/bin/env bash
# llama.cpp's own llama-server, built once and cached: scripts/llama_tool.sh.
# Usage: scripts/llama_server.sh [--if-built]
exec "$(dirname "$0")/llama_tool.sh" llama-server "$@"
