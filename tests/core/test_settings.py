"""BUILD.toml's settings tables: what each one gives the model, and each refusal as one line that
names BUILD.toml, the key and the problem. Parsed in this process; the CLI's one-line path is
test_workspace's and test_store_config's."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from efabuild.errors import InputError
from efabuild.settings import AuditPolicy, BuilderSettings, RegistrySettings, SignSettings
from efabuild.settings import S3Config, StoreConfig, parse_settings
from tests.kits.inprocess import run_efabuild
from tests.kits.wsfactory import make_workspace

# Enroot's own default ENROOT_SQUASH_OPTIONS (enroot.conf): lzo for portability, data blocks uncompressed
ENROOT_SQUASH_OPTIONS = ("-comp", "lzo", "-noD")


def parse(root: Path, text: str):
    return parse_settings(tomllib.loads(text), "BUILD.toml", root)


def test_no_tables_give_the_defaults(tmp_path):
    settings = parse(tmp_path, "")
    assert settings.graph_files == ("graphs/*.toml",)
    assert settings.builder == BuilderSettings(platforms=("linux/amd64",), jobs=2)
    assert settings.export.mksquashfs_options() == ENROOT_SQUASH_OPTIONS  # what Enroot itself writes
    assert settings.export.clamp_times
    assert (settings.registry, settings.sign, settings.trust_keys) == (None, None, ())
    assert settings.audit == AuditPolicy()
    assert settings.store == StoreConfig(tmp_path / "cache", source="BUILD.toml")
    assert settings.store.keep == 3  # as docs/reference/build-toml.md's [store] says


def test_a_farm_names_its_builders_as_builder_does(tmp_path):
    settings = parse(tmp_path, '[builder]\njobs = 1\nfarm = ["node-a", "ssh://b", "buildx:remote", "node-a"]\n')
    assert settings.builder == BuilderSettings(jobs=1, farm=("node-a", "ssh://b", "buildx:remote"))


def test_a_table_keeps_the_defaults_of_the_keys_it_leaves_out(tmp_path):
    settings = parse(tmp_path, '[export]\ncompression = "lzo"\n[builder]\nhost = "ssh://builder"\n'
                               '[registry]\nurl = "r.example.com"\n[store]\nshared = "fsx"\n')
    assert settings.export.mksquashfs_options() == ENROOT_SQUASH_OPTIONS and settings.export.clamp_times
    assert settings.builder == BuilderSettings(platforms=("linux/amd64",), jobs=2, host="ssh://builder")
    assert not settings.registry.insecure
    assert settings.store == StoreConfig(tmp_path / "cache", tmp_path / "fsx", source="BUILD.toml")


FULL = """
[workspace]
graphs = ["stacks/*.toml"]
[store]
local = "c"
shared = "../fsx"
keep = 5
pins = ["stack:user"]
[store.s3]
bucket = "b"
prefix = "/team/"
region = "us-west-2"
endpoint_url = "http://127.0.0.1:9000"
[builder]
platform = "linux/arm64"
jobs = 4
buildx_builder = "remote"
[registry]
url = "127.0.0.1:5000/cache/"
insecure = true
[export]
compression = "zstd"
compress_data = true
extra_options = ["-b", "1M"]
clamp_times = false
incremental = false
[audit]
host_efa_installer = "1.50.0"
min_versions = { nccl = "2.19", "aws-ofi-nccl" = "1.9.0" }
required_pins = ["base-digest", "arg:HYBRID_EP_COMMIT"]
[[audit.known_bad]]
when = "nccl>=2.19"
and = "efa-installer<1.29"
why = "hangs at init"
[sign]
key = "keys/sign.pem"
region = "us-east-1"
[trust]
keys = ["keys/pub.pem", "arn:aws:kms:us-east-1:111122223333:key/k"]
"""


def test_every_table_reaches_the_model(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    settings = parse(root, FULL)
    assert settings.graph_files == ("stacks/*.toml",)
    assert settings.store == StoreConfig(root / "c", tmp_path / "fsx",
                                         S3Config("b", "team", "us-west-2", "http://127.0.0.1:9000"), 5,
                                         ("stack:user",), "BUILD.toml")
    assert settings.builder == BuilderSettings(platforms=("linux/arm64",), jobs=4, buildx_builder="remote")
    assert settings.registry == RegistrySettings(url="127.0.0.1:5000/cache", insecure=True)
    assert settings.export.mksquashfs_options() == ("-comp", "zstd", "-b", "1M")
    assert not settings.export.clamp_times and not settings.export.incremental
    assert settings.audit == AuditPolicy(
        host_efa_installer="1.50.0", min_versions=(("aws-ofi-nccl", "1.9.0"), ("nccl", "2.19")),
        required_pins=("base-digest", "arg:HYBRID_EP_COMMIT"),
        known_bad=(("nccl", ">=2.19", "efa-installer", "<1.29", "hangs at init"),))
    assert settings.sign == SignSettings(key="keys/sign.pem", region="us-east-1")
    assert settings.trust_keys == ("keys/pub.pem", "arn:aws:kms:us-east-1:111122223333:key/k")


BAD_SETTINGS = {
    "unknown table": ("[tust]\n", "tust", "unknown key (did you mean 'trust'?)"),
    "table that is a value": ("builder = 3\n", "builder", "must be a table, not an integer"),
    "graphs not a list": ('[workspace]\ngraphs = "g/*.toml"\n', "workspace.graphs", "must be an array, not a string"),
    "unknown builder key": ("[builder]\njbos = 2\n", "builder.jbos", "unknown key (did you mean 'jobs'?)"),
    "no jobs": ("[builder]\njobs = 0\n", "builder.jobs", "must be at least 1"),
    "jobs a boolean": ("[builder]\njobs = true\n", "builder.jobs", "must be an integer, not a boolean"),
    "incremental a string": ('[export]\nincremental = "no"\n', "export.incremental", "must be a boolean, not a string"),
    "two builders": ('[builder]\ncontext = "a"\nhost = "unix:///x.sock"\n', "builder.host",
                     "set only one of context, host"),
    "farm and a host": ('[builder]\nhost = "unix:///x.sock"\nfarm = ["a"]\n', "builder.farm",
                        "set only one of host, farm"),
    "empty farm": ('[builder]\nfarm = []\n', "builder.farm", "an empty list: name the builders"),
    "farm entry that is an option": ('[builder]\nfarm = ["a", "--debug"]\n', "builder.farm",
                                     "'--debug': must be a name of letters"),
    "farm entry of an unknown scheme": ('[builder]\nfarm = ["http://b:2375"]\n', "builder.farm", "'http://b:2375'"),
    "platform without arch": ('[builder]\nplatform = "amd64"\n', "builder.platform", "must be os/arch[/variant]"),
    "registry without url": ("[registry]\ninsecure = true\n", "registry.url", "missing: the layer-cache registry"),
    "unknown compression": ('[export]\ncompression = "brotli"\n', "export.compression",
                            "unknown compression 'brotli' (one of gzip, lzo, lz4, xz, zstd, lzma)"),
    "export option that runs things": ('[export]\nextra_options = ["-p", "x"]\n', "export.extra_options",
                                       "'-p' is not allowed"),
    "unknown component": ('[audit]\nmin_versions = { "aws-ofi-ncl" = "1.19.0" }\n',
                          "audit.min_versions.aws-ofi-ncl", "unknown component 'aws-ofi-ncl' (did you mean"),
    "version that is no version": ('[audit]\nmin_versions = { nccl = "two" }\n', "audit.min_versions.nccl",
                                   "must be a version string"),
    "unknown pin": ('[audit]\nrequired_pins = ["base-digests"]\n', "audit.required_pins",
                    "unknown pin (or arg:NAME) 'base-digests' (did you mean 'base-digest'?)"),
    "arg pin that is no name": ('[audit]\nrequired_pins = ["arg:1X"]\n', "audit.required_pins",
                                "unknown pin (or arg:NAME) 'arg:1X'"),
    "known_bad without operator": ('[[audit.known_bad]]\nwhen = "nccl 2.19"\nand = "efa-installer<1.29"\n',
                                   "audit.known_bad[0].when", "must look like 'nccl>=2.19'"),
    "known_bad of no component": ('[[audit.known_bad]]\nwhen = "nccl>=2.19"\nand = "efa<1.29"\n',
                                  "audit.known_bad[0].and", "unknown component 'efa'"),
    "host installer no version": ('[audit]\nhost_efa_installer = "latest"\n', "audit.host_efa_installer",
                                  "must be a version string"),
    "sign without key": ('[sign]\nregion = "us-east-1"\n', "sign.key", "missing: a PEM private key file"),
    "trust with an empty key": ('[trust]\nkeys = ["a.pem", " "]\n', "trust.keys", "an empty entry"),
    "trust keys not a list": ('[trust]\nkeys = "a.pem"\n', "trust.keys", "must be an array, not a string"),
    "unknown store key": ('[store]\nshard = "x"\n', "store", "unknown key 'shard' (did you mean 'shared'?)"),
    "keep a boolean": ("[store]\nkeep = true\n", "store.keep", "must be a whole number ≥ 1, not True"),
    "pins not a list": ('[store]\npins = "stack:user"\n', "store.pins", "must be a list of keys"),
    "s3 without bucket": ('[store.s3]\nprefix = "p"\n', "store.s3", "missing key 'bucket'"),
    "s3 region a number": ('[store.s3]\nbucket = "b"\nregion = 1\n', "store.s3.region",
                           "must be a string, not an integer"),
    "s3 endpoint no url": ('[store.s3]\nbucket = "b"\nendpoint_url = "::::"\n', "store.s3.endpoint_url", "http"),
    "platform and platforms": ('[builder]\nplatform = "linux/amd64"\nplatforms = ["linux/arm64"]\n',
                               "builder.platforms", "set platform or platforms, not both"),
    "platforms empty": ('[builder]\nplatforms = []\n', "builder.platforms", "an empty list"),
    "platforms twice": ('[builder]\nplatforms = ["linux/arm64", "linux/arm64"]\n', "builder.platforms",
                        "names a platform twice"),
    "a platform of 5000 characters": ('[builder]\nplatforms = ["linux/' + "a" * 5000 + '"]\n', "builder.platforms",
                                     "…: must be os/arch[/variant] of at most 64 characters"),
    "platforms not a platform": ('[builder]\nplatforms = ["arm64"]\n', "builder.platforms",
                                 "must be os/arch[/variant]"),
    "emulate another platform": ('[builder]\nplatforms = ["linux/amd64"]\nemulate = ["linux/arm64"]\n',
                                 "builder.emulate", "'linux/arm64' is not one of the workspace's [builder] platforms"),
    "farm declares another platform": ('[builder]\nfarm = ["a", "buildx:b@linux/arm64"]\n', "builder.farm",
                                       "linux/arm64: not in [builder] platforms (linux/amd64)"),
}


def test_platforms_is_a_list_and_platform_a_list_of_one(tmp_path):
    several = parse(tmp_path, '[builder]\nplatforms = ["linux/amd64", "linux/arm64"]\nemulate = ["linux/arm64"]\n'
                              'farm = ["ctx-a", "buildx:b@linux/arm64", "ssh://me@gpu-host"]\n').builder
    assert several.platforms == ("linux/amd64", "linux/arm64") and several.several
    assert several.emulate == ("linux/arm64",)
    one = parse(tmp_path, '[builder]\nplatform = "linux/arm64"\n').builder
    assert one.platforms == ("linux/arm64",) and one.platform == "linux/arm64" and not one.several
    # a farm entry's @os/arch declares a platform; a host URL's user@ does not
    from efabuild.grammar import split_farm_entry
    from efabuild.make.farm import node_settings

    assert split_farm_entry("buildx:b@linux/arm64") == ("buildx:b", ("linux/arm64",))
    assert split_farm_entry("ssh://me@gpu-host") == ("ssh://me@gpu-host", ())
    assert node_settings("buildx:b@linux/arm64", several).buildx_builder == "b"


PLATFORM_GRAPH = """\
{graph_platforms}
[layers.efa]
base = "example.com/pytorch:26.08-py3"
dockerfile = "RUN true"
{efa_platforms}

