"""Shared test set-up. Fixtures for real services live in their own plugin modules."""

pytest_plugins = [
    "tests.plugins.engine",
    "tests.plugins.s3server",
    "tests.plugins.faultproxy",
]
