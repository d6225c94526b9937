"""What the library reports (store warnings, waits for a lock) printed as the CLI's own lines.

The library never prints: its modules log to loggers under `efabuild`. The CLI installs one
handler there that prints `efabuild: warning: MESSAGE` (or `efabuild: MESSAGE` for progress
notes such as a wait) on stderr, each message once: gc looks at a damaged ref file more than
once, the user needs to read about it once.
"""

from __future__ import annotations

import logging
import sys


class Reporter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message in self.seen:
            return
        self.seen.add(message)
        prefix = "efabuild: warning: " if record.levelno >= logging.WARNING else "efabuild: "
        print(prefix + message, file=sys.stderr)  # the stderr of the moment (tests capture it)


def install() -> None:
    logger = logging.getLogger("efabuild")
    for handler in [h for h in logger.handlers if isinstance(h, Reporter)]:
        logger.removeHandler(handler)  # main() called again in one process
    logger.addHandler(Reporter())
    logger.setLevel(logging.INFO)
