"""Reading BuildKit's plain progress output: which step failed, why, and its last lines.

The samples are output of `docker buildx build --progress plain` (buildx 0.13, engine 26.1).
"""

from __future__ import annotations

from pathlib import Path

from efabuild.engine.build import format_failure
from efabuild.engine.buildlog import BuildLogReader

FAILED_RUN = """\
#0 building with "default" instance using docker driver

#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 237B done
#1 DONE 0.0s

#4 [1/2] FROM docker.io/efabuild-test/busybox:probe
#4 CACHED

#5 [2/2] RUN for i in $(seq 18); do echo line $i; done && echo "E: Unable to locate package environment-modules" >&2 && exit 3
#5 0.130 line 1
#5 0.130 line 2
#5 0.130 line 3
#5 0.130 line 4
#5 0.130 line 5
#5 0.130 line 6
#5 0.130 line 7
#5 0.130 line 8
#5 0.130 line 9
#5 0.130 line 10
#5 0.131 E: Unable to locate package environment-modules
#5 0.131 line 11
#5 0.131 line 12
#5 0.131 line 13
#5 0.131 line 14
#5 0.131 line 15
#5 0.131 line 16
#5 0.131 line 17
#5 0.131 line 18
#5 ERROR: process "/bin/sh -c for i in $(seq 18); do echo line $i; done && echo \\"E: Unable to locate package environment-modules\\" >&2 && exit 3" did not complete successfully: exit code: 3
------
 > [2/2] RUN for i in $(seq 18); do echo line $i; done && echo "E: Unable to locate package environment-modules" >&2 && exit 3:
0.131 line 18
------
Dockerfile:2
--------------------
   1 |     FROM efabuild-test/busybox:probe
   2 | >>> RUN for i in $(seq 18); do echo line $i; done && \\
--------------------
ERROR: failed to solve: process "/bin/sh -c for i in $(seq 18); do echo line $i; done" did not complete successfully: exit code: 3
"""

PARSE_ERROR = """\
#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 79B done
#1 DONE 0.0s
Dockerfile:2
--------------------
   1 |     FROM efabuild-test/busybox:probe
   2 | >>> FOO bar
   3 |
--------------------
ERROR: failed to solve: dockerfile parse error on line 2: unknown instruction: FOO (did you mean FROM?)
"""

# two stages running side by side: their output interleaves, headers are repeated
INTERLEAVED = """\
#5 [a 2/2] RUN echo from-a && sleep 1 && exit 7
#6 [b 2/2] RUN echo from-b
#5 0.101 from-a
#6 0.102 from-b
#6 DONE 0.2s
#5 [a 2/2] RUN echo from-a && sleep 1 && exit 7
#5 ERROR: process "/bin/sh -c echo from-a && sleep 1 && exit 7" did not complete successfully: exit code: 7
ERROR: failed to solve: process "/bin/sh -c echo from-a && sleep 1 && exit 7" did not complete successfully: exit code: 7
"""

ALL_CACHED = """\
#4 [1/3] FROM docker.io/efabuild-test/busybox:probe
#4 DONE 0.0s
#6 [2/3] COPY f.txt /f.txt
#6 CACHED
#7 [3/3] RUN echo built
#7 CACHED
#8 exporting to image
#8 writing image sha256:4fc4 done
#8 DONE 0.0s
"""


def read(text: str) -> BuildLogReader:
    reader = BuildLogReader()
    for line in text.splitlines():
        reader.feed(line)
    return reader


def test_failed_run_names_the_step_its_exit_code_and_its_last_15_lines():
    failure = read(FAILED_RUN).failure()
    assert failure.step.startswith("[2/2] RUN for i in $(seq 18)")
    assert failure.exit_code == 3
    assert len(failure.tail) == 15
    assert failure.tail[-1] == "line 18"
    assert "E: Unable to locate package environment-modules" in failure.tail
    # the lines are the command's output, without BuildKit's "#5 0.131" prefix
    assert all(not line.startswith("#") for line in failure.tail)


def test_a_bad_dockerfile_has_no_step_but_says_why():
    failure = read(PARSE_ERROR).failure()
    assert failure.step is None
    assert failure.reason.startswith("failed to solve: dockerfile parse error on line 2: unknown instruction: FOO")
    assert failure.exit_code is None
    assert failure.tail[-1].startswith("ERROR: failed to solve")


def test_interleaved_steps_keep_their_own_output():
    failure = read(INTERLEAVED).failure()
    assert failure.step == "[a 2/2] RUN echo from-a && sleep 1 && exit 7"
    assert failure.tail == ("from-a",)
    assert failure.exit_code == 7


def test_fully_cached_only_when_every_instruction_came_from_cache():
    assert read(ALL_CACHED).fully_cached
    ran = ALL_CACHED.replace("#7 CACHED", "#7 0.1 built\n#7 DONE 0.1s")
    assert not read(ran).fully_cached


def test_failure_message_is_one_message_with_the_step_first():
    failure = read(FAILED_RUN).failure()
    message = format_failure("efabuild/efa:0123abcd", failure, Path("cache/logs/demo/efa/0123abcd.log"))
    head, *rest = message.splitlines()
    assert head.startswith("build of efabuild/efa:0123abcd failed at [2/2] RUN for i in")
    assert head.endswith("exit code 3 (log: cache/logs/demo/efa/0123abcd.log)")
    assert rest[0] == "last lines:"
    assert rest[-1] == "  | line 18"
    assert "Traceback" not in message
