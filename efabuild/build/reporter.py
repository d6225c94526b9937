"""How a make reports its progress: the interface the CLI implements (cli/live.py draws it as
plain lines or a live terminal view). The default reports nothing: efabuild used as a library is
silent. Every method may be called from worker threads.
"""

from __future__ import annotations


class Reporter:
    def started(self, name: str, action: str, detail: str = "") -> None:
        """Layer `name` began `action` (build, pull, export, wait, check) for `detail`."""

    def line(self, name: str, text: str) -> None:
        """A line of the build log of layer `name`."""

    def finished(self, name: str, text: str) -> None:
        """Layer `name` is done: its outcome in words."""

    def close(self) -> None:
        """The make is over: release the terminal."""
