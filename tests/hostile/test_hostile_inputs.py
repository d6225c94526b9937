"""Hostile workspace files and command-line values: each is one line, exit 2, in bounded time and memory.

Every case is a small workspace (or a bare store directory) and a command. The assertion is what
a user sees: exit status 2, exactly one line on stderr that names the file (or option), the key
and the problem, and no traceback. Cases that could hang (a FIFO) or read without end (a
character device) run in a subprocess with a timeout and an address-space limit, so a regression
fails the test instead of blocking CI or meeting the OOM killer; the others call
`efabuild.cli.main` in-process, which is faster.
"""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from efabuild.cli import main
from tests.kits.wsfactory import make_workspace

BUILD = '[workspace]\ngraphs = ["graphs/*.toml"]\n'
ONE_LAYER = "[layers.a]\nbase = \"example.com/pytorch:26.08-py3\"\ndockerfile = 'RUN true'\n"
SUBPROCESS_TIMEOUT_S = 30
MEMORY_LIMIT_BYTES = 1 << 30  # far above what a one-line error needs, far below a read of /dev/zero


def with_build(extra: str) -> Callable[[Path], Path]:
    return lambda root: make_workspace(root, build=BUILD + extra)


def with_graph(text: str, build: str = BUILD) -> Callable[[Path], Path]:
    return lambda root: make_workspace(root, {"g": text}, build=build)


def layer_with(line: str) -> Callable[[Path], Path]:
    return with_graph(ONE_LAYER + line + "\n")


def symlink_loop_in_context(root: Path) -> Path:
    make_workspace(root)
    os.symlink("b", root / "app" / "a")
    os.symlink("a", root / "app" / "b")
    return root


def graph_symlinked_from_outside(root: Path) -> Path:
    make_workspace(root)
    outside = root.parent / "elsewhere.toml"
    outside.write_text(ONE_LAYER)
    os.symlink(outside, root / "graphs" / "borrowed.toml")
    return root


def graph_glob_above_the_workspace(root: Path) -> Path:
    (root.parent / "other").mkdir(parents=True)
    (root.parent / "other" / "x.toml").write_text(ONE_LAYER)
    return make_workspace(root, build='[workspace]\ngraphs = ["../other/*.toml"]\n')


def huge_graph(root: Path) -> Path:
    make_workspace(root)
    with open(root / "graphs" / "big.toml", "w") as out:
        out.write(ONE_LAYER)
        out.write(("# " + "x" * 1022 + "\n") * (5 * 1024))  # 5 MiB of comments
    return root


def graph_is_a_directory(root: Path) -> Path:
    make_workspace(root)
    (root / "graphs" / "dir.toml").mkdir()
    return root


def binary_graph(root: Path) -> Path:
    make_workspace(root)
    (root / "graphs" / "bin.toml").write_bytes(b"\x00\xff\xfe" * 100)
    return root


def dockerfile_file_is_a_fifo(root: Path) -> Path:
    make_workspace(root, {"g": "[layers.a]\nbase = \"x:1\"\ndockerfile_file = \"df\"\n"})
    os.mkfifo(root / "df")
    return root


def cycle_of(length: int) -> Callable[[Path], Path]:
    text = "".join(f"[layers.l{i}]\nparent = \"l{(i + 1) % length}\"\ndockerfile = 'RUN true'\n"
                   for i in range(length))
    return with_graph(text)


def nested(opening: str, closing: str, depth: int) -> str:
    return "x = " + opening * depth + closing * depth + "\n"


