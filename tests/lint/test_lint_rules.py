"""One fixture Dockerfile per rule with the mistake, one without (tests/data/lint/).

A bad fixture marks what lint must report with `# expect: RULE [text in the message]` on the
line(s) just above the offending instruction or command; the finding must point at that line.
Comment lines inside a continued RUN are dropped by BuildKit, so markers can sit inside one.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from efabuild.lint import lint_workspace
from efabuild.lint.rules import LAYER_RULES
from efabuild.workspace import load_workspace
from tests.kits.wsfactory import make_workspace

DATA = Path(__file__).resolve().parents[1] / "data" / "lint"
RULE_FIXTURES = sorted({p.name.split("-")[0] for p in DATA.glob("EFA*-*.Dockerfile")})
DIGEST = "sha256:" + "ab" * 32
MARKER = re.compile(r"^# expect: (EFA\d{3})(?: (.+))?$")

BUILD = """\
[workspace]
graphs = ["graphs/*.toml"]

[audit]
host_efa_installer = "1.50.0"
"""


def expected_findings(text: str) -> list[tuple[str, int, str | None]]:
    """(rule, line, message part) from the markers: each applies to the next non-marker line."""
    pending: list[tuple[str, str | None]] = []
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        match = MARKER.match(line.strip())
        if match:
            pending.append((match.group(1), match.group(2)))
            continue
        out.extend((rule, number, part) for rule, part in pending)
        pending = []
    return out


PLATFORM_MARKER = re.compile(r"^# platform: (\S+)$")


def lint_fixture(tmp_path: Path, fixture: str, base: str = "nvcr.io/nvidia/pytorch:26.08-py3", source: Path = DATA):
    """A first line `# platform: linux/arm64` makes it the workspace's [builder] platform."""
    graph = f"""\
[layers.layer]
base = "{base}"
digest = "{DIGEST}"
dockerfile_file = "docker/{fixture}"
"""
    marker = PLATFORM_MARKER.match((source / fixture).read_text().split("\n", 1)[0])
    build = BUILD + (f'\n[builder]\nplatform = "{marker.group(1)}"\n' if marker else "")
    root = make_workspace(tmp_path / "ws", graphs={"g": graph}, build=build, files={})
    (root / "docker").mkdir()
    shutil.copy(source / fixture, root / "docker" / fixture)
    findings = lint_workspace(load_workspace(root))
    return [f for f in findings if f.file == f"docker/{fixture}"], findings


def test_every_dockerfile_rule_has_a_fixture_pair():
    # EFA010 (base digest) and EFA018 (ARG defaults vs args) need the graph's keys: tested in test_lint.py
    assert set(RULE_FIXTURES) == set(LAYER_RULES) - {"EFA010", "EFA018"}
    for rule in RULE_FIXTURES:
        assert (DATA / f"{rule}-bad.Dockerfile").is_file()
        assert (DATA / f"{rule}-good.Dockerfile").is_file()


@pytest.mark.parametrize("rule", RULE_FIXTURES)
def test_bad_fixture_reports_its_rule_at_the_marked_line(tmp_path, rule):
    fixture = f"{rule}-bad.Dockerfile"
    expected = expected_findings((DATA / fixture).read_text())
    assert expected and all(r == rule for r, _, _ in expected), "the fixture marks its own rule"
    found, _ = lint_fixture(tmp_path, fixture)
    got = [f for f in found if f.rule == rule]
    assert sorted((f.rule, f.line) for f in got) == sorted((r, line) for r, line, _ in expected)
    for rule_id, line, part in expected:
        if part:
            assert any(f.line == line and part in f.message for f in got), (part, [f.message for f in got])
    for f in got:
        assert f.layer == "g:layer" and f.fix


@pytest.mark.parametrize("rule", RULE_FIXTURES)
def test_good_fixture_is_clean(tmp_path, rule):
    found, _ = lint_fixture(tmp_path, f"{rule}-good.Dockerfile")
    # other rules' notes (an unpinned apt-get install, EFA017) are not this rule's business
    assert [f for f in found if f.rule == rule or f.severity != "info"] == []


