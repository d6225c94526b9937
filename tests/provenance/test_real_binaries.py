"""The probe against real packages: NVIDIA's wheels from PyPI as pip installs them, Debian
bookworm's libfabric and Open MPI as apt installs them (with its dpkg records) and unpacked alone.

The packages are the pins of scripts/fetch-real-binaries.py, fetched by it into its cache
(scripts/run-tests.sh runs it first). The truth each test compares with is read here, at test
time, from the package itself: the wheel's own METADATA inside the .whl, the .deb's control file.
Without the cache the tests are skipped, unless $EFABUILD_REAL_BINARIES_REQUIRED is set (as
run-tests.sh sets it), where a missing package fails them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from efabuild.provenance.fsview import DirView
from efabuild.provenance.probe import probe_tree
from tests.data.rootfs import mini_ngc as ngc

pytestmark = pytest.mark.realbin
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fetch-real-binaries.py"
SITE = "/usr/local/lib/python3.11/dist-packages"
TRIPLET_DIR = "/usr/lib/x86_64-linux-gnu"


def _script():
    spec = importlib.util.spec_from_file_location("fetch_real_binaries", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fetcher = _script()


@pytest.fixture(scope="session")
def packages() -> dict[str, Path]:
    """Each pinned package's cached file, by name."""
    found = {pin.name: fetcher.cached(pin) for pin in fetcher.PINS}
    missing = sorted(name for name, path in found.items() if path is None)
    if missing:
        why = f"not fetched: {', '.join(missing)} (run python3 scripts/fetch-real-binaries.py)"
        if os.environ.get("EFABUILD_REAL_BINARIES_REQUIRED"):
            pytest.fail(why)
        pytest.skip(why)
    return found


def wheel_version(wheel: Path) -> str:
    """The Version: of the wheel's own METADATA, read from the .whl."""
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        text = archive.read(name).decode()
    return re.search(r"^Version: (\S+)$", text, re.MULTILINE).group(1)


def deb_upstream(deb: Path) -> str:
    """The upstream release in the .deb's control Version (no epoch, no Debian revision)."""
    version = fetcher.control(deb)["Version"]
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


@pytest.fixture(scope="session")
def pip_image(packages, tmp_path_factory) -> Path:
    """A Python image with the three wheels `pip install`ed into its site-packages, no CUDA toolkit."""
    root = tmp_path_factory.mktemp("pip-image")
    for name in ("nvidia-cuda-runtime-cu12", "nvidia-nccl-cu12", "nvidia-cudnn-cu12"):
        fetcher.install_wheel(packages[name], root / SITE.lstrip("/"))
    return root


@pytest.mark.parametrize("torch", [False, True], ids=["wheels-alone", "beside-torch"])
def test_pip_s_wheels_measure_as_their_metadata_says(packages, pip_image, tmp_path, torch) -> None:
    root = pip_image
    if torch:  # torch's own files are not fetched (2 GB): the directory its RUNPATH is relative to
        root = tmp_path / "root"
        shutil.copytree(pip_image, root, copy_function=os.link, symlinks=True)
        ngc.write(root, f"{SITE}/torch/version.py", "__version__ = '2.9.1+cu129'\n")
    measured = probe_tree(DirView(root))
    truth = {"cuda": wheel_version(packages["nvidia-cuda-runtime-cu12"]),
             "nccl": wheel_version(packages["nvidia-nccl-cu12"]),
             "cudnn": wheel_version(packages["nvidia-cudnn-cu12"])}
    assert {name: measured.component(name).version for name in truth} == truth
    for name, project in (("cuda", "cuda_runtime"), ("nccl", "nccl"), ("cudnn", "cudnn")):
        component = measured.component(name)
        assert re.fullmatch(rf"/\S+/nvidia_{project}_cu12-[\d.]+\.dist-info/METADATA", component.source), component
        if torch:
            assert component.loads.startswith(f"{SITE}/nvidia/{project}/lib/lib"), component


@pytest.fixture(scope="session")
def debian_images(packages, tmp_path_factory) -> dict[tuple[bool, bool], Path]:
    """Debian's libfabric1 and libopenmpi3 (with `dev`, libopenmpi-dev too) as apt installs them
    (`records`) and unpacked alone: (dev, records) -> root."""
    images = {}
    for dev in (False, True):
        for records in (True, False):
            root = tmp_path_factory.mktemp(f"debian-{'dev' if dev else 'runtime'}-{'records' if records else 'files'}")
            for name in ("libfabric1", "libopenmpi3", *(["libopenmpi-dev"] if dev else [])):
                fetcher.install_deb(packages[name], root, records=records)
            images[dev, records] = root
    return images


@pytest.mark.parametrize("records", [True, False], ids=["dpkg-records", "files-only"])
@pytest.mark.parametrize("dev", [False, True], ids=["runtime", "with-dev"])
def test_debian_s_open_mpi_measures_as_its_package_says(packages, debian_images, dev, records) -> None:
    measured = probe_tree(DirView(debian_images[dev, records]))
    truth = deb_upstream(packages["libopenmpi3"])
    assert [(m.path, m.version) for m in measured.openmpi] == [(TRIPLET_DIR, truth)]


@pytest.mark.parametrize("records", [True, False], ids=["dpkg-records", "files-only"])
def test_debian_s_libfabric_is_its_package_s_release_or_unknown_without_records(
        packages, debian_images, records) -> None:
    """Debian's libfabric 1.17 carries no release string and no pkgconfig file without -dev:
    unpacked alone, nothing in the image tells its release, and the probe does not guess."""
    libfabric = probe_tree(DirView(debian_images[False, records])).component("libfabric")
    assert libfabric.loads == f"{TRIPLET_DIR}/libfabric.so.1"
    if records:
        assert (libfabric.version, libfabric.source) == (
            deb_upstream(packages["libfabric1"]),
            f"/var/lib/dpkg/status (libfabric1 {fetcher.control(packages['libfabric1'])['Version']})")
    else:  # unknown, naming the file it read
        assert libfabric.version is None
        assert libfabric.looked_at[0] == str(Path(TRIPLET_DIR) / os.readlink(
            debian_images[False, records] / TRIPLET_DIR.lstrip("/") / "libfabric.so.1"))


@pytest.mark.parametrize("records", [True, False], ids=["dpkg-records", "files-only"])
def test_the_audit_flags_debian_s_open_mpi_beside_the_base_s(packages, tmp_path, records) -> None:
    """The guide's pitfall made as apt makes it: the clean demo image plus `apt-get install libopenmpi3`."""
    from tests.provenance.test_audit import audit_tree, failures

    ngc.full_image(tmp_path)
    fetcher.install_deb(packages["libopenmpi3"], tmp_path, records=records)
    message = failures(audit_tree(tmp_path))["openmpi"]
    truth = deb_upstream(packages["libopenmpi3"])
    assert message.startswith(f"2 Open MPI installations in use: {TRIPLET_DIR} ({truth}); "
                              f"/usr/local/mpi -> /opt/hpcx/ompi ({ngc.HPCX_OMPI})")