# (id, workspace builder, argv, env, expected parts of the one line)
IN_PROCESS = [
    ("toml-nested-5000-arrays", with_build(nested("[", "]", 5000)), ["plan", "--offline"], {},
     ["BUILD.toml", "invalid TOML", "nested 5000 deep"]),
    ("toml-nested-inline-tables", with_graph(ONE_LAYER + "[graph]\n" + nested("{a=", "}", 3000)),
     ["lint"], {}, ["graphs/g.toml", "invalid TOML", "nested"]),
    ("context-symlink-loop", symlink_loop_in_context, ["plan", "--offline"], {},
     ["graphs/stack.toml", "layers.user.context", "symlink loop"]),
    ("lint-cycle-3000", cycle_of(3000), ["lint"], {},
     ["graphs/g.toml", "layers.l", ".parent", "cycle", "(3000 layers)"]),
    ("graph-cycle-3000", cycle_of(3000), ["graph"], {}, ["graphs/g.toml", ".parent", "cycle"]),
    ("base-is-an-option", with_graph(ONE_LAYER.replace("example.com/pytorch:26.08-py3", "--help")),
     ["plan", "--offline"], {},
     ["graphs/g.toml", "layers.a.base", "image reference"]),
    ("base-with-newline", with_graph(ONE_LAYER.replace("example.com/pytorch:26.08-py3", "x:1\\n")),
     ["plan", "--offline"], {}, ["graphs/g.toml", "layers.a.base", "image reference"]),
    ("endpoint-url-colons", with_build("[store.s3]\nbucket = \"b\"\nendpoint_url = \"::::\"\n"),
     ["plan", "--offline"], {}, ["BUILD.toml", "store.s3.endpoint_url", "http"]),
    ("layer-name-trailing-newline", with_graph(ONE_LAYER.replace("[layers.a]", '[layers."a\\n"]')),
     ["plan", "--offline"], {}, ["graphs/g.toml", "layers.a\\n", "not a safe name"]),
    ("graph-name-trailing-newline", lambda root: make_workspace(root, {"g\n": ONE_LAYER}),
     ["plan", "--offline"], {}, ["graphs/g\\n.toml", "graph name", "not a safe name"]),
    ("arg-name-trailing-newline", layer_with('args = { "A\\n" = "1" }'), ["plan", "--offline"], {},
     ["graphs/g.toml", "layers.a.args.A\\n", "not a valid build-arg name"]),
    ("digest-trailing-newline", layer_with('digest = "sha256:' + "a" * 64 + '\\n"'), ["plan", "--offline"], {},
     ["graphs/g.toml", "layers.a.digest", "64 lowercase hex"]),
    ("glob-matches-nothing",
     lambda root: make_workspace(root, build='[workspace]\ngraphs = ["graph/*.toml"]\n'), ["plan", "--offline"], {},
     ["BUILD.toml", "workspace.graphs", "graph/*.toml", "matches no file"]),
    ("graph-symlinked-from-outside", graph_symlinked_from_outside, ["plan", "--offline"], {},
     ["BUILD.toml", "workspace.graphs", "borrowed.toml", "outside the workspace"]),
    ("graph-glob-above-workspace", graph_glob_above_the_workspace, ["plan", "--offline"], {},
     ["BUILD.toml", "workspace.graphs", "outside the workspace"]),
    ("graph-absolute-path", lambda root: make_workspace(root, build='[workspace]\ngraphs = ["/etc/*.conf"]\n'),
     ["plan", "--offline"], {}, ["BUILD.toml", "workspace.graphs", "relative to the workspace"]),
    ("graph-too-large", huge_graph, ["plan", "--offline"], {},
     ["graphs/big.toml", "too large", "at most 4 MiB"]),
    ("graph-is-a-directory", graph_is_a_directory, ["plan", "--offline"], {},
     ["graphs/dir.toml", "not a regular file (a directory)"]),
    ("graph-is-binary", binary_graph, ["plan", "--offline"], {}, ["graphs/bin.toml", "not UTF-8"]),
    ("dockerfile-file-is-a-fifo", dockerfile_file_is_a_fifo, ["plan", "--offline"], {},
     ["graphs/g.toml", "layers.a.dockerfile_file", "not a file"]),
    ("float-build-arg", layer_with("args = { EFA_INSTALLER_VERSION = 1.49 }"), ["plan", "--offline"], {},
     ["graphs/g.toml", "layers.a.args.EFA_INSTALLER_VERSION", "not a float", '"1.49"']),
    ("int-build-arg", layer_with("args = { JOBS = 8 }"), ["plan", "--offline"], {},
     ["graphs/g.toml", "layers.a.args.JOBS", "not an integer"]),
    ("date-build-arg", layer_with("args = { RELEASE = 2026-08-01 }"), ["plan", "--offline"], {},
     ["graphs/g.toml", "layers.a.args.RELEASE", "must be a string, not a date"]),
    # passed as one argument of buildx (a secret as one environment string): the kernel refuses
    # either over 128 KiB, and the build failed with 'Argument list too long: docker'
    ("build-arg-over-128-kib", layer_with(f'args = {{ NOTES = "{"x" * (128 << 10)}" }}'), ["plan", "--offline"], {},
     ["graphs/g.toml", "layers.a.args.NOTES", "over 128 KiB"]),
    ("min-versions-not-a-version", with_build('[audit]\nmin_versions = { nccl = "new" }\n'),
     ["plan", "--offline"], {}, ["BUILD.toml", "audit.min_versions.nccl", "version"]),
    ("min-versions-number", with_build("[audit]\nmin_versions = { nccl = 2.19 }\n"),
     ["plan", "--offline"], {}, ["BUILD.toml", "audit.min_versions.nccl", "version"]),
    ("host-efa-installer-not-a-version", with_build('[audit]\nhost_efa_installer = "--latest"\n'),
     ["plan", "--offline"], {}, ["BUILD.toml", "audit.host_efa_installer", "version"]),
    ("platform-is-an-option", with_build('[builder]\nplatform = "--rm"\n'), ["plan", "--offline"], {},
     ["BUILD.toml", "builder.platform", "os/arch"]),
    ("context-is-an-option", with_build('[builder]\ncontext = "--help"\n'), ["plan", "--offline"], {},
     ["BUILD.toml", "builder.context", "name"]),
    ("host-without-scheme", with_build('[builder]\nhost = "-H"\n'), ["plan", "--offline"], {},
     ["BUILD.toml", "builder.host", "unix://"]),
    ("buildx-builder-is-an-option", with_build('[builder]\nbuildx_builder = "--debug"\n'),
     ["plan", "--offline"], {}, ["BUILD.toml", "builder.buildx_builder", "name"]),
    ("builder-option-is-an-option", lambda root: make_workspace(root), ["plan", "--offline", "--builder=-H"],
     {}, ["--builder", "name"]),
    ("registry-is-an-option", with_build('[registry]\nurl = "--insecure"\n'), ["plan", "--offline"], {},
     ["BUILD.toml", "registry.url", "host[:port]"]),
    ("store-option-names-a-file", lambda root: make_workspace(root), ["lookup", "--store", "{root}/BUILD.toml",
                                                                      "0123abcd"], {},
     ["--store", "BUILD.toml", "not a directory"]),
    ("store-option-no-such-user", lambda root: make_workspace(root), ["lookup", "--store",
                                                                      "~nosuchuser-efabuild/store", "0123abcd"], {},
     ["--store", "~nosuchuser-efabuild", "no such user"]),
    ("store-env-names-a-file", lambda root: make_workspace(root), ["lookup", "0123abcd"],
     {"EFABUILD_STORE": "{root}/BUILD.toml"}, ["EFABUILD_STORE", "BUILD.toml", "not a directory"]),
]