def test_installer_flags_named_one_by_one(tmp_path):
    found, _ = lint_fixture(tmp_path, "EFA002-bad.Dockerfile")
    messages = sorted(f.message for f in found if f.rule == "EFA002")
    assert len(messages) == 2
    assert "--no-verify" in messages[0] and "--skip-kmod" in messages[1]


def test_secret_values_never_appear_in_findings(tmp_path):
    _, findings = lint_fixture(tmp_path, "EFA013-bad.Dockerfile")
    text = repr(findings)
    assert "hf_AbCdEf" not in text and "AKIAIOSFODNN7EXAMPLE" not in text
    assert any(f.rule == "EFA013" and "HF_TOKEN" in f.message for f in findings)
    assert not any("TOKENIZERS_PARALLELISM" in f.message for f in findings)


@pytest.mark.parametrize("base", ["ubuntu:24.04", "pytorch/pytorch:2.6.0-cuda12.4-cudnn9-devel"])
def test_ngc_only_rules_stay_quiet_on_other_bases(tmp_path, base):
    # a second Open MPI and a pip torch are the NGC pitfalls; elsewhere they are ordinary choices
    found, _ = lint_fixture(tmp_path, "EFA005-bad.Dockerfile", base=base)
    assert [f for f in found if f.rule == "EFA005"] == []
    found, _ = lint_fixture(tmp_path / "b", "EFA003-bad.Dockerfile", base=base)
    assert [f for f in found if f.rule == "EFA003"] == []


def test_a_secret_build_arg_is_shown_the_way_to_a_buildkit_secret(tmp_path):
    root = make_workspace(tmp_path / "ws", graphs={"g": f"""\
[layers.layer]
base = "ubuntu:24.04"
digest = "{DIGEST}"
args = {{ HF_TOKEN = "hf_{'x' * 34}" }}
dockerfile = '''
ARG HF_TOKEN
RUN python fetch.py
'''
"""}, build=BUILD, files={})
    found = [f for f in lint_workspace(load_workspace(root)) if f.rule == "EFA013"]
    assert len(found) == 1 and "hf_x" not in repr(found)
    assert 'secrets = ["HF_TOKEN"]' in found[0].fix and "--mount=type=secret,id=HF_TOKEN" in found[0].fix


def test_credentials_in_git_urls_are_not_repeated(tmp_path):
    fixture = tmp_path / "Dockerfile"
    fixture.write_text("RUN git clone https://oauth2:ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ@github.com/o/r.git /r\n"
                       "RUN pip install git+https://user:s3cr3tpassw0rd@git.example.com/o/p.git\n")
    root = make_workspace(tmp_path / "ws", graphs={"g": f"""\
[layers.layer]
base = "ubuntu:24.04"
digest = "{DIGEST}"
dockerfile_file = "Dockerfile"
"""}, build=BUILD, files={"Dockerfile": fixture.read_text()})
    findings = lint_workspace(load_workspace(root))
    assert sorted(f.rule for f in findings) == ["EFA011", "EFA011", "EFA013", "EFA013"]
    text = repr(findings)
    assert "ghp_" not in text and "s3cr3t" not in text and "oauth2" not in text
    assert "https://***@github.com/o/r.git" in text


INSTALLER_FORMS = {
    "flags in a variable": 'ARG FLAGS="-y -g --skip-limit-conf --no-verify"\n'
                           "RUN apt-get update && ./efa_installer.sh ${FLAGS}\n",
    "shell with options": "RUN apt-get update && bash -x ./efa_installer.sh -y -g --skip-limit-conf --no-verify\n",
    "sh -c script": 'RUN apt-get update && sh -c "./efa_installer.sh -y -g --skip-limit-conf --no-verify"\n',
    "under timeout": "RUN apt-get update && timeout 1800 ./efa_installer.sh -y -g --skip-limit-conf --no-verify\n",
    "exec form": 'RUN ["/bin/bash", "-c", "apt-get update && ./efa_installer.sh -y -g --skip-limit-conf --no-verify"]\n',
    "heredoc fed to bash": "RUN bash -ex <<'SCRIPT'\napt-get update\n"
                           "./efa_installer.sh -y -g --skip-limit-conf --no-verify\nSCRIPT\n",
}


