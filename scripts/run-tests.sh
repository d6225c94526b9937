#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs and starts what the tests need, fetches the
# pinned real packages the probe is checked against (cached), then runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
FORCE_PIP=1 bash scripts/setup-host.sh
python3 scripts/fetch-real-binaries.py >/dev/null
EFABUILD_REAL_BINARIES_REQUIRED=1 python3 -m pytest "$@"