def check_one_line(code: int, stderr: str, expected: list[str]) -> None:
    assert "Traceback" not in stderr, stderr
    assert code == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    for part in expected:
        assert part in lines[0], lines[0]


@pytest.mark.parametrize("build,argv,env,expected", [case[1:] for case in IN_PROCESS],
                         ids=[case[0] for case in IN_PROCESS])
def test_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, capsys, build, argv, env, expected):
    root = build(tmp_path / "ws")
    monkeypatch.chdir(root)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    monkeypatch.delenv("EFABUILD_STORE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(root=root))
    code = main([arg.format(root=root) for arg in argv])
    check_one_line(code, capsys.readouterr().err, expected)


@pytest.mark.parametrize("build,argv,expected", [
    ('[store.s3]\nbucket = "b"\nendpoint_url = "http://minio:hunter2@127.0.0.1:9000"\n', ["plan", "--offline"],
     ["BUILD.toml", "store.s3.endpoint_url", "credentials"]),
    ('[builder]\nhost = "ssh://me:hunter2@builder"\n', ["plan", "--offline"], ["BUILD.toml", "builder.host", "password"]),
    ("", ["plan", "--offline", "--builder", "tcp://me:hunter2@builder:2376"], ["--builder", "password"]),
    ('[builder]\nfarm = ["ssh://a", "ssh://me:hunter2@b"]\n', ["plan", "--offline"],
     ["BUILD.toml", "builder.farm", "password"]),
], ids=["s3-endpoint", "builder-host", "builder-option", "farm-entry"])
def test_credentials_in_a_url_are_refused_without_being_shown(tmp_path, monkeypatch, capsys, build, argv, expected):
    """store.toml (written into the shared store, readable by all), messages, build records and the
    docker command line (`ps`) carry these URLs: a password in one would go wherever it goes."""
    root = with_build(build)(tmp_path / "ws")
    monkeypatch.chdir(root)
    monkeypatch.delenv("EFABUILD_STORE", raising=False)
    code = main(argv)
    stderr = capsys.readouterr().err
    check_one_line(code, stderr, expected)
    assert "hunter2" not in stderr


@pytest.mark.parametrize("build,argv,expected", [
    ('[builder]\nfarm = ["ssh://a", "ssh://-oProxyCommand=touch${IFS}/tmp/pwned@b"]\n', ["plan", "--offline"],
     ["BUILD.toml", "builder.farm", "'-'"]),
    ('[builder]\nhost = "ssh://builder@-oProxyCommand=id"\n', ["plan", "--offline"], ["BUILD.toml", "builder.host", "'-'"]),
    ("", ["plan", "--offline", "--builder", "ssh://-oProxyCommand=id@b"], ["--builder", "'-'"]),
    ("", ["plan", "--offline", "--builder", "tcp://-H:2376"], ["--builder", "'-'"]),
    # docker's URL parser gives ssh these as -oProxyCommand=id: decoded, and out of the brackets
    ("", ["plan", "--offline", "--builder", "ssh://%2DoProxyCommand=id@b"], ["--builder", "'-'"]),
    ("", ["plan", "--offline", "--builder", "ssh://[-oProxyCommand=id]"], ["--builder", "'-'"]),
    ('[store.s3]\nbucket = "b"\nendpoint_url = "http://-x.example:9000"\n', ["plan", "--offline"],
     ["BUILD.toml", "store.s3.endpoint_url"]),
], ids=["farm-entry", "builder-host", "builder-option", "tcp-host", "percent-encoded", "bracketed",
        "s3-endpoint"])
def test_a_user_or_host_starting_with_a_dash_is_refused(tmp_path, monkeypatch, capsys, build, argv, expected):
    """docker's ssh helper passes the URL's user and host to ssh, which takes a word starting with '-'
    as an option (`-oProxyCommand=CMD` runs CMD): no such value gets past the settings."""
    root = with_build(build)(tmp_path / "ws")
    monkeypatch.chdir(root)
    monkeypatch.delenv("EFABUILD_STORE", raising=False)
    code = main(argv)
    check_one_line(code, capsys.readouterr().err, expected)


# --- cases that could hang or read without end: a subprocess with a timeout and a memory limit ------


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def run_bounded(root: Path, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    environment = {**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock"}
    environment.pop("EFABUILD_STORE", None)
    environment.update(env or {})
    try:
        done = subprocess.run([sys.executable, "-m", "efabuild", *argv], cwd=root, capture_output=True,
                              text=True, timeout=SUBPROCESS_TIMEOUT_S, env=environment, preexec_fn=_limits,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"efabuild {' '.join(argv)} still running after {SUBPROCESS_TIMEOUT_S}s")
    return done.returncode, done.stderr


def test_graph_glob_matching_a_fifo_does_not_hang(tmp_path):
    root = make_workspace(tmp_path / "ws")
    os.mkfifo(root / "graphs" / "zz.toml")
    code, stderr = run_bounded(root, "plan", "--offline")
    check_one_line(code, stderr, ["graphs/zz.toml", "not a regular file (a FIFO)"])


def _char_device_like_dev_zero(path: Path) -> None:
    try:
        os.mknod(path, 0o644 | stat.S_IFCHR, os.stat("/dev/zero").st_rdev)
    except PermissionError:
        pytest.skip("creating a character device needs CAP_MKNOD")


def test_graph_glob_matching_a_device_is_not_read(tmp_path):
    root = make_workspace(tmp_path / "ws")
    _char_device_like_dev_zero(root / "graphs" / "zero.toml")
    code, stderr = run_bounded(root, "plan", "--offline")
    check_one_line(code, stderr, ["graphs/zero.toml", "not a regular file (a character device)"])


def test_store_config_that_is_dev_zero_is_not_read(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    os.symlink("/dev/zero", store / "store.toml")
    code, stderr = run_bounded(tmp_path, "lookup", "--store", str(store), "0123abcd")
    # the store refuses any link it did not plant itself; what matters here: one line, never a read
    check_one_line(code, stderr, [f"{store}/store.toml", "not a", "file"])


def test_store_config_nested_deeply_is_one_line(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "store.toml").write_text(nested("[", "]", 5000))
    code, stderr = run_bounded(tmp_path, "lookup", "--store", str(store), "0123abcd")
    check_one_line(code, stderr, [f"{store}/store.toml", "invalid TOML", "nested 5000 deep"])


# --- long chains are valid input: they work, without recursion limits --------------------------------


def chain_graph(length: int, children_first: bool = False) -> str:
    head = ONE_LAYER.replace("[layers.a]", "[layers.l0]")
    tables = [f"[layers.l{i}]\nparent = \"l{i - 1}\"\ndockerfile = 'RUN true'\n" for i in range(1, length)]
    return "".join(reversed(tables)) + head if children_first else head + "".join(tables)


def test_graph_of_a_1000_deep_chain_prints_every_layer(tmp_path, monkeypatch, capsys):
    root = make_workspace(tmp_path / "ws", {"g": chain_graph(1000)})
    monkeypatch.chdir(root)
    assert main(["graph"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1000
    assert lines[0].startswith("g:l0") and lines[-1] == "  " * 999 + "g:l999"


@pytest.mark.slow
def test_lint_of_a_3000_deep_chain_runs(tmp_path, monkeypatch, capsys):
    # declared deepest layer first, so that a parent is never evaluated before its first child asks
    root = make_workspace(tmp_path / "ws", {"g": chain_graph(3000, children_first=True)})
    monkeypatch.chdir(root)
    code = main(["lint", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Traceback" not in captured.err
