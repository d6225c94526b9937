"""Hostile inputs to the incremental export: what a build can leave in its overlay2 layer
directories, and what a shared tier can hold under an ancestor's key. A child written from its
ancestor never carries other files than the full export of its image would have: when the layer
diffs cannot say the same thing, the export is a full one with the reason.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from efabuild.export.layerdiff import LayerSourceUnavailable, layer_tar, stream_layers


@pytest.mark.parametrize("kind", ["file", "whiteout"])
def test_a_builds_own_wh_name_ends_the_layer_stream_rather_than_deleting_a_file(tmp_path: Path, kind: str):
    # `RUN touch /opt/.wh.keep` is a plain file on overlay2 and in `docker export`; as a layer tar
    # entry it deletes /opt/keep; `rm /opt/.wh.keep` over it would read as an AUFS entry
    if kind == "whiteout" and os.geteuid() != 0:
        pytest.skip("overlay whiteouts (char devices 0:0) need root, as dockerd does")
    root = tmp_path / "diff"
    (root / "opt").mkdir(parents=True)
    (root / "opt" / "other").write_text("x")
    if kind == "file":
        (root / "opt" / ".wh.keep").write_text("a build's file\n")
    else:
        os.mknod(root / "opt" / ".wh.keep", 0o600 | 0o020000, os.makedev(0, 0))
    with pytest.raises(LayerSourceUnavailable, match=r"opt/\.wh\.keep: a name starting with \.wh\."):
        layer_tar(str(root), io.BytesIO())
    (stream,) = stream_layers([str(root)])
    stream.read()
    stream.close()
    # what export_incremental reads to fall back to a full export, naming the entry
    assert "opt/.wh.keep" in stream.errors_seen[0]


# ---- an ancestor copy nobody this make trusts wrote ---------------------------------------------

def _plant_ancestor(store, key: str, directory: Path, signer) -> None:  # noqa: ANN001 - a Store, a Signer
    """What whoever writes the store can do: any .sqsh and its matching record under the
    ancestor's key, signed by `signer` (None: unsigned)."""
    from efabuild.host.digest import file_digests
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.signing.attest import signed
    from efabuild.store.record import ArtifactRecord
    from tests.kits.storekit import make_sqsh

    sqsh = make_sqsh(directory, b"planted bytes " * 1000, "planted")
    blake3, sha256 = file_digests(sqsh)
    manifest = describe_sqsh(sqsh, key=key, name="stack:efa", sqsh_digest=blake3, sqsh_sha256=sha256,
                             export_options={}, base=None, chain=[], builder={}, times={})
    record = ArtifactRecord.for_file(key, "stack:efa", sqsh, blake3, sha256=sha256)
    store.publish(key, sqsh, record, manifest, envelope=signed(manifest, signer) if signer else None)


@pytest.mark.parametrize("signed_by", [None, "other", "own"])
def test_a_signing_make_builds_on_an_ancestor_copy_only_when_its_own_key_signed_it(tmp_path: Path, signed_by):
    from efabuild.make.ancestry import ancestor_copy
    from efabuild.make.prepare import prepare
    from efabuild.signing.keys import PemSigner
    from efabuild.workspace import load_workspace
    from tests.kits.signkit import make_key
    from tests.kits.wsfactory import make_workspace

    own = PemSigner(make_key(tmp_path / "own", "ec")[0])
    other = PemSigner(make_key(tmp_path / "other", "ec")[0])
    prepared = prepare(load_workspace(make_workspace(tmp_path / "ws")), use_engine=False)
    efa = prepared.plan.by_name()["stack:efa"].key
    _plant_ancestor(prepared.store, efa, tmp_path, {"own": own, "other": other}.get(signed_by))
    with ancestor_copy(prepared, "stack:user", signer=own) as (ancestor, why_not):
        if signed_by == "own":
            assert ancestor is not None and ancestor.key == efa and why_not == ""
        else:  # the child is exported whole, and the record says why
            assert ancestor is None
            assert why_not == f"ancestor {efa[:12]} has no signature by [sign]'s key over its bytes"
    with ancestor_copy(prepared, "stack:user") as (unsigned_make, _):
        assert unsigned_make is not None  # a make that signs nothing vouches for nothing: as before


def test_make_check_builds_only_on_the_very_ancestor_bytes_the_child_was_written_from(tmp_path: Path):
    from efabuild.make.ancestry import ancestor_copy
    from efabuild.make.prepare import prepare
    from efabuild.workspace import load_workspace
    from tests.kits.wsfactory import make_workspace

    prepared = prepare(load_workspace(make_workspace(tmp_path / "ws")), use_engine=False)
    efa = prepared.plan.by_name()["stack:efa"].key
    _plant_ancestor(prepared.store, efa, tmp_path, None)  # replaced, record and all, since the make
    with ancestor_copy(prepared, "stack:user", key=efa, digest="0" * 64) as (ancestor, why_not):
        assert ancestor is None
        assert why_not == f"ancestor {efa[:12]} is stored as other bytes than the child was written from"
    digest = prepared.store.record(efa).digest
    with ancestor_copy(prepared, "stack:user", key=efa, digest=digest) as (ancestor, _):
        assert ancestor is not None and ancestor.digest == digest


