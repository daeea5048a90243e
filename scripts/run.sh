#!/usr/bin/env bash
# Set up what is missing (see setup.sh), then start phasechat on the bundled model.
# Any arguments go to phasechat: scripts/run.sh ask "hello", scripts/run.sh doctor ...
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/phasechat "$@"
