#!/usr/bin/env python3
"""Build the offline demo fixture images; does nothing when they are up to date.

Same as `python -m efabuild.fixtures` (see fixtures/README.md); runs from a checkout without
installing efabuild.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from efabuild.fixtures import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
