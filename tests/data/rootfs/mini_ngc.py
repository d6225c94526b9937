"""Small image trees with the file layout of NGC PyTorch + the EFA installer + DeepEP.

Only the files a probe reads, with tiny contents: headers with version defines, library files
named like the real ones, dpkg status and .list files, the EFA installer's package list, a pip
dist-info. `make_sqsh` squashes a tree the way Enroot does, so tests exercise the real tools.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

NGC_RELEASE = "26.08"
NCCL = "2.30.7"
CUDA = "13.4.1"
CUDNN = "9.14.0"
CUBLAS = "13.1.0.3"
TRITON = "3.5.0"
TORCH = "2.14.0a0+3f1c0ea"
BASE_LIBFABRIC = "2.4.0"
BASE_OFI = "1.19.0"
INSTALLER = "1.50.0"
LIBFABRIC = "2.6.0"
OFI = "1.21.1"
HPCX_OMPI = "5.0.7"
DEEPEP_COMMIT = "94a9f8f6b146c07d97ec58f67cd6d303296d6098"
BASE_LD_PATH = "/usr/local/cuda/compat/lib.real:/usr/local/lib/python3.12/dist-packages/torch/lib:/usr/local/cuda/lib64"
SITE = "/usr/local/lib/python3.12/dist-packages"


def write(root: Path, path: str, content: str | bytes = b"") -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content.encode() if isinstance(content, str) else content)
    return target


def link(root: Path, path: str, target: str) -> None:
    where = root / path.lstrip("/")
    where.parent.mkdir(parents=True, exist_ok=True)
    if where.is_symlink() or where.exists():
        where.unlink()
    where.symlink_to(target)


EM_X86_64, EM_AARCH64 = 62, 183
EM = {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def fake_elf(*strings: str, machine: int = EM_X86_64) -> bytes:
    """Bytes that look enough like a shared library: an ELF64 little-endian header of `machine`
    (e_ident, e_type ET_DYN, e_machine), padding and C strings."""
    header = b"\x7fELF\x02\x01\x01" + b"\x00" * 9 + (3).to_bytes(2, "little") + machine.to_bytes(2, "little")
    return header + b"\x00" * 44 + b"".join(s.encode() + b"\x00" for s in strings) + b"\x00" * 64


def libfabric_files(root: Path, prefix: str, version: str, abi: str = "1.26.0", machine: int = EM_X86_64) -> None:
    write(root, f"{prefix}/lib/libfabric.so.1.{abi.split('.', 1)[1]}", fake_elf("libfabric", machine=machine))
    link(root, f"{prefix}/lib/libfabric.so.1", f"libfabric.so.1.{abi.split('.', 1)[1]}")
    write(root, f"{prefix}/lib/pkgconfig/libfabric.pc",
          f"prefix={prefix}\nName: libfabric\nVersion: {version}amzn1.0\n")


def ofi_plugin(root: Path, path: str, version: str, machine: int = EM_X86_64) -> None:
    write(root, path, fake_elf("NET/OFI Initializing %s", f"aws-ofi-nccl {version}", "Libfabric", machine=machine))


def dpkg_status(root: Path, packages: dict[str, str], arch: str = "amd64") -> None:
    paragraphs = [
        f"Package: {name}\nStatus: install ok installed\nArchitecture: {arch}\nVersion: {version}\n"
        "Description: test package\n long description line\n"
        for name, version in sorted(packages.items())
    ]
    write(root, "/var/lib/dpkg/status", "\n".join(paragraphs))


def base_env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/mpi/bin:/usr/local/cuda/bin:/usr/bin:/bin",
        "NVIDIA_PYTORCH_VERSION": NGC_RELEASE,
        "PYTORCH_VERSION": TORCH.split("a0")[0],
        "CUDA_VERSION": CUDA,
        "NCCL_VERSION": NCCL,
        "CUDNN_VERSION": CUDNN,
        "OPENMPI_VERSION": HPCX_OMPI,
        "NCCL_NET_PLUGIN": "ofi",
        "NCCL_TUNER_PLUGIN": "ofi",
        "LD_LIBRARY_PATH": BASE_LD_PATH,
    }


def base_labels() -> dict[str, str]:
    return {"com.nvidia.nccl.version": NCCL, "com.nvidia.cudnn.version": CUDNN, "com.nvidia.build.id": "123"}


def write_base(root: Path, machine: str = "x86_64") -> dict[str, str]:
    """The NGC PyTorch base for `machine` (x86_64 or aarch64, in its triplet's directories):
    returns its config Env."""
    em, tri = EM[machine], f"{machine}-linux-gnu"
    write(root, "/usr/include/nccl.h",
          f"#define NCCL_MAJOR {NCCL.split('.')[0]}\n#define NCCL_MINOR {NCCL.split('.')[1]}\n"
          f"#define NCCL_PATCH {NCCL.split('.')[2]}\n#define NCCL_SUFFIX \"\"\n")
    write(root, f"/usr/lib/{tri}/libnccl.so.{NCCL}", fake_elf("NCCL", machine=em))
    link(root, f"/usr/lib/{tri}/libnccl.so.2", f"libnccl.so.{NCCL}")
    link(root, f"/usr/lib/{tri}/libnccl.so", "libnccl.so.2")
    write(root, f"/usr/lib/{tri}/libnccl-net.so", fake_elf("NET/IB plugin", machine=em))
    write(root, "/usr/local/cuda-13.4/version.json",
          json.dumps({"cuda": {"name": "CUDA SDK", "version": CUDA}, "nvcc": {"version": CUDA}}))
    link(root, "/usr/local/cuda", "cuda-13.4")
    major, minor, patch = CUDNN.split(".")
    write(root, f"/usr/include/{tri}/cudnn_version.h",
          f"#define CUDNN_MAJOR {major}\n#define CUDNN_MINOR {minor}\n#define CUDNN_PATCHLEVEL {patch}\n")
    cublas = dict(zip(("MAJOR", "MINOR", "PATCH", "BUILD"), CUBLAS.split(".")))
    write(root, "/usr/local/cuda-13.4/include/cublas_api.h",
          "".join(f"#define CUBLAS_VER_{k} {v}\n" for k, v in cublas.items()))
    write(root, f"{SITE}/triton-{TRITON}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: triton\nVersion: {TRITON}\n\n")
    write(root, f"{SITE}/torch/version.py",
          f"__version__ = '{TORCH}'\ndebug = False\ncuda = '13.4'\ngit_version = '3f1c0ea'\n")
    libfabric_files(root, "/opt/amazon/efa", BASE_LIBFABRIC, "1.26.0", em)
    ofi_plugin(root, "/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so", BASE_OFI, em)
    write(root, "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    write(root, f"/etc/ld.so.conf.d/{tri}.conf", f"/usr/local/lib/{tri}\n/lib/{tri}\n/usr/lib/{tri}\n")
    write(root, "/etc/ld.so.conf.d/efa.conf", "/opt/amazon/efa/lib\n")
    write(root, "/etc/ld.so.conf.d/aws-ofi-nccl.conf", "/opt/amazon/ofi-nccl/lib\n")
    ompi_major, ompi_minor, ompi_release = HPCX_OMPI.split(".")
    write(root, "/opt/hpcx/ompi/include/mpi.h",
          f"#define OMPI_MAJOR_VERSION {ompi_major}\n#define OMPI_MINOR_VERSION {ompi_minor}\n"
          f"#define OMPI_RELEASE_VERSION {ompi_release}\n")
    write(root, "/opt/hpcx/ompi/bin/mpirun", "#!/bin/sh\n")
    link(root, "/usr/local/mpi", "/opt/hpcx/ompi")
    dpkg_status(root, {"libnccl2": f"{NCCL}-1+cuda13.4", "libc6": "2.39-0ubuntu8"}, DEB_ARCH[machine])
    return base_env()


def add_efa_installer(root: Path, env: dict[str, str], version: str = INSTALLER, libfabric: str = LIBFABRIC,
                      ofi: str = OFI, ld_path: bool = True, machine: str = "x86_64",
                      triplet_dir: bool = False) -> dict[str, str]:
    """What efa_installer.sh -y -g --skip-kmod ... leaves in an NGC image (NGC flavour of the plugin).
    `triplet_dir`: the plugin in /opt/amazon/ofi-nccl/lib/<triplet>, as newer installers lay it out."""
    em, arch = EM[machine], DEB_ARCH[machine]
    ofi_dir = f"/opt/amazon/ofi-nccl/lib/{machine}-linux-gnu" if triplet_dir else "/opt/amazon/ofi-nccl/lib"
    for stale in (root / "opt/amazon/efa/lib").glob("libfabric.so.1.*"):
        stale.unlink()
    libfabric_files(root, "/opt/amazon/efa", libfabric, "1.28.0", em)
    ofi_plugin(root, f"{ofi_dir}/libnccl-net-ofi.so", ofi, em)
    packages = [f"libfabric1-aws_{libfabric}amzn1.0_{arch}", f"libnccl-ofi-ngc-v3_{ofi}-1_{arch}",
                "efa-config_1.18-1_all", "efa-profile_1.7-1_all", f"ibverbs-providers_58.0-1_{arch}"]
    write(root, "/opt/amazon/efa_installed_packages",
          f"# EFA installer version: {version}\n# Debug packages installed: no\n# Packages installed:\n"
          + " ".join(packages) + "\n")
    status = (root / "var/lib/dpkg/status").read_text()
    dpkg_status(root, {**_packages(status), "libfabric1-aws": f"{libfabric}amzn1.0",
                       "libnccl-ofi-ngc-v3": f"{ofi}-1", "efa-config": "1.18-1"}, arch)
    write(root, "/var/lib/dpkg/info/libfabric1-aws.list",
          "/.\n/opt\n/opt/amazon/efa/lib\n/opt/amazon/efa/lib/libfabric.so.1.28.0\n")
    write(root, "/var/lib/dpkg/info/libnccl-ofi-ngc-v3.list", f"{ofi_dir}/libnccl-net-ofi.so\n")
    env = dict(env)
    if ld_path:
        env["LD_LIBRARY_PATH"] = f"{ofi_dir}:/opt/amazon/efa/lib:{env['LD_LIBRARY_PATH']}"
    return env


def add_deepep(root: Path, env: dict[str, str], commit: str = DEEPEP_COMMIT) -> dict[str, str]:
    """`git clone` + `git checkout COMMIT` + `pip install --no-build-isolation --no-deps .` of DeepEP."""
    version = f"1.1.0+{commit[:7]}"
    info = f"{SITE}/deep_ep-{version}.dist-info"
    write(root, f"{info}/METADATA", f"Metadata-Version: 2.1\nName: deep_ep\nVersion: {version}\n\n")
    write(root, f"{info}/direct_url.json", json.dumps({"dir_info": {}, "url": "file:///opt/DeepEP"}))
    write(root, "/opt/DeepEP/.git/HEAD", commit + "\n")
    write(root, f"{SITE}/deep_ep/__init__.py", "")
    return {**env, "TORCH_CUDA_ARCH_LIST": "10.0"}


def add_debian_openmpi(root: Path, version: str = "4.1.4", *, dev: bool = False, records: bool = True,
                       machine: str = "x86_64") -> None:
    """`apt-get install libopenmpi3` (with `dev`, libopenmpi-dev too) as Debian bookworm lays it out:
    libmpi.so.40 in the triplet directory, the -dev files under <triplet>/openmpi; `records`: the
    dpkg status and .list files apt leaves (without: the files unpacked alone)."""
    tri, em = f"{machine}-linux-gnu", EM[machine]
    # libmpi keeps its release for ompi_info as the real one does: "%s:version:full", "v4.1.4", "Open MPI"
    write(root, f"/usr/lib/{tri}/libmpi.so.40.30.4",
          fake_elf("ompi_cr: init", "%s:version:full", f"v{version}", "Open MPI", "%s:version:repo", machine=em))
    link(root, f"/usr/lib/{tri}/libmpi.so.40", "libmpi.so.40.30.4")
    write(root, f"/usr/lib/{tri}/openmpi/lib/openmpi3/libompi_dbg_msgq.so", fake_elf(machine=em))
    if dev:
        major, minor, release = version.split(".")
        write(root, f"/usr/lib/{tri}/openmpi/include/mpi.h",
              f"#define OMPI_MAJOR_VERSION {major}\n#define OMPI_MINOR_VERSION {minor}\n"
              f"#define OMPI_RELEASE_VERSION {release}\n")
        link(root, f"/usr/lib/{tri}/openmpi/lib/libmpi.so", "../../libmpi.so.40")
    if records:
        status = (root / "var/lib/dpkg/status").read_text() if (root / "var/lib/dpkg/status").exists() else ""
        extra = {"libopenmpi3": f"{version}-3+b1", **({"libopenmpi-dev": f"{version}-3+b1"} if dev else {})}
        dpkg_status(root, {**_packages(status), **extra}, DEB_ARCH[machine])
        write(root, f"/var/lib/dpkg/info/libopenmpi3:{DEB_ARCH[machine]}.list",
              f"/usr/lib/{tri}\n/usr/lib/{tri}/libmpi.so.40.30.4\n/usr/lib/{tri}/libmpi.so.40\n")


def add_wheel(root: Path, project: str, version: str, libs: list[str], site: str = SITE,
              record: bool = True) -> str:
    """`pip install PROJECT==VERSION` of an NVIDIA library wheel: its files under `site`, its
    dist-info with METADATA and (with `record`) a RECORD naming them. Returns the dist-info path."""
    info = f"{site}/{project.replace('-', '_')}-{version}.dist-info"
    write(root, f"{info}/METADATA", f"Metadata-Version: 2.4\nName: {project}\nVersion: {version}\n\n")
    for lib in libs:
        write(root, f"{site}/{lib}", fake_elf(project))
    if record:
        write(root, f"{info}/RECORD", "".join(f"{lib},sha256=x,1\n" for lib in libs)
              + f"{info.rsplit('/', 1)[1]}/METADATA,,\n")
    return info


def write_config(root: Path, env: dict[str, str], labels: dict[str, str] | None = None) -> None:
    """/etc/environment and /etc/rc as Enroot writes them from the image config."""
    write(root, "/etc/environment", "".join(f"{k}={v}\n" for k, v in env.items()))
    rc = "".join(f"# {k} {v}\n" for k, v in (labels or {}).items())
    write(root, "/etc/rc", rc + ("\n" if rc else "") + "cd / && unset OLDPWD || exit 1\nexec /bin/sh\n")


def full_image(root: Path, machine: str = "x86_64", **installer: object) -> dict[str, str]:
    """Base + EFA installer + DeepEP with /etc/environment and /etc/rc: the clean demo artifact."""
    env = add_deepep(root, add_efa_installer(root, write_base(root, machine), machine=machine, **installer))
    write_config(root, env, base_labels())
    return env


def make_sqsh(root: Path, out: Path) -> Path:
    subprocess.run(
        ["mksquashfs", str(root), str(out), "-all-root", "-comp", "lzo", "-noD", "-quiet", "-no-progress",
         "-noappend"],
        check=True, capture_output=True,
    )
    return out


def _packages(status: str) -> dict[str, str]:
    found = {}
    for paragraph in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in paragraph.splitlines() if ": " in line and line[0] != " ")
        if "Package" in fields:
            found[fields["Package"]] = fields["Version"]
    return found


# ---- artifacts in a real store ---------------------------------------------------------------
BASE_REF = "nvcr.io/nvidia/pytorch:26.08-py3"
BASE_DIGEST = "sha256:" + "5e" * 32


def chain_for(key: str, installer: str = INSTALLER, commit: str = DEEPEP_COMMIT,
              platform: str = "linux/amd64") -> list[dict]:
    """Declared inputs of ngc-efa:efa -> ngc-efa:deepep, as LayerInputs.to_dict() gives them."""
    efa_key = "e" * 63 + "0"
    return [
        {"layer": "ngc-efa:efa", "key": efa_key, "inputs": {
            "schema": "efabuild.layer/v1", "parent_key": None, "platform": platform,
            "base": {"ref": BASE_REF, "digest": BASE_DIGEST},
            "dockerfile": "ARG EFA_INSTALLER_VERSION\nRUN ./efa_installer.sh -y -g --skip-kmod\n",
            "args": {"EFA_INSTALLER_VERSION": installer}, "context": []}},
        {"layer": "ngc-efa:deepep", "key": key, "inputs": {
            "schema": "efabuild.layer/v1", "parent_key": efa_key, "platform": platform, "base": None,
            "dockerfile": "ARG HYBRID_EP_COMMIT\nRUN pip install --no-build-isolation --no-deps .\n",
            "args": {"HYBRID_EP_COMMIT": commit}, "context": [["app/train.py", "644", "a1" * 32]]}},
    ]


def publish(store_root: Path, tree: Path, work: Path, key: str, name: str = "ngc-efa:deepep",
            chain: list[dict] | None = None, base: dict | None = None) -> Path:
    """Squash `tree`, describe it and publish it with its manifest, as `efabuild make` does."""
    from datetime import datetime, timezone

    from efabuild.host.digest import file_digest
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.store import ArtifactRecord, Store

    work.mkdir(parents=True, exist_ok=True)
    sqsh = make_sqsh(tree, work / f"{key}.sqsh")
    digest = file_digest(sqsh)
    export = {"mksquashfs": ["-comp", "lzo", "-noD"]}
    chain = chain if chain is not None else chain_for(key)
    manifest = describe_sqsh(
        sqsh, key=key, name=name, sqsh_digest=digest, export_options=export,
        base=base if base is not None else {"ref": BASE_REF, "digest": BASE_DIGEST},
        chain=chain, builder={"buildkit": "v0.13.2"}, platform=chain[-1]["inputs"]["platform"] if chain else None,
        times={"started": datetime(2026, 11, 30, 4, 0, 0, tzinfo=timezone.utc),
               "finished": datetime(2026, 11, 30, 4, 7, 30, tzinfo=timezone.utc)},
    )
    store = Store.at(store_root, show_progress=False)
    store.publish(key, sqsh, ArtifactRecord.for_file(key, name, sqsh, digest, export=export), manifest)
    return store.lookup(key, fetch=False)


def parse_env(root: Path) -> dict[str, str]:
    """The env a tree's /etc/environment holds."""
    lines = (root / "etc/environment").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)