# ---- the engine's ancestor image: another build of the same key ----------------------------------

def _build(tag: str, dockerfile: str) -> None:
    import subprocess

    subprocess.run(["docker", "build", "--quiet", "--no-cache", "--tag", tag, "-"], input=dockerfile.encode(),
                   capture_output=True, check=True, timeout=300)


def _cat(sqsh: Path, path: str) -> str:
    import subprocess

    return subprocess.run(["unsquashfs", "-cat", str(sqsh), path], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.timeout(600)
def test_a_child_is_never_written_from_the_copy_of_another_build_of_its_ancestors_key(
        busybox_image, image_names, tmp_path: Path):
    # the ancestor's copy was exported from one build of its key (another machine, or before the
    # engine lost its image); this engine rebuilt the key and a RUN fetched other bytes
    from efabuild.engine.client import connect
    from efabuild.export.artifact import ExportRequest, export_artifact, export_record
    from efabuild.export.incremental import Ancestor
    from efabuild.make.context import SOURCE_DATE_EPOCH
    from efabuild.refs import KEY_LABEL
    from efabuild.settings import BuilderSettings, ExportSettings

    engine, options = connect(BuilderSettings()), ExportSettings(clamp_times=False)  # both: no clamp
    below, above = "a1" * 32, "c2" * 32
    ancestor_tag, child_tag = image_names("efa", below), image_names("user", above)

    def export(key: str, tag: str, out: Path, ancestor: Ancestor | None = None):  # noqa: ANN202
        request = ExportRequest(key=key, name=f"t:{key[:2]}", options=options, epoch=SOURCE_DATE_EPOCH,
                                engine=engine, tag=tag, ancestor=ancestor, no_ancestor="" if ancestor else "root")
        return export_artifact(request, out)

    def builds(fetched: str) -> None:
        _build(ancestor_tag, f"FROM {busybox_image}\nLABEL {KEY_LABEL}={below}\nRUN echo {fetched} > /fetched\n")
        _build(child_tag, f"FROM {ancestor_tag}\nLABEL {KEY_LABEL}={above}\nRUN echo app > /app\n")

    builds("monday")
    stored = export(below, ancestor_tag, tmp_path / "ancestor.sqsh")
    ancestor = Ancestor(below, ancestor_tag, stored.path, stored.digest,
                        export_record(stored, options, SOURCE_DATE_EPOCH))
    same = export(above, child_tag, tmp_path / "same.sqsh", ancestor)
    assert "ancestor" in same.incremental, same.incremental  # the build the copy came from: incremental

    builds("tuesday")  # the same key built again: other layers
    child = export(above, child_tag, tmp_path / "child.sqsh", ancestor)
    assert _cat(child.path, "fetched") == "tuesday\n"  # what a full export of this image has
    assert child.incremental == {"full": f"the engine's {ancestor_tag} is another build of its key than the one "
                                         f"the ancestor's copy was exported from"}


# ---- a layer deleting what the container's init layer puts back ----------------------------------

@pytest.mark.parametrize("case", ["opaque etc", "whiteout etc", "whiteout dev"])
def test_a_layer_deleting_what_docker_export_puts_back_is_left_to_a_full_export(tmp_path: Path, case: str):
    # `docker export` lays the container's init layer (/etc/hosts, /etc/hostname, /dev, ...) over
    # every image layer: `rm -rf /etc && mkdir /etc` in a build still exports them
    import subprocess

    from efabuild.export.enroot import ImageConfig
    from efabuild.export.squashfs import write_incremental
    from efabuild.export.tarfilter import RewritePlan
    from tests.kits.tarkit import T0, Item, full_export, tar_entries, tree_tar

    plan = RewritePlan.for_config(ImageConfig(env=("A=1",)), epoch=T0, init_layer=True)  # what docker export has
    tree = {"etc": Item("d", 0o755), "etc/passwd": Item("f", data=b"root\n", inode=1), "opt": Item("d", 0o755)}
    ancestor = full_export(tree_tar(tree), tmp_path / "ancestor.sqsh", plan)
    layer = {"opaque etc": [("etc", "d", 0o755, T0, None), ("etc/.wh..wh..opq", "f", 0o644, T0, b""),
                            ("etc/new", "f", 0o644, T0, b"n")],
             "whiteout etc": [(".wh.etc", "f", 0o644, T0, b"")],
             "whiteout dev": [(".wh.dev", "f", 0o644, T0, b"")]}[case]
    merged = {"opaque etc": {"etc": Item("d", 0o755), "etc/new": Item("f", data=b"n", inode=2), "opt": tree["opt"]},
              "whiteout etc": {"opt": tree["opt"]}, "whiteout dev": tree}[case]
    full = full_export(tree_tar(merged), tmp_path / "full.sqsh", plan)
    listed = subprocess.run(["unsquashfs", "-l", str(full)], capture_output=True, text=True, check=True).stdout
    assert "squashfs-root/etc/hosts" in listed and "squashfs-root/dev\n" in listed  # what a user gets whole
    result = write_incremental(ancestor, [io.BytesIO(tar_entries(layer))], tmp_path / "child.sqsh", plan=plan)
    assert result.full_needed and "which the container's init layer puts back" in result.reason
    assert not (tmp_path / "child.sqsh").exists()
