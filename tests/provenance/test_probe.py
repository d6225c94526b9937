"""Measuring versions from image filesystems: directory trees and real .sqsh files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from efabuild.errors import EfabuildError
from efabuild.provenance.fsview import DirView, SqshView
from efabuild.provenance.measured import Measured
from efabuild.provenance.probe import probe_tree
from tests.data.rootfs import mini_ngc as ngc


@pytest.fixture
def image(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    ngc.full_image(root)
    return root


def versions(measured) -> dict[str, str | None]:
    return {c.name: c.version for c in measured.components}


def test_full_image_versions_and_their_sources(image: Path) -> None:
    measured = probe_tree(DirView(image))
    assert versions(measured) == {
        "ngc-release": "26.08",
        "cuda": "13.4.1",
        "nccl": "2.30.7",
        "cudnn": "9.14.0",
        "cublas": ngc.CUBLAS,
        "pytorch": ngc.TORCH,
        "triton": ngc.TRITON,
        "libfabric": "2.6.0",
        "aws-ofi-nccl": "1.21.1",
        "efa-installer": "1.50.0",
        "deepep": f"1.1.0+{ngc.DEEPEP_COMMIT[:7]}",
    }
    sources = {c.name: c.source for c in measured.components}
    assert sources["nccl"] == f"/usr/lib/x86_64-linux-gnu/libnccl.so.{ngc.NCCL}"
    assert sources["aws-ofi-nccl"] == "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"
    assert sources["efa-installer"] == "/opt/amazon/efa_installed_packages"
    assert sources["ngc-release"] == "env:NVIDIA_PYTORCH_VERSION"
    deepep = measured.component("deepep")
    assert (deepep.commit, deepep.commit_source) == (ngc.DEEPEP_COMMIT, "/opt/DeepEP/.git/HEAD")
    assert "libnccl-ofi-ngc-v3_1.21.1-1_amd64" in measured.component("efa-installer").packages
    assert [(m.path, m.real_path, m.version) for m in measured.openmpi] == [
        ("/usr/local/mpi", "/opt/hpcx/ompi", ngc.HPCX_OMPI)
    ]


@pytest.mark.slow
def test_sqsh_and_directory_give_the_same_measurement(image: Path, tmp_path: Path) -> None:
    sqsh = ngc.make_sqsh(image, tmp_path / "image.sqsh")
    assert probe_tree(SqshView(sqsh)).to_dict() == probe_tree(DirView(image)).to_dict()


def test_empty_image_is_unknown_everywhere_not_guessed(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    measured = probe_tree(DirView(tmp_path / "empty"))
    assert set(versions(measured).values()) == {None}
    assert measured.openmpi == () and measured.env_source is None
    assert measured.to_dict()["components"]["deepep"] == {
        "version": None, "source": None, "commit": None, "commit_source": None
    }


def test_env_from_image_config_wins_over_etc_environment(image: Path) -> None:
    config_env = ["NCCL_NET_PLUGIN=ofi", "LD_LIBRARY_PATH=/x", "NCCL_IB_HCA=mlx5", "NCCL_VERSION=2.30.7",
                  "HF_TOKEN=hf_secret", "NCCL_SECRET_THING=abc"]
    measured = probe_tree(DirView(image), config_env, image_labels={})
    assert measured.env_source == "image config"
    # only what steers NCCL/libfabric is recorded; NCCL_VERSION is a declaration, not a setting
    assert measured.env_dict == {"NCCL_NET_PLUGIN": "ofi", "LD_LIBRARY_PATH": "/x", "NCCL_IB_HCA": "mlx5",
                                 "NCCL_SECRET_THING": "<redacted>"}
    assert "hf_secret" not in json.dumps(measured.to_dict())
    assert [(d.name, d.source) for d in measured.declared_by_base] == [("NCCL_VERSION", "env:NCCL_VERSION")]


def test_declared_by_base_kept_apart_from_measured(image: Path) -> None:
    ngc.write(image, "/etc/environment",
              (image / "etc/environment").read_text().replace("NCCL_VERSION=2.30.7", "NCCL_VERSION=2.29.3"))
    measured = probe_tree(DirView(image))
    declared = {d.name: (d.value, d.source) for d in measured.declared_by_base}
    assert declared["NCCL_VERSION"] == ("2.29.3", "env:NCCL_VERSION")
    assert declared["com.nvidia.nccl.version"] == (ngc.NCCL, "label:com.nvidia.nccl.version")
    assert measured.component("nccl").version == ngc.NCCL  # file evidence, not the env var


def test_every_aws_ofi_nccl_copy_is_recorded_and_the_loader_order_decides(image: Path) -> None:
    ngc.ofi_plugin(image, "/opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so", "1.13.2-aws")
    env = ngc.parse_env(image)
    measured = probe_tree(DirView(image), env)
    ofi = measured.component("aws-ofi-nccl")
    assert sorted((c.path, c.version) for c in ofi.copies) == [
        ("/opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so", "1.13.2-aws"),
        ("/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", "1.21.1"),
    ]
    assert (ofi.version, ofi.loads) == ("1.21.1", "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so")
    # the old NGC-v2 location first on LD_LIBRARY_PATH: NCCL would load the old plugin
    env["LD_LIBRARY_PATH"] = "/opt/amazon/aws-ofi-nccl/lib:" + env["LD_LIBRARY_PATH"]
    ofi = probe_tree(DirView(image), env).component("aws-ofi-nccl")
    assert (ofi.version, ofi.loads) == ("1.13.2-aws", "/opt/amazon/aws-ofi-nccl/lib/libnccl-net-ofi.so")


def test_ld_so_conf_order_decides_without_ld_library_path(tmp_path: Path) -> None:
    root = tmp_path / "root"
    env = ngc.add_efa_installer(root, ngc.write_base(root), ld_path=False)
    ngc.libfabric_files(root, "/usr/local", "1.22.0", "1.24.0")
    ngc.write(root, "/etc/ld.so.conf.d/00-local.conf", "/usr/local/lib\n")
    libfabric = probe_tree(DirView(root), env).component("libfabric")
    assert (libfabric.version, libfabric.loads) == ("1.22.0", "/usr/local/lib/libfabric.so.1")
    assert {c.version for c in libfabric.copies} == {"1.22.0", "2.6.0"}
    search = probe_tree(DirView(root), env).library_path
    assert search[[d.dir for d in search].index("/usr/local/lib")].source == "/etc/ld.so.conf.d/00-local.conf"


def test_versions_from_dpkg_when_files_say_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ngc.dpkg_status(root, {"libnccl-ofi": "1.16.0-1", "libfabric1-aws": "1:2.1.0amzn3.0"})
    ngc.write(root, "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", ngc.fake_elf("no version string here"))
    ngc.write(root, "/var/lib/dpkg/info/libnccl-ofi:amd64.list", "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so\n")
    ngc.write(root, "/opt/amazon/efa/lib/libfabric.so.1.25.0", ngc.fake_elf("libfabric"))
    ngc.write(root, "/var/lib/dpkg/info/libfabric1-aws.list", "/opt/amazon/efa/lib/libfabric.so.1.25.0\n")
    measured = probe_tree(DirView(root), {"NCCL_NET_PLUGIN": "ofi", "LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib"})
    ofi = measured.component("aws-ofi-nccl")
    assert ofi.version == "1.16.0" and ofi.source.startswith("/var/lib/dpkg/status (libnccl-ofi 1.16.0-1")
    libfabric = measured.component("libfabric")
    assert libfabric.version == "2.1.0" and "libfabric1-aws" in libfabric.source


def test_package_database_alone_is_not_evidence(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ngc.dpkg_status(root, {"libnccl-ofi-ngc-v3": "1.21.1-1", "libfabric1-aws": "2.6.0amzn1.0"})
    measured = probe_tree(DirView(root), {"NCCL_NET_PLUGIN": "ofi"})
    # the files are gone (e.g. removed by a later layer): installed per dpkg, but not in the image
    assert measured.component("aws-ofi-nccl").version is None
    assert measured.component("libfabric").version is None
    assert dict(measured.packages)["libnccl-ofi-ngc-v3"] == "1.21.1-1"


def test_nccl_from_header_when_no_library(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ngc.write(root, "/usr/include/nccl.h", "#define NCCL_MAJOR 2\n#define NCCL_MINOR 21\n#define NCCL_PATCH 5\n"
                                           "#define NCCL_SUFFIX \"\"\n")
    nccl = probe_tree(DirView(root), {}).component("nccl")
    assert (nccl.version, nccl.source) == ("2.21.5", "/usr/include/nccl.h")


def test_deepep_commit_from_pip_vcs_info(tmp_path: Path) -> None:
    root = tmp_path / "root"
    info = f"{ngc.SITE}/deep_ep-1.2.1.dist-info"
    ngc.write(root, f"{info}/METADATA", "Name: deep_ep\nVersion: 1.2.1\n")
    ngc.write(root, f"{info}/direct_url.json", json.dumps(
        {"url": "https://github.com/deepseek-ai/DeepEP", "vcs_info": {"vcs": "git", "commit_id": "ab" * 20}}))
    deepep = probe_tree(DirView(root), {}).component("deepep")
    assert (deepep.version, deepep.commit) == ("1.2.1", "ab" * 20)
    assert deepep.commit_source.endswith("direct_url.json (vcs_info.commit_id)")


def test_symlinks_resolve_inside_the_image_never_on_the_host(tmp_path: Path) -> None:
    root = tmp_path / "root"
    # an absolute link that would read this machine's file if followed on the host
    ngc.link(root, "/opt/amazon/efa_installed_packages", "/etc/hostname")
    ngc.write(root, "/etc/hostname", "# EFA installer version: 9.9.9\n")
    ngc.link(root, "/loop", "/loop")
    view = DirView(root)
    assert probe_tree(view, {}).component("efa-installer").version == "9.9.9"
    assert view.resolve("/loop") is None and view.read_bytes("/loop") is None


def test_sqsh_listing_handles_odd_names(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ngc.write(root, "/odd/a -> b", "arrow")
    ngc.write(root, "/odd/spa ce/wild*[x]", "wild")
    ngc.link(root, "/odd/l", "a -> b")
    ngc.write(root, "/odd/ünï", "utf8")
    view = SqshView(ngc.make_sqsh(root, tmp_path / "odd.sqsh"))
    assert view.listdir("/odd") == sorted(["a -> b", "l", "spa ce", "ünï"])
    assert view.read_many(["/odd/l", "/odd/spa ce/wild*[x]", "/odd/ünï", "/odd/missing"]) == {
        "/odd/l": b"arrow", "/odd/spa ce/wild*[x]": b"wild", "/odd/ünï": b"utf8"}


def test_damaged_sqsh_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sqsh"
    bad.write_bytes(b"not a squashfs" * 100)
    with pytest.raises(EfabuildError, match="bad.sqsh: unsquashfs failed"):
        probe_tree(SqshView(bad))


# ---- the image's machine: arm64 (Grace) layouts ---------------------------------------------------
AARCH64_NCCL = f"/usr/lib/aarch64-linux-gnu/libnccl.so.{ngc.NCCL}"
AARCH64_OFI = "/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu/libnccl-net-ofi.so"


def arm64_image(root: Path) -> dict[str, str]:
    """An arm64 NGC image with a newer installer's layout, whose only pointer to the aarch64
    directories is the loader's own default (no ld.so.conf.d/aarch64-linux-gnu.conf)."""
    env = ngc.full_image(root, machine="aarch64", triplet_dir=True)
    (root / "etc/ld.so.conf.d/aarch64-linux-gnu.conf").unlink()
    return env


