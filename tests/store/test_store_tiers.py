"""Copying between tiers never spreads a damaged copy: the source is re-verified first, and a
damaged copy is repaired from a good one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from efabuild.host.digest import file_digest
from efabuild.store.layout import ENVELOPE_SUFFIX
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import PUBLISHED, REPAIRED, REUSED
from tests.kits.storekit import collect_warnings, efabuild, key_for, make_sqsh, record_for


def flip_a_byte(path: Path, offset: int = 4096) -> None:
    """Damage one stored copy without changing its size (as a bad disk or a stray write would).
    Rewritten whole: tiers on one filesystem share the export's inode through hard links."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    damaged = path.with_name(path.name + ".damaged")
    damaged.write_bytes(data)
    os.replace(damaged, path)


def workspace(root: Path, store: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "BUILD.toml").write_text(f"[store]\n{store}\n")
    return root


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return make_sqsh(tmp_path, os.urandom(64 * 1024), "user")


def test_a_damaged_local_copy_is_not_copied_to_a_new_shared_tier(tmp_path, export, monkeypatch):
    ws = workspace(tmp_path / "ws", 'local = "cache"')
    key = key_for("user")
    record = record_for(key, "ngc-efa:user", export)
    again = tmp_path / "again.sqsh"  # the same bytes exported again (publishing links the first)
    again.write_bytes(export.read_bytes())
    Store.locate(cwd=ws, show_progress=False).publish(key, export, record, None)
    local = ws / "cache" / "objects" / key[:2] / f"{key}.sqsh"
    flip_a_byte(local)
    ws = workspace(ws, f'local = "cache"\nshared = "{tmp_path / "fsx"}"')
    store = Store.locate(cwd=ws, show_progress=False)
    warnings = collect_warnings(monkeypatch)
    assert store.complete(key) is None  # no good copy anywhere: the caller must export again
    assert any(f"local tier: {local}: corrupt artifact: digest blake3:" in w for w in warnings), warnings
    assert store.where(key) == ("local",)  # the shared tier did not get the damaged bytes
    assert not (tmp_path / "fsx" / "objects").exists()
    # publishing the export again (what make does next) replaces the damaged copy
    assert store.publish(key, again, record, None) == {"local": REPAIRED, "shared": PUBLISHED}
    assert file_digest(local) == file_digest(tmp_path / "fsx" / "objects" / key[:2] / f"{key}.sqsh") \
        == record.digest
    assert efabuild("lookup", "--verify", key, cwd=ws).returncode == 0



def test_a_manifest_that_differs_from_its_record_is_left_behind_by_a_copy(tmp_path, export, monkeypatch):
    """Slip: the sidecars are copied without their check. A manifest changed beside a good .sqsh
    would reach the new tier under a record that vouches for the old one, and the artifact's
    provenance would be shown from bytes nobody described."""
    from efabuild.host.digest import bytes_digest

    ws = workspace(tmp_path / "ws", 'local = "cache"')
    key = key_for("user")
    manifest = b'{"key": "%s"}' % key.encode()
    record = record_for(key, "ngc-efa:user", export)._replace(manifest_digest=bytes_digest(manifest))
    Store.locate(cwd=ws, show_progress=False).publish(key, export, record, manifest)
    local = ws / "cache" / "objects" / key[:2] / f"{key}.manifest.json"
    local.chmod(0o644)
    local.write_bytes(manifest.replace(b"key", b"kee"))
    ws = workspace(ws, f'local = "cache"\nshared = "{tmp_path / "fsx"}"')
    warnings = collect_warnings(monkeypatch)
    store = Store.locate(cwd=ws, show_progress=False)
    assert store.complete(key) == {"local": REUSED, "shared": PUBLISHED}
    assert any("the .manifest.json of" in w and "copying the artifact without it" in w for w in warnings), warnings
    shared = tmp_path / "fsx" / "objects" / key[:2]
    assert not (shared / f"{key}.manifest.json").exists()
    assert next(t for t in store.fs_tiers if t.name == "shared").record(key).manifest_digest is None


def test_lookup_verify_checks_every_tier_and_names_the_damaged_one(tmp_path, export):
    shared = tmp_path / "fsx"
    ws = workspace(tmp_path / "ws", f'local = "cache"\nshared = "{shared}"')
    key = key_for("user")
    Store.locate(cwd=ws, show_progress=False).publish(key, export, record_for(key, "ngc-efa:user", export))
    local = ws / "cache" / "objects" / key[:2] / f"{key}.sqsh"
    assert efabuild("lookup", "--verify", "ngc-efa:user", cwd=ws).stdout == \
        f"{shared / 'objects' / key[:2] / key}.sqsh\n"
    flip_a_byte(local)
    plain = efabuild("lookup", "ngc-efa:user", cwd=ws)
    assert plain.returncode == 0  # without --verify: no re-hash, the shared copy answers
    result = efabuild("lookup", "--verify", "ngc-efa:user", cwd=ws)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"efabuild: local tier: {local}: corrupt artifact: digest blake3:")
    assert "shared tier" not in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.s3
