#!/usr/bin/env bash
# Install and start everything efabuild and its tests need on a fresh Debian bookworm host (as root):
#   dockerd (bookworm docker.io), the buildx plugin (trixie docker-buildx), squashfs-tools 4.6
#   (trixie: the first with tar input), squashfs-tools-ng, squashfuse and fuse3, docker-registry, graphviz,
#   librust-blake3-dev (the BLAKE3 C sources native/blake3cv.c is built against),
#   cosign (trixie), QEMU for arm64 builds (qemu-user-static, binfmt-support) with Debian's arm64
#   busybox and CPython for the arm64 fixture, and the Python package.
# Idempotent: what is installed or running already is left alone.
set -euo pipefail
log() { printf 'setup: %s\n' "$*" >&2; }
need_root() { [ "$(id -u)" = 0 ] || { log "run as root (installs Debian packages and starts dockerd)"; exit 2; }; }

add_trixie_suite() {
  # trixie is pinned low: only the packages named with -t trixie come from it.
  local src=/etc/apt/sources.list.d/efabuild-trixie.sources pin=/etc/apt/preferences.d/efabuild-trixie
  if [ ! -f "$src" ]; then
    local uri
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=http://deb.debian.org/debian
    cat >"$src" <<SRC
Types: deb
URIs: $uri
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    cat >"$pin" <<PIN
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
    APT_UPDATED=
  fi
}

APT_UPDATED=
apt_update() { [ -n "$APT_UPDATED" ] || { log "apt-get update"; apt-get update -qq; APT_UPDATED=1; }; }
apt_install() { apt_update; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }

