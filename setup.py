"""Everything is in pyproject.toml but one step: the fixture sources go into the package as one tar.

A wheel holds regular files only; the fixture's root filesystem is mostly symlinks (libnccl.so ->
libnccl.so.2, /usr/local/mpi -> /opt/hpcx/ompi), which a tar keeps as they are. An installed
efabuild unpacks it when it builds the fixture image (efabuild/make/fixtures.py).
"""

import sys
import tarfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

EPOCH = 315532800  # 1980-01-01, as the builds: the same sources give the same wheel


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if "__pycache__" in info.name.split("/"):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = EPOCH
    return info


class BuildPyWithFixtures(build_py):
    def run(self) -> None:
        super().run()
        source = Path(__file__).resolve().parent / "fixtures"
        target = Path(self.build_lib) / "efabuild" / "make" / "fixtures.tar"
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(source, arcname="fixtures", filter=_normalised)


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


setup(cmdclass={"build_py": BuildPyWithFixtures}, project_urls=_project_urls())