def test_make_completes_from_s3_when_the_shared_copy_is_damaged_and_repairs_it(
        tmp_path, export, moto_server, s3_bucket, monkeypatch):
    shared = tmp_path / "fsx"
    s3 = f'[store.s3]\nbucket = "{s3_bucket}"\nendpoint_url = "{moto_server}"\nregion = "us-east-1"'
    builder = workspace(tmp_path / "builder", f'shared = "{shared}"\n{s3}')
    key = key_for("user")
    record = record_for(key, "ngc-efa:user", export)
    Store.locate(cwd=builder, show_progress=False).publish(key, export, record, b'{"m": 1}')
    shared_copy = shared / "objects" / key[:2] / f"{key}.sqsh"
    flip_a_byte(shared_copy)
    # another workspace on the same shared tier and bucket, with an empty local tier
    other = Store.locate(cwd=workspace(tmp_path / "other", f'shared = "{shared}"\n{s3}'), show_progress=False)
    warnings = collect_warnings(monkeypatch)
    assert other.complete(key) == {"s3": REUSED, "local": PUBLISHED, "shared": REPAIRED}
    assert any(f"shared tier: {shared_copy}: corrupt artifact" in w for w in warnings), warnings
    local_copy = tmp_path / "other" / "cache" / "objects" / key[:2] / f"{key}.sqsh"
    assert file_digest(local_copy) == file_digest(shared_copy) == record.digest
    assert other.manifest(key) == b'{"m": 1}'
    assert [(tier, problem) for tier, problem in other.verify(key)] == [("shared", None), ("local", None),
                                                                         ("s3", None)]


def test_every_file_of_an_artifact_travels_with_it(tmp_path, export, monkeypatch):
    """The files beside a .sqsh are one list (transfer.SIDECARS): one more is carried and removed
    like the manifest."""
    from efabuild.store import transfer

    monkeypatch.setitem(transfer.SIDECARS, ".note.txt", None)
    shared = tmp_path / "fsx"
    key = key_for("user")
    Store.at(shared, show_progress=False).publish(key, export, record_for(key, "ngc-efa:user", export), b"{}")
    (shared / "objects" / key[:2] / f"{key}.note.txt").write_text("carried\n")
    ws = workspace(tmp_path / "ws", f'shared = "{shared}"')
    store = Store.locate(cwd=ws, show_progress=False)
    assert store.complete(key) == {"shared": REUSED, "local": PUBLISHED}
    local = ws / "cache" / "objects" / key[:2]
    assert (local / f"{key}.note.txt").read_text() == "carried\n"
    assert (local / f"{key}.manifest.json").read_bytes() == b"{}"
    store.local_tier.delete(key)
    assert list(local.iterdir()) == []


def test_metadata_comes_from_the_first_tier_that_has_it_but_a_statement_from_the_first_holder(tmp_path, export):
    """A record or manifest missing on one tier is read from the next; a signed statement only from
    the first tier holding the artifact (unsigned there means unsigned, not another tier's)."""
    from efabuild.store.tiers.fs import FilesystemTier

    key = key_for("user")
    local, shared = FilesystemTier(tmp_path / "cache", "local"), FilesystemTier(tmp_path / "fsx", "shared")
    store = Store([local, shared], show_progress=False)
    store.publish(key, export, record_for(key, "ngc-efa:user", export), b'{"m": 1}', envelope=b'{"signed": 1}\n')
    local.layout.manifest_path(key).unlink()
    local.layout.envelope_path(key).unlink()
    assert store.record(key) == local.record(key) and store.record(key).key == key
    assert store.manifest(key) == b'{"m": 1}'  # the shared tier's
    assert shared.sidecar(key, ENVELOPE_SUFFIX) == b'{"signed": 1}\n' and store.envelope(key) is None
    local.delete(key)
    assert store.envelope(key) == b'{"signed": 1}\n'  # the shared tier holds it first now
    assert Store([local], show_progress=False).record(key) is None


def test_both_tiers_implement_the_one_tier_interface_with_its_parameters_and_defaults():
    """Store, transfers and gc call tiers through `Tier`: a tier whose method takes other
    parameters, or the same ones with another default, would behave differently per tier."""
    import inspect

    from efabuild.store.tiers.base import Tier
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.tiers.s3 import S3Tier

    for tier in (FilesystemTier, S3Tier):
        assert issubclass(tier, Tier) and not tier.__abstractmethods__, tier
        for name in sorted(Tier.__abstractmethods__):
            wanted = inspect.signature(getattr(Tier, name)).parameters
            got = inspect.signature(getattr(tier, name)).parameters
            for param, spec in wanted.items():
                assert param in got, f"{tier.__name__}.{name} lacks {param}"
                assert (got[param].kind, got[param].default) == (spec.kind, spec.default), \
                    f"{tier.__name__}.{name}({param}): {got[param]} against the interface's {spec}"
            extra = [p for p in got.values() if p.name not in wanted]
            assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in extra), \
                f"{tier.__name__}.{name}: extra parameters must be optional keywords: {extra}"
