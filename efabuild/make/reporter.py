"""How a make reports its progress: the interface the CLI implements (cli/live.py draws it as
plain lines, a live terminal view or JSON events). The default reports nothing: efabuild used as
a library is silent. Every method may be called from worker threads.
"""

from __future__ import annotations


class Reporter:
    def started(self, name: str, action: str, detail: str = "") -> None:
        """Layer `name` began `action` (build, pull, export, wait, check) for `detail`."""

    def line(self, name: str, text: str) -> None:
        """A line of the build log of layer `name`."""

    def finished(self, outcome) -> None:  # noqa: ANN001 - a build.schedule.Outcome
        """A layer is done: its Outcome (status, time, steps, log, artifact, or why it failed)."""

    def close(self) -> None:
        """The make is over: release the terminal."""
