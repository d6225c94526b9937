"""The offline demo fixtures: the mini NGC base builds once, and the guide's Dockerfile text
builds on it with the real outcome and the real failure modes."""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path

import pytest

from efabuild.workspace import load_workspace
from fixtures.builder import (
    DEEPEP_COMMITS,
    EFA_INSTALLER_VERSIONS,
    MINI_NGC_TAG,
    build_fixtures,
    content_digest,
    find_busybox,
    is_static_elf,
    source_dir,
)

pytestmark = pytest.mark.engine

# The layer texts users copy: read from the shipped graphs/ngc-efa.toml, so what is tested here is
# what they run.
_REFERENCE = load_workspace(Path(__file__).resolve().parents[2]).layers
EFA = _REFERENCE["ngc-efa:efa"].dockerfile
DEEPEP = _REFERENCE["ngc-efa:deepep"].dockerfile
USER = _REFERENCE["ngc-efa:user"].dockerfile


@pytest.fixture(scope="module")
def mini_ngc(docker_engine) -> str:
    first = build_fixtures()
    again = build_fixtures()
    assert [img.tag for img in first] == [MINI_NGC_TAG]
    assert again[0].built is False and again[0].image_id == first[0].image_id
    return MINI_NGC_TAG


class Builder:
    """Builds Dockerfile texts FROM a given image; removes its tags at the end."""

    def __init__(self, root: Path) -> None:
        from python_on_whales import docker

        self.docker, self.root, self.tags = docker, root, []
        (root / "app").mkdir(parents=True)
        (root / "app" / "train.py").write_text("print('train')\n")

    def build(self, parent: str, text: str, **args: str) -> str:
        tag = f"efabuild-test/fixture:{uuid.uuid4().hex[:12]}"
        dockerfile = self.root / f"{tag.rsplit(':', 1)[1]}.Dockerfile"
        dockerfile.write_text(f"FROM {parent}\n{text}")
        self.tags.append(tag)
        self.docker.buildx.build(self.root, file=dockerfile, tags=[tag], build_args=args, load=True, progress=False)
        return tag

    def fails(self, parent: str, text: str, **args: str) -> str:
        from python_on_whales.exceptions import DockerException

        with pytest.raises(DockerException) as info:
            self.build(parent, text, **args)
        return info.value.stderr or ""

    def sh(self, image: str, script: str) -> str:
        return self.docker.run(image, ["-c", script], entrypoint="/bin/sh", remove=True)

    def env(self, image: str) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.docker.image.inspect(image).config.env)

    def close(self) -> None:
        for tag in self.tags:
            self.docker.image.remove(tag, force=True)


