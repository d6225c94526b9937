"""A test hook: stop a make at a step boundary, so a test can kill it exactly there.

`EFABUILD_STOP_AT=build,export,publish` (any of them) makes a make stop itself with SIGSTOP when it
has written a layer's build context and is about to build it (`build`), has created the export
container and is about to stream it (`export`), or has exported and described a `.sqsh` and is
about to publish it (`publish`), or has named an image for the registry and is about to push it
(`push`, in make and `efabuild push`): each a point where a kill leaves something to clean up. The test
sees the process stopped and sends SIGKILL (or SIGCONT to let it go on). Unset, as it always is
outside tests, this does nothing.
"""

from __future__ import annotations

import os
import signal

STOP_AT_ENV = "EFABUILD_STOP_AT"


def step_boundary(step: str) -> None:
    wanted = os.environ.get(STOP_AT_ENV)
    if wanted and step in wanted.split(","):
        os.kill(os.getpid(), signal.SIGSTOP)
