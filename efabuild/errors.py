"""The two kinds of failure a user sees: bad input (exit 2) and a failed operation (exit 1).

Both render as one line; the CLI never shows a traceback for them.
"""

from __future__ import annotations


class EfabuildError(Exception):
    """An operation failed (engine, store, network...). Exit status 1."""

    exit_code = 1


class InputError(EfabuildError):
    """The user's input is wrong: a file, a key in it, or an argument. Exit status 2.

    `where` names the file (and line or key) so the message alone says what to fix.
    """

    exit_code = 2

    def __init__(self, problem: str, where: str | None = None) -> None:
        self.problem = problem
        self.where = where
        super().__init__(f"{where}: {problem}" if where else problem)


class NotFound(EfabuildError):
    """A looked-up thing (artifact, ref, image) does not exist. Exit status 1."""


class NoCredentials(EfabuildError):
    """A tier cannot be reached for want of credentials. `reason` says so without naming an object:
    a make publishes to the other tiers and names this one as skipped."""

    def __init__(self, what: str, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{what}: {reason}")