@pytest.fixture(scope="module")
def builder(mini_ngc, tmp_path_factory):
    b = Builder(tmp_path_factory.mktemp("fixture-builds"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def stack(mini_ngc, builder) -> dict[str, str]:
    efa = builder.build(mini_ngc, EFA)
    deepep = builder.build(efa, DEEPEP)
    user = builder.build(deepep, USER)
    return {"efa": efa, "deepep": deepep, "user": user}


def test_base_has_the_ngc_layout(mini_ngc, builder) -> None:
    out = builder.sh(mini_ngc, """
        grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' /usr/include/nccl.h
        ls /usr/lib/x86_64-linux-gnu/libnccl.so.2.30.7 /opt/amazon/efa/lib/libfabric.so.1.28.0
        cat /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so
        grep __version__ /usr/local/lib/python3.12/dist-packages/torch/version.py
        /usr/local/mpi/bin/ompi_info | grep 'Open MPI:'
        grep '"version" : "13.4.1"' /usr/local/cuda/version.json
        cat /etc/ld.so.conf.d/efa.conf
        dpkg-query -W libnccl2
        test ! -e /opt/amazon/efa_installed_packages && echo no-installer-record
    """)
    for expected in ("NCCL_MAJOR 2", "NCCL_MINOR 30", "NCCL_PATCH 7", "libnccl.so.2.30.7",
                     "libfabric.so.1.28.0", "aws-ofi-nccl 1.19.0", "2.14.0a0+5bcb2a8",
                     "Open MPI: 5.0.7", "/opt/amazon/efa/lib", "libnccl2\t2.30.7-1+cuda13.4",
                     "no-installer-record"):
        assert expected in out
    env = builder.env(mini_ngc)
    assert env["NCCL_NET_PLUGIN"] == "ofi" and env["NCCL_TUNER_PLUGIN"] == "ofi"
    assert env["NCCL_VERSION"] == "2.30.7" and env["CUDA_VERSION"] == "13.4.1"
    assert env["NVIDIA_PYTORCH_VERSION"] == "26.08" and env["OPENMPI_VERSION"].startswith("5.")
    labels = builder.docker.image.inspect(mini_ngc).config.labels
    assert labels["com.nvidia.nccl.version"] == "2.30.7"


def test_guide_layers_build_and_install_what_they_say(stack, builder) -> None:
    out = builder.sh(stack["user"], """
        head -n 3 /opt/amazon/efa_installed_packages
        readlink /opt/amazon/efa/lib/libfabric.so.1
        cat /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so
        dpkg-query -W libnccl-ofi-ngc-v3 libfabric1-aws
        ls /var/lib/apt/lists | grep -c _Packages || true
        ls /usr/local/lib/python3.12/dist-packages
        cat /usr/local/lib/python3.12/dist-packages/deep_ep-*.dist-info/METADATA
        test -d /opt/DeepEP/build || echo build-dir-removed
        cat /workspace/app/train.py
        test ! -e /etc/security/limits.d/efa.conf && echo no-limits-file
        /opt/amazon/openmpi/bin/ompi_info; /opt/amazon/openmpi5/bin/ompi_info
        grep -l /opt/amazon/openmpi /etc/ld.so.conf.d/* || echo no-mpi-on-loader-path
    """)
    assert out.startswith(
        "# EFA installer version: 1.50.0\n# Debug packages installed: no\n# Packages installed:\n"
    )
    for expected in ("libfabric.so.1.30.0", "aws-ofi-nccl 1.21.1 (libnccl-ofi-ngc-v3)",
                     "libnccl-ofi-ngc-v3\t1.21.1-1", "libfabric1-aws\t2.6.0amzn1.0",
                     "deep_ep-1.2.1+94a9f8f.dist-info", "Version: 1.2.1+94a9f8f",
                     "build-dir-removed", "print('train')", "no-limits-file",
                     "Open MPI: 4.1.8", "Open MPI: 5.0.8", "no-mpi-on-loader-path"):
        assert expected in out
    assert "\n0\n" in out  # the apt lists were emptied again
    env = builder.env(stack["user"])
    assert env["LD_LIBRARY_PATH"].startswith("/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:/usr/local/")
    assert env["TORCH_CUDA_ARCH_LIST"] == "10.0"
    ext = builder.sh(stack["deepep"], "cat /usr/local/lib/python3.12/dist-packages/deep_ep_cpp*.so")
    assert "TORCH_CUDA_ARCH_LIST=10.0" in ext and "DISABLE_AGGRESSIVE_PTX_INSTRS=1" in ext


def test_other_installer_version_and_commit(mini_ngc, builder) -> None:
    assert EFA_INSTALLER_VERSIONS == ("1.49.0", "1.50.0")
    efa = builder.build(mini_ngc, EFA, EFA_INSTALLER_VERSION="1.49.0")
    deepep = builder.build(efa, DEEPEP, HYBRID_EP_COMMIT=DEEPEP_COMMITS[2])
    out = builder.sh(deepep, """
        head -n 1 /opt/amazon/efa_installed_packages
        /opt/amazon/efa/bin/fi_info --version
        ls /usr/local/lib/python3.12/dist-packages
    """)
    assert "# EFA installer version: 1.49.0" in out and "libfabric: 2.5.0" in out
    assert f"deep_ep-1.2.0+{DEEPEP_COMMITS[2][:7]}.dist-info" in out


def test_apt_update_in_another_run_fails_like_the_guide_says(mini_ngc, builder) -> None:
    split = textwrap.dedent("""\
        RUN apt-get update \\
         && apt-get install -y --no-install-recommends curl ca-certificates git \\
         && rm -rf /var/lib/apt/lists/*
        RUN cd /tmp \\
         && curl -fsSL -O https://efa-installer.amazonaws.com/aws-efa-installer-1.50.0.tar.gz \\
         && tar -xf aws-efa-installer-1.50.0.tar.gz \\
         && cd aws-efa-installer \\
         && ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify
    """)
    err = builder.fails(mini_ngc, split)
    assert "E: Unable to locate package environment-modules" in err
    assert "failed to install third-party dependencies" in err


@pytest.mark.parametrize("dropped, message", [
    ("--skip-kmod", "EFA kernel module installation failed"),
    ("--no-verify", "EFA installation verification failed"),
])
def test_installer_without_container_flags_fails(mini_ngc, builder, dropped, message) -> None:
    assert message in builder.fails(mini_ngc, EFA.replace(f" {dropped}", ""))


def test_installer_without_skip_limit_conf_writes_the_limits_file(mini_ngc, builder) -> None:
    efa = builder.build(mini_ngc, EFA.replace(" --skip-limit-conf", ""))
    assert "memlock" in builder.sh(efa, "cat /etc/security/limits.d/efa.conf")


def test_unknown_versions_fail_like_the_network_would(mini_ngc, builder) -> None:
    assert "curl: (22) The requested URL returned error: 404" in builder.fails(
        mini_ngc, EFA, EFA_INSTALLER_VERSION="9.9.9"
    )
    assert "did not match any file(s) known to git" in builder.fails(
        mini_ngc, DEEPEP, HYBRID_EP_COMMIT="0123456789abcdef0123456789abcdef01234567"
    )
    assert "No matching distribution found for setuptools" in builder.fails(
        mini_ngc, DEEPEP.replace("--no-build-isolation ", "")
    )


def test_variant_layers_on_top(stack, builder) -> None:
    """The audit's bad variants are layers on the one base, as fixtures/README.md shows."""
    second_mpi = builder.build(stack["efa"], textwrap.dedent("""\
        RUN apt-get update && cd /tmp \\
         && curl -fsSL -O https://efa-installer.amazonaws.com/aws-efa-installer-1.50.0.tar.gz \\
         && tar -xf aws-efa-installer-1.50.0.tar.gz && cd aws-efa-installer \\
         && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify --mpi=openmpi4 \\
         && cd / && rm -rf /tmp/aws-efa-installer* /var/lib/apt/lists/*
    """))
    assert "Open MPI: 4.1.8" in builder.sh(second_mpi, "/opt/amazon/openmpi/bin/ompi_info")
    plain = builder.build(stack["efa"], EFA.replace(" --no-verify", " --no-verify --disable-ngc"))
    assert "libnccl-ofi\t1.21.1-1" in builder.sh(plain, "dpkg-query -W libnccl-ofi")


def test_content_digest_follows_the_sources(tmp_path: Path) -> None:
    busybox = find_busybox()
    assert is_static_elf(busybox)
    src = tmp_path / "mini-ngc"
    src.mkdir()
    (src / "Dockerfile").write_text("FROM scratch\n")
    before = content_digest(src, busybox)
    assert content_digest(src, busybox) == before
    (src / "Dockerfile").write_text("FROM scratch\n# changed\n")
    assert content_digest(src, busybox) != before
    assert (source_dir() / "mini-ngc" / "Dockerfile").is_file()


def test_the_demo_artifact_exports_like_enroot_would(stack, tmp_path: Path) -> None:
    import subprocess

    from efabuild.settings import ExportSettings
    from efabuild.export.squash import export_image

    sqsh = export_image(stack["user"], tmp_path / "user.sqsh", options=ExportSettings()).path

    def cat(path: str) -> str:
        return subprocess.run(["unsquashfs", "-cat", str(sqsh), path], capture_output=True, text=True, check=True).stdout

    environment = cat("etc/environment").splitlines()
    assert "NCCL_NET_PLUGIN=ofi" in environment and "TORCH_CUDA_ARCH_LIST=10.0" in environment
    assert [e for e in environment if e.startswith("LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:")]
    rc = cat("etc/rc")
    assert "# com.nvidia.nccl.version 2.30.7\n" in rc and 'cd "/workspace" && unset OLDPWD' in rc
    assert "    exec '/opt/nvidia/nvidia_entrypoint.sh' \"$@\"\n" in rc
    assert cat("opt/amazon/efa_installed_packages").startswith("# EFA installer version: 1.50.0\n")
    assert cat("usr/local/lib/python3.12/dist-packages/deep_ep-1.2.1+94a9f8f.dist-info/METADATA")
    assert cat("workspace/app/train.py") == "print('train')\n"


def test_build_fixtures_says_up_to_date_once_with_the_image_id(mini_ngc):
    import subprocess
    import sys

    from python_on_whales import docker

    script = Path(__file__).resolve().parents[2] / "scripts" / "build-fixtures.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).splitlines()
    image_id = docker.image.inspect(MINI_NGC_TAG).id
    assert len(lines) == 1 and lines[0].startswith(f"{MINI_NGC_TAG}: up to date in ")
    assert lines[0].endswith(f", image ID {image_id[:19]}")


def test_build_fixtures_json_is_one_efabuild_document(mini_ngc, capsys):
    """--json follows the convention every other --json does (docs/reference/json.md)."""
    import json

    from python_on_whales import docker

    from fixtures.command import main

    assert main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "efabuild.fixtures/v1"
    assert [(image["tag"], image["built"], image["image_id"]) for image in data["images"]] == [
        (MINI_NGC_TAG, False, docker.image.inspect(MINI_NGC_TAG).id)]
