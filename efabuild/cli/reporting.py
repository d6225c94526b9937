"""What the library reports (efabuild.notices) printed as the CLI's own lines on stderr:
`efabuild: warning: MESSAGE`, or `efabuild: MESSAGE` for notes such as a wait for a lock. Each
message once: gc looks at a damaged ref file more than once, the user needs to read about it once.
The progress of long transfers (efabuild.store.progress) goes to the same stderr.
"""

from __future__ import annotations

import sys

from efabuild import notices
from efabuild.display import shown


class Printer:
    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, kind: str, message: str) -> None:
        if message in self.seen:
            return
        self.seen.add(message)
        prefix = "efabuild: warning: " if kind == notices.WARNING else "efabuild: "
        # one line, control characters escaped: a message may name what anyone could create (an S3
        # key, a file name), and gc runs as root on a terminal
        print(prefix + shown(message), file=sys.stderr)  # the stderr of the moment (tests capture it)


def install() -> None:
    from efabuild.store import progress  # deferred: the Pyxis importer loads this module and reports no progress

    notices.use(Printer())  # a fresh one per main() call
    progress.use(lambda: sys.stderr)  # long transfers show their progress there too
