"""The markers tests/conftest.py gives: `pytest -m 'not engine and not s3'` collects exactly the tests
that need neither the engine nor S3, however indirectly a test reaches them through fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

# Collected only, never run: no engine, registry or S3 server is started by this test.
SUITE = '''
import os

import pytest


@pytest.fixture
def my_image(busybox_image):  # a test file's own fixture, built on the engine's
    return busybox_image


@pytest.fixture
def my_store(s3_bucket):  # and one built on moto's server
    return s3_bucket


def test_engine_directly(docker_engine): pass
def test_engine_through_the_registry(local_registry): pass
def test_engine_through_a_local_fixture(my_image): pass
def test_s3_through_a_local_fixture(my_store): pass
def test_both(my_image, s3_client): pass
def test_neither(tmp_path): pass
def test_neither_sees_no_engine(): assert os.environ["DOCKER_HOST"].startswith("unix:///nonexistent/")
'''


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini('[pytest]\nmarkers =\n    engine: engine\n    s3: s3\naddopts = --strict-markers\n')
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_suite=SUITE)
    return pytester


# the inner runs need neither assertion rewriting nor these plugins (rewriting them costs seconds)
QUIET = ("--assert=plain", "-p", "no:cacheprovider", "-p", "no:benchmark", "-p", "no:hypothesispytest")


def _collected(suite: pytest.Pytester, expression: str) -> set[str]:
    result = suite.runpytest(*QUIET, "-m", expression, "--collect-only", "-q")
    return {line.split("::")[1] for line in result.outlines if "::" in line}


def test_markers_follow_the_fixture_closure(suite):
    assert _collected(suite, "engine") == {"test_engine_directly", "test_engine_through_the_registry",
                                           "test_engine_through_a_local_fixture", "test_both"}
    assert _collected(suite, "s3") == {"test_s3_through_a_local_fixture", "test_both"}
    # the quick part runs exactly the rest, and there DOCKER_HOST leads to no engine
    quick = suite.runpytest(*QUIET, "-m", "not engine and not s3", "-v")
    quick.assert_outcomes(passed=2, deselected=5)
    assert {line.split("::")[1].split()[0] for line in quick.outlines if " PASSED" in line} == {
        "test_neither", "test_neither_sees_no_engine"}