@pytest.mark.parametrize("form", sorted(INSTALLER_FORMS))
def test_the_installer_is_seen_however_it_is_run(tmp_path, form):
    """Each form lacks exactly --skip-kmod; `-y --enable-gdr` inside one word must not read as -k."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "form.Dockerfile").write_text(
        INSTALLER_FORMS[form] + "ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib\n")
    found, _ = lint_fixture(tmp_path, "form.Dockerfile", source=tmp_path / "d")
    flagged = [f.message for f in found if f.rule == "EFA002"]
    assert len(flagged) == 1 and "--skip-kmod" in flagged[0], (form, flagged)


def test_the_plugin_library_path_counts_as_ofi(tmp_path):
    """NCCL_NET_PLUGIN may name aws-ofi-nccl's library itself; audit and doctor accept it too."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "p.Dockerfile").write_text("ENV NCCL_NET_PLUGIN=/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so\n"
                                                 "ENV NCCL_TUNER_PLUGIN=ofi\n")
    found, _ = lint_fixture(tmp_path, "p.Dockerfile", source=tmp_path / "d")
    assert not [f for f in found if f.rule == "EFA006"]
    (tmp_path / "d" / "p.Dockerfile").write_text("ENV NCCL_NET_PLUGIN=/opt/other/libnccl-net.so\n")
    found, _ = lint_fixture(tmp_path / "again", "p.Dockerfile", source=tmp_path / "d")
    assert [f.rule for f in found if f.rule == "EFA006"] == ["EFA006"]


@pytest.mark.parametrize("fixture", ["EFA021-bad.Dockerfile", "EFA022-bad.Dockerfile"])
def test_platform_rules_judge_by_the_workspace_platform(tmp_path, fixture):
    """The x86_64 names of the arm64 fixtures are the platform's own on amd64; the same text with
    the machines swapped is found on amd64 (the rules are symmetric)."""
    text = (DATA / fixture).read_text().replace("# platform: linux/arm64", "# platform: linux/amd64")
    (tmp_path / "amd64").mkdir()
    (tmp_path / "amd64" / fixture).write_text(text)
    found, _ = lint_fixture(tmp_path / "a", fixture, source=tmp_path / "amd64")
    assert [f for f in found if f.rule in ("EFA021", "EFA022")] == []
    swapped = text.replace("x86_64", "aarch64").replace("amd64.Ubuntu", "arm64.Ubuntu")
    (tmp_path / "amd64" / fixture).write_text(swapped)
    found, _ = lint_fixture(tmp_path / "b", fixture, source=tmp_path / "amd64")
    rule = fixture.split("-")[0]
    assert [f.line for f in found if f.rule == rule] == [r[1] for r in expected_findings(text)]


@pytest.mark.parametrize("platform, rules", [("linux/arm64", set()), ("linux/amd64", {"EFA004", "EFA021"})])
def test_the_plugin_directory_of_the_layers_triplet_leads_the_library_path(tmp_path, platform, rules):
    text = (DATA / "EFA004-good.Dockerfile").read_text().replace(
        "ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:",
        "ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib/aarch64-linux-gnu:")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "layer.Dockerfile").write_text(f"# platform: {platform}\n{text}")
    found, _ = lint_fixture(tmp_path, "layer.Dockerfile", source=tmp_path / "src")
    assert {f.rule for f in found if f.severity != "info"} == rules


def test_a_foreign_machine_url_with_credentials_is_named_without_them(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "layer.Dockerfile").write_text(
        "# platform: linux/arm64\nRUN curl -fsSLO https://deploy:s3cr3tpass@artifacts.example/x86_64/tool.tar.gz\n")
    found, _ = lint_fixture(tmp_path, "layer.Dockerfile", source=tmp_path / "src")
    (finding,) = [f for f in found if f.rule == "EFA022"]
    assert finding.message.startswith("a URL with credentials (not shown) names x86_64")
    assert "s3cr3tpass" not in finding.message + finding.fix


