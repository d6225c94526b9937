"""The provenance manifest and its in-toto/SLSA form."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from efabuild.errors import EfabuildError
from efabuild.model import BaseImage
from efabuild.provenance import manifest as manifests
from efabuild.provenance.fsview import DirView
from efabuild.provenance.intoto import PREDICATE_TYPE, STATEMENT_TYPE, to_intoto
from efabuild.provenance.probe import probe_tree
from tests.data.rootfs import mini_ngc as ngc

KEY = "3f" * 32
DIGEST = "blake3:" + "9a" * 32


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("image") / "root"
    ngc.full_image(root)
    return probe_tree(DirView(root))


def build(measured, **overrides):
    options = dict(
        key=KEY, name="ngc-efa:deepep", sqsh_digest=DIGEST, sqsh_size=25_000_000_000,
        export_options={"mksquashfs": ["-comp", "lzo", "-noD"]},
        base=BaseImage(ngc.BASE_REF, ngc.BASE_DIGEST), chain=ngc.chain_for(KEY), measured=measured,
        builder={"buildkit": "v0.13.2"},
        times={"started": datetime(2026, 11, 30, 13, 0, tzinfo=timezone(timedelta(hours=9))),
               "finished": "2026-11-30T04:20:00Z"},
    )
    options.update(overrides)
    return manifests.build_manifest(**options)


def test_same_inputs_give_the_same_bytes(measured) -> None:
    first = manifests.encode(build(measured))
    # the same facts given in another order and as a plain dict
    reordered = build(json.loads(json.dumps(measured.to_dict())),
                      export_options={"mksquashfs": ["-comp", "lzo", "-noD"]},
                      base={"digest": ngc.BASE_DIGEST, "ref": ngc.BASE_REF})
    assert manifests.encode(reordered) == first
    assert first.endswith(b"\n") and json.loads(first)["schema"] == manifests.SCHEMA


def test_manifest_content(measured) -> None:
    m = build(measured)
    assert (m["key"], m["name"]) == (KEY, "ngc-efa:deepep")
    assert m["artifact"] == {"digest": DIGEST, "size": 25_000_000_000,
                             "export": {"mksquashfs": ["-comp", "lzo", "-noD"]}}
    assert m["base"] == {"ref": ngc.BASE_REF, "digest": ngc.BASE_DIGEST}
    assert [e["layer"] for e in m["chain"]] == ["ngc-efa:efa", "ngc-efa:deepep"]
    efa = m["chain"][0]["inputs"]
    # the Dockerfile text is replaced by its digest; args and context digests stay
    assert "dockerfile" not in efa and efa["dockerfile_digest"].startswith("blake3:")
    assert efa["args"] == {"EFA_INSTALLER_VERSION": ngc.INSTALLER}
    assert m["chain"][1]["inputs"]["context"] == [["app/train.py", "644", "a1" * 32]]
    assert m["measured"]["components"]["aws-ofi-nccl"]["version"] == ngc.OFI
    assert m["builder"]["buildkit"] == "v0.13.2" and m["builder"]["efabuild"]
    # times in UTC whatever zone they came in
    assert m["times"] == {"started": "2026-11-30T04:00:00Z", "finished": "2026-11-30T04:20:00Z"}


def test_secret_looking_build_args_are_redacted(measured) -> None:
    chain = ngc.chain_for(KEY)
    chain[0]["inputs"]["args"]["GITHUB_TOKEN"] = "ghp_verysecret"
    data = manifests.encode(build(measured, chain=chain))
    assert b"ghp_verysecret" not in data
    assert json.loads(data)["chain"][0]["inputs"]["args"]["GITHUB_TOKEN"] == manifests.REDACTED


@pytest.mark.parametrize("bad", [
    {"key": "not-a-key"},
    {"sqsh_digest": "sha256:" + "0" * 64},
    {"export_options": {"ratio": 0.5}},
    {"times": {"started": datetime(2026, 1, 1)}},
])
def test_bad_inputs_are_refused(measured, bad) -> None:
    with pytest.raises(EfabuildError):
        build(measured, **bad)


def test_decode_refuses_what_is_not_a_manifest() -> None:
    with pytest.raises(EfabuildError, match="m.json: unreadable manifest"):
        manifests.decode(b"{not json", "m.json")
    with pytest.raises(EfabuildError, match="not an efabuild manifest"):
        manifests.decode(b'{"schema": "other/v9"}', "m.json")


def test_intoto_statement(measured) -> None:
    statement = to_intoto(build(measured, sqsh_sha256="5a" * 32))
    assert statement["_type"] == STATEMENT_TYPE and statement["predicateType"] == PREDICATE_TYPE
    assert statement["subject"] == [{"name": f"{KEY}.sqsh", "digest": {"blake3": "9a" * 32, "sha256": "5a" * 32}}]
    build_definition = statement["predicate"]["buildDefinition"]
    assert build_definition["externalParameters"]["graph"] == "ngc-efa"
    assert build_definition["externalParameters"]["chain"][0]["args"] == {"EFA_INSTALLER_VERSION": ngc.INSTALLER}
    deps = {d["name"]: d for d in build_definition["resolvedDependencies"]}
    assert deps["base-image"]["digest"] == {"sha256": ngc.BASE_DIGEST.split(":")[1]}
    assert deps["efa-installer"]["uri"] == f"pkg:generic/aws-efa-installer@{ngc.INSTALLER}"
    assert deps["deepep"]["digest"] == {"gitCommit": ngc.DEEPEP_COMMIT}
    assert deps["aws-ofi-nccl"]["uri"] == f"pkg:generic/aws-ofi-nccl@{ngc.OFI}"
    for dep in deps.values():  # every descriptor names something a consumer can match
        assert dep.get("uri") or dep.get("digest")
    run = statement["predicate"]["runDetails"]
    assert run["metadata"]["startedOn"] == "2026-11-30T04:00:00Z"
    assert run["builder"]["version"]["buildkit"] == "v0.13.2"


def test_intoto_leaves_unknown_components_out(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    statement = to_intoto(build(probe_tree(DirView(tmp_path / "empty")), base=None))
    assert statement["subject"][0]["digest"] == {"blake3": "9a" * 32}  # no sha256 computed: none claimed
    assert statement["predicate"]["buildDefinition"]["resolvedDependencies"] == []


def test_a_manifest_of_the_wrong_shape_is_refused_in_one_line() -> None:
    good = {"schema": manifests.SCHEMA, "key": "a" * 64, "name": "g:l", "artifact": {}, "chain": [],
            "measured": {"components": {}}}
    assert manifests.decode(json.dumps(good).encode()) == good
    for bad, field in (({"measured": 3}, "measured"), ({"chain": {}}, "chain"),
                       ({"measured": {"components": []}}, "measured.components")):
        with pytest.raises(EfabuildError, match=f"field {field} is not"):
            manifests.decode(json.dumps({**good, **bad}).encode(), "m.json")
    with pytest.raises(EfabuildError, match="not a table"):
        manifests.decode(json.dumps({**good, "measured": {"components": {"nccl": "2.30"}}}).encode())
