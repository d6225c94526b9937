#!/usr/bin/env bash
# The main job on a fresh machine: set up the engine, build the offline fixture images, then
# `efabuild make demo` into the default local store (cache/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-host.sh
python3 scripts/build-fixtures.py
efabuild make demo "$@"