@pytest.mark.slow
def test_a_library_path_of_forty_thousand_foreign_entries_is_linted_in_seconds(tmp_path):
    """EFA021 looks each entry's own-triplet twin up in the value: a list scan per entry made an
    ENV of 40,000 x86_64 entries (1.1 MB) cost 20 s of lint on arm64; each is still named."""
    value = ":".join(f"/opt/x86_64-linux-gnu/{i}" for i in range(40_000))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "layer.Dockerfile").write_text(f"# platform: linux/arm64\nENV LD_LIBRARY_PATH={value}\n")
    started = time.monotonic()
    found, _ = lint_fixture(tmp_path, "layer.Dockerfile", source=tmp_path / "src")
    assert time.monotonic() - started < 8
    named = [f for f in found if f.rule == "EFA021"]
    assert len(named) == 40_000 and any("but not /opt/aarch64-linux-gnu/39999:" in f.message for f in named)


def test_platform_rules_judge_each_of_the_layers_platforms(tmp_path):
    """Slip: the rules judged by the workspace's first platform. In a workspace of amd64 and
    arm64, an ENV naming only the x86_64 plugin directory is wrong for the arm64 build of the
    layer; narrowed to amd64, the same layer is fine."""
    dockerfile = ("ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:"
                  "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH}\n")

    def findings(root: Path, narrow: str) -> list:
        graph = (f'[layers.layer]\nbase = "nvcr.io/nvidia/pytorch:26.08-py3"\ndigest = "{DIGEST}"\n'
                 f"dockerfile = '''\n{dockerfile}'''\n{narrow}")
        build = BUILD + '\n[builder]\nplatforms = ["linux/amd64", "linux/arm64"]\n'
        ws = load_workspace(make_workspace(root, graphs={"g": graph}, build=build, files={}))
        return [f for f in lint_workspace(ws) if f.rule == "EFA021"]

    (finding,) = findings(tmp_path / "both", "")
    assert "this layer builds for linux/arm64" in finding.message
    assert findings(tmp_path / "amd64", 'platforms = ["linux/amd64"]\n') == []


def facts_for_platforms(tmp_path: Path, text: str, platforms: tuple[str, ...]):  # noqa: ANN201 - LayerFacts
    """The facts of a one-layer workspace whose layer is built for `platforms`, as a several-platform
    workspace resolves its layers' `platforms` ([builder] platforms narrowed by graph and layer)."""
    from efabuild.lint.chain import layer_facts
    from efabuild.model import Layer

    (tmp_path / "src").mkdir(parents=True)
    (tmp_path / "src" / "layer.Dockerfile").write_text(text)
    lint_fixture(tmp_path, "layer.Dockerfile", source=tmp_path / "src")
    facts = layer_facts(load_workspace(tmp_path / "ws"))["g:layer"]

    class OnPlatforms(Layer):
        __slots__ = ()

    OnPlatforms.platforms = platforms
    return facts._replace(layer=OnPlatforms(*facts.layer))


def test_torch_arch_list_is_judged_only_where_the_layer_is_arm64_alone(tmp_path):
    text = 'ENV TORCH_CUDA_ARCH_LIST="8.0;8.6"\n'
    (found,) = LAYER_RULES["EFA023"](facts_for_platforms(tmp_path, text, ("linux/arm64",)))
    assert "the GPUs of the linux/arm64 nodes" in found.message
    both = facts_for_platforms(tmp_path / "both", text, ("linux/amd64", "linux/arm64"))
    assert list(LAYER_RULES["EFA023"](both)) == []
    for value in ("10.0", "9.0a", "8.0;9.0+PTX", "8.0 10.0"):
        grace = facts_for_platforms(tmp_path / value.replace(" ", "_").replace(";", "_"),
                                    f'ENV TORCH_CUDA_ARCH_LIST="{value}"\n', ("linux/arm64",))
        assert list(LAYER_RULES["EFA023"](grace)) == [], value
