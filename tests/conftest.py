"""Shared test set-up. Fixtures for real services live in their own plugin modules.

A test is marked by what it uses: any fixture that needs the Docker engine (`docker_engine`, and so
everything built on it: the busybox base, the loopback registry, the second engine) marks it
`engine`, and moto's S3 server marks it `s3` — directly or through any fixture in between, since
pytest's `item.fixturenames` is the whole closure. So `pytest -m 'not engine and not s3'` runs
exactly the tests that need neither. Those run with DOCKER_HOST pointing at no socket: a test that
reaches the engine without asking for it through a fixture fails, instead of passing here only
because the engine happened to be up.
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.plugins.engine",
    "tests.plugins.s3server",
    "tests.plugins.faultproxy",
    "pytester",  # tests/project/test_conftest.py runs small suites against this file
]

# the fixtures that start or reach a service; whatever depends on them inherits the marker
ENGINE_FIXTURES = frozenset({"docker_engine"})
S3_FIXTURES = frozenset({"moto_server"})
NO_ENGINE = "unix:///nonexistent/efabuild-tests-not-marked-engine.sock"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & ENGINE_FIXTURES:
            item.add_marker(pytest.mark.engine)
        if used & S3_FIXTURES:
            item.add_marker(pytest.mark.s3)


@pytest.fixture(autouse=True, scope="session")
def _verification_cache_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What the suite's checks remember (verified copies, ancestors' chunk indexes found true) goes
    to a cache of this run, never to root's /var/cache/efabuild: a test sees only what it made, and
    a later run starts as a fresh machine does. A test that names its own cache still does."""
    import os

    from efabuild.signing.verifycache import CACHE_ENV

    # made here: root (the suite runs as root in CI) never creates the directory the variable names
    cache = tmp_path_factory.mktemp("verified") / "cache"
    cache.mkdir(mode=0o700)
    os.environ[CACHE_ENV] = str(cache)


@pytest.fixture(autouse=True)
def _no_engine_unless_asked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("engine") is None:
        monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)


@pytest.fixture
def settled_clock(monkeypatch):
    """The stat-stamp clock (host/statstamp.py) a minute ahead: files a test just wrote count as
    settled, as they would a few seconds later (no system call sets a ctime back, so aging a file
    with utime no longer takes it out of the racy window). Only for in-process runs."""
    import time

    from efabuild.host import statstamp

    monkeypatch.setattr(statstamp, "clock_ns", lambda: time.time_ns() + 60_000_000_000)
