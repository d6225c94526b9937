#!/usr/bin/env python3
"""Build the offline demo fixture images; does nothing when they are up to date.

The command is fixtures/command.py, the work fixtures/builder.py (see fixtures/README.md): both
live beside the fixture sources, not in the efabuild package. It uses this checkout's efabuild
package, which need not be installed, but needs efabuild's dependencies (python-on-whales, attrs,
blake3): `bash scripts/setup-host.sh` installs them.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import attrs, blake3, python_on_whales  # noqa: E401,F401 - imported late by the fixtures code
    from fixtures.command import main
except ModuleNotFoundError as exc:  # a bare Python: say what to run instead of a traceback
    print(f"build-fixtures: missing Python module {exc.name!r}: run `bash scripts/setup-host.sh` "
          f"(as root) or `pip install -e .` first", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main())
