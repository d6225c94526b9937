#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs and starts what the tests need, then runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
FORCE_PIP=1 bash scripts/setup-host.sh
python3 -m pytest "$@"
