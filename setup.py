"""Everything is in pyproject.toml but one step: the project's Source URL, read from the checkout."""

import sys
from pathlib import Path

from setuptools import setup


def _project_urls() -> dict[str, str]:
    """Where these sources come from: the checkout's `origin` remote, when it is a web address,
    without credentials (the images' source label says the same). Sources without their own git
    checkout (an sdist, a copy) name none: the project has no fixed address to write here."""
    here = Path(__file__).resolve().parent
    if not (here / ".git").exists():
        return {}
    sys.path.insert(0, str(here))
    from efabuild.make.gitstate import SOURCE, git_labels

    source = git_labels(here).get(SOURCE, "")
    return {"Source": source} if source.startswith(("https://", "http://")) else {}


setup(project_urls=_project_urls())