install_packages() {
  local missing=() trixie_engine=
  # bookworm's docker.io brings containerd/runc; the engine itself is then taken from trixie:
  # docker.io 26.1 embeds BuildKit 0.13 (SOURCE_DATE_EPOCH; its exporters ignore rewrite-timestamp), bookworm's 20.10 has 0.8
  command -v dockerd >/dev/null || missing+=(docker.io)
  dockerd --version 2>/dev/null | grep -qE "version (2[6-9]|[3-9][0-9])\." || trixie_engine=1
  command -v docker-registry >/dev/null || [ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
  command -v tar2sqfs >/dev/null || missing+=(squashfs-tools-ng)
  command -v busybox >/dev/null && busybox --list 2>/dev/null | grep -qx sh && [ -x /bin/busybox ] || missing+=(busybox-static)
  command -v dot >/dev/null || missing+=(graphviz)  # efabuild graph --format svg|png, make --graph
  command -v mkfs.xfs >/dev/null || missing+=(xfsprogs)  # tests and bench: seeded fetches cloned on a loop-mounted XFS
  # tests: every exported .sqsh mounted as Pyxis's use_squashfuse=1 mounts it, and unmounted with fusermount3
  command -v squashfuse >/dev/null || missing+=(squashfuse)
  command -v fusermount3 >/dev/null || missing+=(fuse3)
  # the fixture base's CPython (fixtures/builder.py): Debian's, whatever python runs efabuild
  [ -x /usr/bin/python3.11 ] && [ -f /usr/lib/python3.11/compileall.py ] || missing+=(python3.11)
  # native/blake3cv.c (an incremental export's child hashed from its ancestor's subtrees) is built
  # against the BLAKE3 C sources in Debian's Rust crate package
  compgen -G "/usr/share/cargo/registry/blake3-*/c/blake3.c" >/dev/null || missing+=(librust-blake3-dev)
  command -v cc >/dev/null || missing+=(gcc)
  if [ ${#missing[@]} -gt 0 ]; then log "installing ${missing[*]}"; apt_install "${missing[@]}"; fi
  local trixie=()
  # name/trixie takes just that package from trixie; its dependencies stay bookworm's
  [ -z "$trixie_engine" ] || trixie+=(docker.io/trixie docker-cli/trixie)
  [ -x /usr/libexec/docker/cli-plugins/docker-buildx ] || trixie+=(docker-buildx/trixie)
  mksquashfs -help 2>&1 | grep -q -- '-tar' || trixie+=(squashfs-tools/trixie)
  # cosign 2.x: the third-party verifier the signing tests check efabuild's envelopes with
  command -v cosign >/dev/null || trixie+=(cosign/trixie)
  if [ ${#trixie[@]} -gt 0 ]; then
    add_trixie_suite; log "installing from trixie: ${trixie[*]}"; apt_install "${trixie[@]}"
  fi
}

start_dockerd() {
  if docker info >/dev/null 2>&1; then return 0; fi
  # a stale pid file from an engine that did not stop cleanly keeps dockerd from starting
  if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then rm -f /var/run/docker.pid; fi
  log "starting dockerd"
  mkdir -p /var/log
  nohup dockerd >/var/log/efabuild-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && return 0; sleep 0.5; done
  log "dockerd did not come up; see /var/log/efabuild-dockerd.log"; tail -n 20 /var/log/efabuild-dockerd.log >&2; exit 1
}

python_ready() {
  # Judged by what an installation provides, from outside the checkout (where the package
  # directory itself is not on the path): the installed distribution with every requirement
  # met, the package imported from this checkout (an editable install of a moved or deleted
  # checkout still has its metadata), and the console scripts on PATH.
  local here; here=$(cd "$(dirname "$0")/.." && pwd -P)
  (cd / && EFABUILD_CHECKOUT="$here" python3 - <<'PY'
import importlib.metadata as md, os, re, sys
import efabuild
if not os.path.realpath(efabuild.__file__).startswith(os.environ["EFABUILD_CHECKOUT"] + os.sep):
    sys.exit(1)
dist = md.distribution("efabuild")
for req in dist.requires or []:
    if "extra ==" in req and 'extra == "test"' not in req:
        continue
    md.version(re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0])
PY
  ) >/dev/null 2>&1 && command -v efabuild >/dev/null && command -v efabuild-pyxis-importer >/dev/null
}

install_python() {
  local here; here=$(cd "$(dirname "$0")/.." && pwd)
  [ -z "${FORCE_PIP:-}" ] && python_ready && return 0
  log "installing efabuild (pip install -e) into $(command -v python3)"
  python3 -m pip install -q -e "$here[test]"
  python_ready || { log "efabuild is installed but not usable from $(command -v python3); see pip's output above"; exit 1; }
}

ARM64_ROOT=/var/lib/efabuild/arm64
ARM64_PACKAGES=(busybox-static python3.11-minimal libc6 zlib1g libexpat1)

setup_qemu() {
  # linux/arm64 builds under emulation ([builder] emulate): qemu-aarch64 registered in binfmt_misc
  # with flags F (the interpreter opened once, so it runs inside containers too). Nothing
  # registers it at boot on a machine without systemd, and binfmt_misc may not be mounted.
  command -v qemu-aarch64-static >/dev/null && command -v update-binfmts >/dev/null ||
    { log "installing qemu-user-static binfmt-support"; apt_install qemu-user-static binfmt-support; }
  [ -e /proc/sys/fs/binfmt_misc/status ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  head -n 1 /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null | grep -qx enabled || update-binfmts --enable qemu-aarch64
  grep -q '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 ||
    { log "qemu-aarch64 is registered without flag F: arm64 builds cannot run it"; exit 1; }
}

unpack_arm64() {
  # the arm64 fixture's busybox and CPython: Debian's arm64 packages, unpacked, not installed
  # (busybox-static:arm64 would replace the amd64 one: same paths, not Multi-Arch: same)
  [ -f "$ARM64_ROOT/.complete" ] && return 0
  dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64; APT_UPDATED=; }
  apt_update
  local tmp; tmp=$(mktemp -d); chown _apt "$tmp" 2>/dev/null || true
  log "unpacking arm64 ${ARM64_PACKAGES[*]} into $ARM64_ROOT"
  (cd "$tmp" && apt-get download -qq "${ARM64_PACKAGES[@]/%/:arm64}")
  rm -rf "$ARM64_ROOT.new"; mkdir -p "$ARM64_ROOT.new"
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$ARM64_ROOT.new"; done
  touch "$ARM64_ROOT.new/.complete"; rm -rf "$ARM64_ROOT" "$tmp"; mv "$ARM64_ROOT.new" "$ARM64_ROOT"
}

check_arm64_runs() {
  # an arm64 image runs here: a FROM scratch image of the arm64 busybox, built and run for linux/arm64
  local tag=efabuild-fixtures/qemu-check:arm64 tmp
  if [ "$(docker run --rm --platform linux/arm64 "$tag" /bin/busybox uname -m 2>/dev/null)" = aarch64 ]; then return 0; fi
  tmp=$(mktemp -d); cp "$ARM64_ROOT/bin/busybox" "$tmp/busybox"
  printf 'FROM scratch\nCOPY busybox /bin/busybox\n' >"$tmp/Dockerfile"
  docker buildx build -q --platform linux/arm64 --load -t "$tag" "$tmp" >/dev/null; rm -rf "$tmp"
  [ "$(docker run --rm --platform linux/arm64 "$tag" /bin/busybox uname -m)" = aarch64 ] ||
    { log "an arm64 container does not run here (binfmt_misc qemu-aarch64?)"; exit 1; }
}

start_slurm() {
  # tests/scenarios/test_slurm_pyxis.py runs on a real Slurm + Pyxis + Enroot node where this machine
  # is one (configured by an admin: /etc/slurm/slurm.conf, Pyxis's spank_pyxis.so in plugstack.conf,
  # enroot on PATH); nothing is installed here, only the daemons started that are not running
  [ -f /etc/slurm/slurm.conf ] && command -v slurmctld >/dev/null && command -v enroot >/dev/null || return 0
  cat /etc/slurm/plugstack.conf /etc/slurm/plugstack.conf.d/*.conf 2>/dev/null | grep -q spank_pyxis.so || return 0
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge:munge /run/munge
    runuser -u munge -- /usr/sbin/munged || { log "munged did not start"; return 0; }
  fi
  pgrep -x slurmctld >/dev/null || slurmctld || log "slurmctld did not start"
  pgrep -x slurmd >/dev/null || slurmd || log "slurmd did not start"
  for _ in $(seq 1 20); do scontrol ping 2>/dev/null | grep -q "is UP" && return 0; sleep 0.5; done
  log "the Slurm controller does not answer: the Slurm tests will be skipped"
}

build_native() {
  local here lib=/usr/local/lib/efabuild/libblake3cv.so; here=$(cd "$(dirname "$0")/.." && pwd)
  [ -f "$lib" ] && [ "$lib" -nt "$here/native/blake3cv.c" ] && return 0
  log "building $lib"; bash "$here/scripts/build-native.sh" "$lib" >/dev/null
}

need_root
install_packages
build_native
setup_qemu
unpack_arm64
start_dockerd
check_arm64_runs
start_slurm
[ -n "${SKIP_PYTHON:-}" ] || install_python
log "ready: $(docker version --format 'engine {{.Server.Version}}' 2>/dev/null), $(docker buildx version 2>/dev/null | awk '{print "buildx", $2}'), $(mksquashfs -version 2>/dev/null | head -1)"