@pytest.mark.parametrize("platform", ["linux/arm64", None])
def test_arm64_libraries_are_found_in_the_aarch64_paths(tmp_path: Path, platform: str | None) -> None:
    root = tmp_path / "root"
    arm64_image(root)
    measured = probe_tree(DirView(root), platform=platform)
    assert versions(measured) == {
        "ngc-release": "26.08", "cuda": "13.4.1", "nccl": "2.30.7", "cudnn": "9.14.0", "cublas": ngc.CUBLAS,
        "pytorch": ngc.TORCH, "triton": ngc.TRITON, "libfabric": "2.6.0", "aws-ofi-nccl": "1.21.1", "efa-installer": "1.50.0",
        "deepep": f"1.1.0+{ngc.DEEPEP_COMMIT[:7]}",
    }
    nccl, ofi = measured.component("nccl"), measured.component("aws-ofi-nccl")
    assert (nccl.loads, nccl.source) == ("/usr/lib/aarch64-linux-gnu/libnccl.so.2", AARCH64_NCCL)
    assert measured.component("cudnn").source == "/usr/include/aarch64-linux-gnu/cudnn_version.h"
    assert (ofi.loads, ofi.source) == (AARCH64_OFI, AARCH64_OFI)
    assert measured.component("libfabric").loads == "/opt/amazon/efa/lib/libfabric.so.1"
    # the arm64 loader's defaults, not x86_64's
    defaults = [d.dir for d in measured.library_path if d.source == "default"]
    assert defaults[:2] == ["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
    assert "/usr/lib/x86_64-linux-gnu" not in defaults
    assert measured.machine == "aarch64"
    assert measured.machine_source == ("platform linux/arm64" if platform else "ELF headers")
    assert dict(measured.elf)[AARCH64_OFI] == "aarch64"
    assert measured.to_dict()["machine"] == {"name": "aarch64", "architecture": "arm64",
                                             "source": measured.machine_source}


def test_x86_64_image_keeps_its_search_order_and_records_its_machine(image: Path) -> None:
    measured = probe_tree(DirView(image), platform="linux/amd64")
    searched = [d.dir for d in measured.library_path]
    assert searched == [d.dir for d in probe_tree(DirView(image)).library_path]
    assert "/usr/lib/x86_64-linux-gnu" in searched and not any("aarch64" in d for d in searched)
    assert measured.to_dict()["components"] == probe_tree(DirView(image)).to_dict()["components"]
    assert (measured.machine, measured.machine_source) == ("x86_64", "platform linux/amd64")
    assert set(dict(measured.elf).values()) == {"x86_64"}


def test_machine_record_round_trips_and_old_manifests_read_as_unknown(image: Path) -> None:
    from efabuild.provenance.measured import Measured

    measured = probe_tree(DirView(image))
    assert Measured.from_dict(measured.to_dict()) == measured
    old = {k: v for k, v in measured.to_dict().items() if k not in ("machine", "elf")}
    assert (Measured.from_dict(old).machine, Measured.from_dict(old).elf) == (None, ())


@pytest.mark.slow
def test_elf_headers_are_read_bounded_from_a_sqsh_as_from_a_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    arm64_image(root)
    # a big library: only its head is read (one unsquashfs per big file, its stream cut)
    ngc.write(root, AARCH64_NCCL, ngc.fake_elf("NCCL", machine=ngc.EM_AARCH64) + b"\x00" * (3 << 20))
    ngc.link(root, "/opt/amazon/efa/lib/libfabric/libhost-fi.so", "/../../../../../etc/hostname")
    ngc.write(root, "/etc/hostname", "not an ELF file")
    sqsh = ngc.make_sqsh(root, tmp_path / "arm64.sqsh")
    in_sqsh, in_dir = probe_tree(SqshView(sqsh)), probe_tree(DirView(root))
    assert in_sqsh.to_dict() == in_dir.to_dict()
    assert dict(in_sqsh.elf)[AARCH64_NCCL] == "aarch64"
    heads = SqshView(sqsh).read_heads([AARCH64_NCCL, "/etc/hostname", "/missing"], 20)
    assert heads == {AARCH64_NCCL: (root / AARCH64_NCCL.lstrip("/")).read_bytes()[:20],
                     "/etc/hostname": b"not an ELF file"}


def test_the_image_s_programs_choose_the_search_order_so_the_libraries_are_measured_once(
        tmp_path: Path, monkeypatch) -> None:
    from efabuild.provenance import ldpath

    root = tmp_path / "root"
    arm64_image(root)
    calls = []
    search_path = ldpath.search_path
    monkeypatch.setattr(ldpath, "search_path", lambda *a: calls.append(a[-1]) or search_path(*a))
    measured = probe_tree(DirView(root))
    assert calls == ["x86_64", "aarch64"]  # no program to tell: x86_64's order, then again
    ngc.write(root, "/bin/sh", ngc.fake_elf(machine=ngc.EM_AARCH64))
    calls.clear()
    again = probe_tree(DirView(root))
    assert calls == ["aarch64"]
    assert again.components == measured.components and again.machine == "aarch64"


def test_the_loader_passes_over_a_library_of_another_machine(tmp_path: Path) -> None:
    root = tmp_path / "root"
    env = arm64_image(root)
    # an x86_64 build of the newer plugin first on the path: ld.so on arm64 skips it and goes on
    ngc.ofi_plugin(root, "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", "1.22.0", ngc.EM_X86_64)
    env["LD_LIBRARY_PATH"] = "/opt/amazon/ofi-nccl/lib:" + env["LD_LIBRARY_PATH"]
    measured = probe_tree(DirView(root), env, platform="linux/arm64")
    ofi = measured.component("aws-ofi-nccl")
    assert (ofi.loads, ofi.version) == (AARCH64_OFI, ngc.OFI)
    assert [h.path for h in ofi.on_path] == [AARCH64_OFI]  # the x86_64 copy is reachable by no name
    assert ("/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", "1.22.0") in [(c.path, c.version) for c in ofi.copies]
    assert dict(measured.elf)["/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"] == "x86_64"
    # on x86_64 the same image would load the x86_64 copy
    assert probe_tree(DirView(root), env, platform="linux/amd64").component("aws-ofi-nccl").version == "1.22.0"


def test_the_files_whose_machine_is_read_are_bounded(tmp_path: Path, monkeypatch) -> None:
    from efabuild.provenance import libraries

    root = tmp_path / "root"
    ngc.full_image(root)
    for number in range(40):  # a provider directory of many libraries
        ngc.write(root, f"/opt/amazon/efa/lib/libfabric/libprov{number:02}-fi.so", ngc.fake_elf())
    assert len(probe_tree(DirView(root)).elf) > 40
    monkeypatch.setattr(libraries, "MAX_MACHINE_FILES", 12)
    measured = probe_tree(DirView(root))
    assert len(measured.elf) == 12
    # the libraries and plugins come before the providers' long tail
    assert {f"/usr/lib/x86_64-linux-gnu/libnccl.so.{ngc.NCCL}",
            "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"} <= set(dict(measured.elf))


@pytest.mark.slow
def test_a_library_path_of_a_thousand_directories_reads_a_bounded_number_of_headers(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """A hostile image's LD_LIBRARY_PATH of 1000 directories, each holding a big libnccl.so.2 (hard
    links of one file: a .sqsh of a few KB): each copy's machine cost an `unsquashfs`, 35 s of
    `make`'s probe; past the first copies the loader's search takes them as they are."""
    from efabuild.host import children
    from efabuild.provenance import ldpath

    root = tmp_path / "root"
    env = arm64_image(root)
    big = ngc.write(root, "/opt/big/libnccl.so.2", ngc.fake_elf(machine=ngc.EM_X86_64) + b"\x00" * (1 << 17))
    dirs = [f"/opt/d{number}" for number in range(1000)]
    for directory in dirs:
        (root / directory.lstrip("/")).mkdir(parents=True)
        (root / directory.lstrip("/") / "libnccl.so.2").hardlink_to(big)
    env["LD_LIBRARY_PATH"] = ":".join(dirs) + ":" + env["LD_LIBRARY_PATH"]
    sqsh = ngc.make_sqsh(root, tmp_path / "paths.sqsh")
    runs = []
    popen = children.popen
    monkeypatch.setattr(children, "popen", lambda *a, **k: runs.append(a[0][0]) or popen(*a, **k))
    measured = probe_tree(SqshView(sqsh), env, platform="linux/arm64")
    assert runs.count("unsquashfs") < 150  # 2000 before: two searches of 1000 copies
    # the x86_64 copies judged are passed over; the one taken unjudged is named foreign by audit
    assert measured.component("nccl").loads == f"/opt/d{ldpath.MAX_JUDGED}/libnccl.so.2"
    assert dict(measured.elf)[f"/opt/d{ldpath.MAX_JUDGED}/libnccl.so.2"] == "x86_64"


@pytest.mark.slow
def test_a_thousand_providers_at_deep_real_paths_are_read_without_overflowing_the_command_line(
        tmp_path: Path) -> None:
    """1024 providers linked to files 3.8 KB deep (names an image may hold): their heads were asked
    of one `unsquashfs -cat` whose arguments passed ARG_MAX, and the probe ended in a traceback
    (OSError: Argument list too long); they are read in batches."""
    root = tmp_path / "root"
    ngc.full_image(root)
    deep = "/" + "/".join(["d" * 250] * 15)
    for number in range(1100):
        real = f"{deep}/{'f' * 200}{number}.so"
        ngc.write(root, real, ngc.fake_elf(machine=ngc.EM_AARCH64))
        ngc.link(root, f"/opt/amazon/efa/lib/libfabric/libprov{number}-fi.so", real)
    measured = probe_tree(SqshView(ngc.make_sqsh(root, tmp_path / "deep.sqsh")))
    providers = {path: machine for path, machine in measured.elf if path.startswith(deep)}
    assert len(providers) > 900 and set(providers.values()) == {"aarch64"}
    assert measured.machine == "aarch64"  # most of the files read


def test_ld_so_conf_files_that_include_each_other_are_read_once(tmp_path: Path) -> None:
    """An image's four ld.so.conf.d files that each include the glob of all four: followed to the
    include depth limit, 4^9 reads (43 s from a directory, an unsquashfs each from a .sqsh: about
    an hour of make's probe). Each file is read once and its directories kept."""
    import time

    from efabuild.provenance import ldpath

    root = tmp_path / "root"
    ngc.write(root, "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    for number in range(1, 5):
        ngc.write(root, f"/etc/ld.so.conf.d/c{number}.conf", f"include /etc/ld.so.conf.d/*.conf\n/opt/d{number}\n")
    sqsh = ngc.make_sqsh(root, tmp_path / "loop.sqsh")
    for view in (DirView(root), SqshView(sqsh)):
        started = time.monotonic()
        dirs = ldpath.search_path(view, {})
        assert time.monotonic() - started < 5
        assert {d.dir for d in dirs} >= {"/opt/d1", "/opt/d2", "/opt/d3", "/opt/d4"}


@pytest.mark.slow
def test_many_hard_links_of_a_big_plugin_are_read_one_at_a_time(tmp_path: Path) -> None:
    """Eleven hard links of one 50 MiB libnccl-net*.so (a .sqsh of 4 KB) were read into memory in one
    piece: 1.7 GB of resident memory, and a hundred links of a 256 MiB one exhaust a build host.
    Each is read alone; every copy still has its version."""
    import subprocess
    import sys

    root = tmp_path / "root"
    lib = "/usr/lib/x86_64-linux-gnu"
    big = ngc.write(root, f"{lib}/libnccl-net-ofi.so", ngc.fake_elf("aws-ofi-nccl 1.21.1") + b"\x00" * (50 << 20))
    for number in range(10):
        (root / lib.lstrip("/") / f"libnccl-net-{number}.so").hardlink_to(big)
    sqsh = ngc.make_sqsh(root, tmp_path / "links.sqsh")
    # the child's own peak is VmHWM: ru_maxrss survives exec, so it would report the test process's own
    code = ("import json, re, sys\nfrom pathlib import Path\nfrom efabuild.provenance.fsview import SqshView\n"
            "from efabuild.provenance.probe import probe_tree\n"
            "ofi = probe_tree(SqshView(Path(sys.argv[1])), platform='linux/amd64').component('aws-ofi-nccl')\n"
            "peak = int(re.search(r'VmHWM:\\s+(\\d+) kB', Path('/proc/self/status').read_text()).group(1))\n"
            "print(json.dumps([[c.version for c in ofi.copies], peak]))")
    done = subprocess.run([sys.executable, "-c", code, str(sqsh)], capture_output=True, text=True, timeout=240,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    versions_read, peak_kib = json.loads(done.stdout)
    assert versions_read == ["1.21.1"] * 11
    assert peak_kib < 500 << 10, f"{peak_kib >> 10} MiB resident"


@pytest.mark.slow
def test_thousands_of_small_plugins_are_read_by_a_few_unsquashfs_runs(tmp_path: Path, monkeypatch) -> None:
    """Read one at a time, 2000 small libnccl-net-N.so cost 2000 unsquashfs runs; they are read in
    groups, each copy with its version."""
    from efabuild.host import children

    root = tmp_path / "root"
    for number in range(2000):
        ngc.write(root, f"/usr/lib/x86_64-linux-gnu/libnccl-net-{number}.so", ngc.fake_elf("aws-ofi-nccl 1.21.1"))
    sqsh = ngc.make_sqsh(root, tmp_path / "many.sqsh")
    runs = []
    popen = children.popen
    monkeypatch.setattr(children, "popen", lambda *a, **k: runs.append(a[0][0]) or popen(*a, **k))
    ofi = probe_tree(SqshView(sqsh), platform="linux/amd64").component("aws-ofi-nccl")
    assert [c.version for c in ofi.copies] == ["1.21.1"] * 2000
    assert runs.count("unsquashfs") < 100


def test_an_image_with_hundreds_of_libfabric_copies_has_a_bounded_number_of_them_read_whole(
        tmp_path: Path, monkeypatch) -> None:
    """A hostile image with 400 libfabric.so.1.x files of 8 MiB (hard links of one: a small .sqsh)
    and no pkgconfig or package to name them: each copy was read whole for its version string at
    every export's probe (3.2 GB here, 64 MiB a copy at most); past the first copies they are
    listed without a version."""

    root = tmp_path / "root"
    env = ngc.full_image(root)
    big = ngc.write(root, "/opt/many/big", ngc.fake_elf() + b"\x00" * (8 << 20))
    for number in range(400):
        (root / f"opt/many/libfabric.so.1.{number}").hardlink_to(big)
    env["LD_LIBRARY_PATH"] = "/opt/many:" + env.get("LD_LIBRARY_PATH", "")
    view = DirView(root)
    read = []
    real_read = view.read_bytes
    monkeypatch.setattr(view, "read_bytes", lambda path, *a, **k: read.append(path) or real_read(path, *a, **k))
    copies = probe_tree(view, env).component("libfabric").copies
    assert len([c for c in copies if c.path.startswith("/opt/many/")]) == 400  # every copy still listed
    scanned = [path for path in read if path.startswith("/opt/many/libfabric")]
    assert len(scanned) <= 16, len(scanned)  # 400 before


@pytest.mark.parametrize(("dev", "records", "source"), [
    (False, True, "/var/lib/dpkg/status (libopenmpi3 4.1.4-3+b1)"),
    (False, False, "/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4"),
    (True, True, "/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h"),
    (True, False, "/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h"),
], ids=["runtime", "runtime-no-records", "dev", "dev-no-records"])
def test_debian_s_open_mpi_in_the_triplet_directory_is_one_installation(image: Path, dev: bool, records: bool,
                                                                         source: str) -> None:
    """apt's libopenmpi3 puts libmpi.so.40 on the loader's default path; its -dev package adds
    <triplet>/openmpi beside it: one installation either way, listed beside HPC-X's."""
    ngc.add_debian_openmpi(image, dev=dev, records=records)
    measured = probe_tree(DirView(image))
    assert [(m.path, m.version, m.source) for m in measured.openmpi] == [
        ("/usr/lib/x86_64-linux-gnu", "4.1.4", source),
        ("/usr/local/mpi", ngc.HPCX_OMPI, "/opt/hpcx/ompi/include/mpi.h"),
    ]


def test_debian_s_open_mpi_without_a_version_anywhere_is_unknown(image: Path) -> None:
    ngc.write(image, "/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4", ngc.fake_elf("no release here"))
    ngc.link(image, "/usr/lib/x86_64-linux-gnu/libmpi.so.40", "libmpi.so.40.30.4")
    [debian] = [m for m in probe_tree(DirView(image)).openmpi if m.path == "/usr/lib/x86_64-linux-gnu"]
    assert (debian.version, debian.source) == (None, None)


def pip_image(root: Path, torch: bool = True) -> None:
    """An image whose CUDA libraries come from pip's NVIDIA wheels (no /usr/local/cuda)."""
    if torch:
        ngc.write(root, f"{ngc.SITE}/torch/version.py", "__version__ = '2.9.1+cu129'\n")
        ngc.write(root, f"{ngc.SITE}/torch/lib/libtorch_cuda.so", ngc.fake_elf("torch"))
    ngc.add_wheel(root, "nvidia-cudnn-cu12", "9.28.0.42", ["nvidia/cudnn/lib/libcudnn.so.9",
                                                           "nvidia/cudnn/lib/libcudnn_graph.so.9"])
    ngc.add_wheel(root, "nvidia-cuda-runtime-cu12", "12.9.79", ["nvidia/cuda_runtime/lib/libcudart.so.12"])
    ngc.add_wheel(root, "nvidia-nccl-cu12", "2.32.3", ["nvidia/nccl/lib/libnccl.so.2"], record=False)
    ngc.add_wheel(root, "nvidia-cublas-cu12", "12.9.1.4", ["nvidia/cublas/lib/libcublas.so.12",
                                                           "nvidia/cublas/lib/libcublasLt.so.12"])
    ngc.write(root, f"{ngc.SITE}/triton-3.4.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: triton\nVersion: 3.4.0\n\n")


def test_pip_s_nvidia_wheels_give_cudnn_cuda_and_nccl_from_their_metadata(tmp_path: Path) -> None:
    pip_image(tmp_path)
    measured = probe_tree(DirView(tmp_path))
    lib = f"{ngc.SITE}/nvidia"
    found = {c.name: (c.version, c.source, c.loads) for c in measured.components if c.name in ("cuda", "cudnn", "nccl")}
    assert found == {
        "cuda": ("12.9.79", f"{ngc.SITE}/nvidia_cuda_runtime_cu12-12.9.79.dist-info/METADATA",
                 f"{lib}/cuda_runtime/lib/libcudart.so.12"),
        "cudnn": ("9.28.0.42", f"{ngc.SITE}/nvidia_cudnn_cu12-9.28.0.42.dist-info/METADATA",
                  f"{lib}/cudnn/lib/libcudnn.so.9"),
        "nccl": ("2.32.3", f"{ngc.SITE}/nvidia_nccl_cu12-2.32.3.dist-info/METADATA", f"{lib}/nccl/lib/libnccl.so.2"),
    }
    cublas, triton = measured.component("cublas"), measured.component("triton")
    assert (cublas.version, cublas.loads) == ("12.9.1.4", f"{lib}/cublas/lib/libcublas.so.12")
    assert (triton.version, triton.source) == ("3.4.0", f"{ngc.SITE}/triton-3.4.0.dist-info/METADATA")
    assert [c.path for c in measured.component("cudnn").copies] == [f"{lib}/cudnn/lib/libcudnn.so.9"]


def test_wheels_without_torch_agree_or_are_unknown(tmp_path: Path) -> None:
    """No torch to load them and off the loader's path: a wheel's version still describes the
    only copy; beside a toolkit of another release, nothing says which one a program gets."""
    pip_image(tmp_path, torch=False)
    ngc.write(tmp_path, "/usr/local/cuda/version.json", json.dumps({"cuda": {"version": "12.8.1"}}))
    measured = probe_tree(DirView(tmp_path))
    assert measured.component("cudnn").version == "9.28.0.42"
    cuda = measured.component("cuda")
    assert (cuda.version, cuda.loads) == (None, None)
    assert sorted((c.path, c.version) for c in cuda.copies) == [
        ("/usr/local/cuda", "12.8.1"), (f"{ngc.SITE}/nvidia/cuda_runtime/lib/libcudart.so.12", "12.9.79")]


def test_the_wheel_beside_torch_decides_unless_ld_library_path_leads_elsewhere(image: Path) -> None:
    """NGC's system cuDNN (its header) and a pip cuDNN beside torch: torch's $ORIGIN-relative
    RUNPATH finds the wheel's; a copy on LD_LIBRARY_PATH comes before any RUNPATH."""
    ngc.add_wheel(image, "nvidia-cudnn-cu12", "9.28.0.42", ["nvidia/cudnn/lib/libcudnn.so.9"])
    cudnn = probe_tree(DirView(image)).component("cudnn")
    assert (cudnn.version, cudnn.loads) == ("9.28.0.42", f"{ngc.SITE}/nvidia/cudnn/lib/libcudnn.so.9")
    ngc.write(image, f"/usr/local/cuda/lib64/libcudnn.so.{ngc.CUDNN}", ngc.fake_elf("cudnn"))
    ngc.link(image, "/usr/local/cuda/lib64/libcudnn.so.9", f"libcudnn.so.{ngc.CUDNN}")
    cudnn = probe_tree(DirView(image)).component("cudnn")  # /usr/local/cuda/lib64 is on LD_LIBRARY_PATH
    assert (cudnn.version, cudnn.loads) == (ngc.CUDNN, "/usr/local/cuda/lib64/libcudnn.so.9")
    assert sorted(c.version for c in cudnn.copies) == ["9.14.0", "9.28.0.42"]


def test_a_record_naming_files_outside_the_site_directory_is_not_followed(tmp_path: Path) -> None:
    info = ngc.add_wheel(tmp_path, "nvidia-cudnn-cu12", "9.28.0.42", [], record=False)
    ngc.write(tmp_path, "/opt/elsewhere/libcudnn.so.9", ngc.fake_elf("planted"))
    ngc.write(tmp_path, f"{info}/RECORD", "../../../../../opt/elsewhere/libcudnn.so.9,,\n/opt/elsewhere/libcudnn.so.9,,\n")
    cudnn = probe_tree(DirView(tmp_path)).component("cudnn")
    assert (cudnn.version, cudnn.copies) == (None, ())


def test_an_unknown_version_names_where_the_probe_looked(tmp_path: Path) -> None:
    """Debian's libfabric unpacked without its dpkg records: no .pc, no record, no release string
    in it. The version stays unknown, and the manifest and `show` say which file was read and how."""
    from efabuild.cli.provenance_cmd import _component_rows

    ngc.write(tmp_path, "/usr/lib/x86_64-linux-gnu/libfabric.so.1.20.0", ngc.fake_elf("no release here"))
    ngc.link(tmp_path, "/usr/lib/x86_64-linux-gnu/libfabric.so.1", "libfabric.so.1.20.0")
    measured = probe_tree(DirView(tmp_path))
    libfabric = measured.to_dict()["components"]["libfabric"]
    assert libfabric["version"] is None and libfabric["looked_at"] == [
        "/usr/lib/x86_64-linux-gnu/libfabric.so.1.20.0",
        "libfabric.so.1 on the loader's path: pkgconfig/libfabric.pc beside it, the dpkg package owning it, "
        "a release string in it"]
    assert measured.to_dict()["components"]["cuda"]["looked_at"] == [
        "/usr/local/cuda/version.json", "/usr/local/cuda/version.txt", "/usr/local/cuda/include/cuda.h"]
    rows = {row[0]: row[1:] for row in _component_rows(measured.to_dict())}
    assert rows["libfabric"] == ("unknown", "not found in the image's files; looked at "
                                 "/usr/lib/x86_64-linux-gnu/libfabric.so.1.20.0, " + libfabric["looked_at"][1])
    assert Measured.from_dict(measured.to_dict()) == measured  # as the manifest keeps it


def conda_package(root: Path, name: str, version: str, libs: dict[str, str | None], env: str = "/opt/conda") -> str:
    """`conda install NAME=VERSION`: its files under the environment (a None target: a file, else
    a link to that name) and its conda-meta record listing them. Returns the record's path."""
    for lib, target in libs.items():
        if target is None:
            ngc.write(root, f"{env}/{lib}", ngc.fake_elf(name))
        else:
            ngc.link(root, f"{env}/{lib}", target)
    record = f"{env}/conda-meta/{name}-{version}-h0_0.json"
    ngc.write(root, record, json.dumps({"name": name, "version": version, "build": "h0_0", "files": list(libs)}))
    return record


def test_conda_s_packages_give_cudnn_cuda_and_nccl_from_conda_meta(tmp_path: Path) -> None:
    """A conda environment's torch finds the environment's lib/ by its RUNPATH: its packages decide."""
    ngc.write(tmp_path, "/opt/conda/lib/python3.11/site-packages/torch/version.py", "__version__ = '2.5.1'\n")
    cudnn = conda_package(tmp_path, "cudnn", "9.1.0.70", {"lib/libcudnn.so.9.1.0": None,
                                                          "lib/libcudnn.so.9": "libcudnn.so.9.1.0"})
    cudart = conda_package(tmp_path, "cuda-cudart", "12.4.127", {"lib/libcudart.so.12.4.127": None,
                                                                 "lib/libcudart.so.12": "libcudart.so.12.4.127"})
    nccl = conda_package(tmp_path, "nccl", "2.21.5.1", {"lib/libnccl.so.2.21.5": None, "lib/libnccl.so.2": "libnccl.so.2.21.5"})
    measured = probe_tree(DirView(tmp_path))
    found = {c.name: (c.version, c.source, c.loads) for c in measured.components if c.name in ("cuda", "cudnn", "nccl")}
    assert found == {"cuda": ("12.4.127", cudart, "/opt/conda/lib/libcudart.so.12"),
                     "cudnn": ("9.1.0.70", cudnn, "/opt/conda/lib/libcudnn.so.9"),
                     "nccl": ("2.21.5.1", nccl, "/opt/conda/lib/libnccl.so.2")}
    assert measured.component("pytorch").version == "2.5.1"


def test_a_conda_record_naming_files_outside_its_environment_is_not_followed(tmp_path: Path) -> None:
    ngc.write(tmp_path, "/opt/elsewhere/libcudnn.so.9", ngc.fake_elf("planted"))
    ngc.write(tmp_path, "/opt/conda/conda-meta/cudnn-9.1.0.70-h0_0.json", json.dumps(
        {"name": "cudnn", "version": "9.1.0.70", "files": ["../elsewhere/libcudnn.so.9", "/opt/elsewhere/libcudnn.so.9"]}))
    ngc.write(tmp_path, "/opt/conda/conda-meta/nccl-2.21.5-h0_0.json", "[" * 100_000)  # too deep for json
    measured = probe_tree(DirView(tmp_path))
    assert (measured.component("cudnn").version, measured.component("cudnn").copies) == (None, ())


class _CountingView(DirView):
    """A DirView that counts the links it resolves: each a walk through the image's links."""

    resolved = 0

    def resolve(self, path: str) -> str | None:
        self.resolved += 1
        return super().resolve(path)


def test_records_naming_a_library_a_million_times_are_looked_up_a_bounded_number_of_times(tmp_path: Path) -> None:
    """A hostile RECORD or conda-meta listing hundreds of thousands of library names, each a chain
    of links that ends nowhere: a few dozen of each record are resolved, and nothing is found."""
    from efabuild.provenance.wheels import MAX_LIBS

    info = ngc.add_wheel(tmp_path, "nvidia-cudnn-cu12", "9.28.0.42", [], record=False)
    ngc.write(tmp_path, f"{info}/RECORD", "nvidia/cudnn/lib/libcudnn.so.9,,\n" * 40_000)
    ngc.write(tmp_path, "/opt/conda/conda-meta/cudnn-9.1.0.70-h0_0.json", json.dumps(
        {"name": "cudnn", "version": "9.1.0.70", "files": ["lib/libcudnn.so.9"] * 200_000}))
    for i in range(30):
        ngc.link(tmp_path, f"/opt/l{i}", f"/opt/l{i + 1}")
    ngc.link(tmp_path, "/opt/conda/lib/libcudnn.so.9", "/opt/l0")
    ngc.link(tmp_path, f"{ngc.SITE}/nvidia/cudnn/lib/libcudnn.so.9", "/opt/l0")
    view = _CountingView(tmp_path)
    assert probe_tree(view).component("cudnn").copies == ()
    # two records of one package, looked up for each component that reads cuDNN's files
    assert 2 * MAX_LIBS <= view.resolved < 20 * MAX_LIBS, view.resolved