[layers.user]
parent = "efa"
dockerfile = "RUN true"
artifact = true
{user_platforms}
"""
TWO_PLATFORMS = '[workspace]\ngraphs = ["graphs/*.toml"]\n[builder]\nplatforms = ["linux/amd64", "linux/arm64"]\n'


def _platform_ws(tmp_path, build=TWO_PLATFORMS, **where):
    from efabuild.workspace import load_workspace

    text = PLATFORM_GRAPH.format(**{"graph_platforms": "", "efa_platforms": "", "user_platforms": "", **where})
    return load_workspace(make_workspace(tmp_path / "ws", {"stack": text}, build=build))


def test_a_graph_or_a_layer_narrows_the_workspace_platforms(tmp_path):
    layers = _platform_ws(tmp_path).layers
    assert layers["stack:user"].platforms == ("linux/amd64", "linux/arm64")
    narrowed = _platform_ws(tmp_path / "a", user_platforms='platforms = ["linux/arm64"]').layers
    assert narrowed["stack:efa"].platforms == ("linux/amd64", "linux/arm64")
    assert narrowed["stack:user"].platforms == ("linux/arm64",)
    # a child without its own list builds on what its parent is built for
    graph = _platform_ws(tmp_path / "b", efa_platforms='platforms = ["linux/amd64"]').layers
    assert graph["stack:user"].platforms == ("linux/amd64",)
    whole = _platform_ws(tmp_path / "c", graph_platforms='platforms = ["linux/arm64"]').layers
    assert {layer.platforms for layer in whole.values()} == {("linux/arm64",)}


@pytest.mark.parametrize("where, problem, graph", [
    ("graphs/stack.toml: platforms", "'linux/s390x' is not one of the workspace's [builder] platforms",
     {"graph_platforms": 'platforms = ["linux/s390x"]'}),
    ("graphs/stack.toml: layers.user.platforms", "'linux/riscv64' is not one of the workspace's",
     {"user_platforms": 'platforms = ["linux/riscv64"]'}),
    ("graphs/stack.toml: layers.user.platforms", "linux/arm64 is not built for its parent stack:efa (linux/amd64)",
     {"efa_platforms": 'platforms = ["linux/amd64"]', "user_platforms": 'platforms = ["linux/arm64"]'}),
])
def test_a_platform_the_workspace_lacks_is_one_line_naming_file_and_key(tmp_path, where, problem, graph):
    result = run_efabuild(["-C", str(make_workspace(tmp_path / "ws", {"stack": PLATFORM_GRAPH.format(
        **{"graph_platforms": "", "efa_platforms": "", "user_platforms": "", **graph})}, build=TWO_PLATFORMS)),
        "plan", "--offline"])
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and where in result.stderr and problem in result.stderr, result.stderr


@pytest.mark.parametrize("text, where, problem", BAD_SETTINGS.values(), ids=BAD_SETTINGS.keys())
def test_bad_settings_are_one_line_naming_the_key(tmp_path, text, where, problem):
    with pytest.raises(InputError) as exc:
        parse(tmp_path, text)
    assert exc.value.where == f"BUILD.toml: {where}"
    assert problem in exc.value.problem and "\n" not in str(exc.value) and len(str(exc.value)) < 300


@pytest.mark.parametrize("extra, shown", [
    ('["-p", "/pwn f 644 0 0 sh -c \'touch {marker}\'"]', "'-p' is not allowed"),
    ('["-Xalgorithm", "lzo1x_1", "-pf", "{marker}.defs"]', "'-pf' is not allowed"),
    ('["-sort", "/etc/passwd"]', "'-sort' is not allowed"),
    ('["-root-becomes", "x"]', "'-root-becomes' is not allowed"),
    ('["-b", "-p"]', "-b '-p': not a valid value"),
    ('["-comp", "xz"]', "set `compression` instead"),
])
def test_export_options_that_are_not_filesystem_shape_are_rejected_at_load(tmp_path, extra, shown):
    """`[export] extra_options = ["-p", "/pwn f 644 0 0 sh -c '…'"]` ran a host command during make."""
    marker = tmp_path / "pwned"
    (tmp_path / "pwned.defs").write_text(f"/pwn f 644 0 0 sh -c 'touch {marker}'\n")
    build = '[workspace]\ngraphs = ["graphs/*.toml"]\n[export]\nextra_options = ' + extra.format(marker=marker) + "\n"
    root = make_workspace(tmp_path / "ws", build=build)
    for command in (["plan"], ["make", "--no-lint"]):
        proc = run_efabuild(["-C", str(root), *command])
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
        assert proc.stderr.startswith("efabuild: BUILD.toml: export.extra_options: ") and shown in proc.stderr
        assert len(proc.stderr.splitlines()) == 1
    assert not marker.exists()
