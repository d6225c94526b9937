"""A name's platform index in the store: published on every tier beside the name's history, read
back to pick the node's platform, refused when a store writer planted or rewrote it, kept by gc,
and absent from old stores, whose names resolve as they always did.

This machine has one architecture: "the other" node is this process with os.uname's machine
replaced (tests/kits/platformkit.py), which is all efabuild reads of the host to pick a platform.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from efabuild.errors import EfabuildError, InputError, NotFound
from efabuild.platforms import index_bytes, platform_of_machine
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.platformkit import BOTH, NAME, as_machine, index_of, publish_platforms, rewrite_index
from tests.kits.storekit import collect_warnings, key_for, make_sqsh, record_for


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store([FilesystemTier(tmp_path / "fsx", "shared"), FilesystemTier(tmp_path / "cache", "local")],
                 show_progress=False)


def test_the_machine_maps_as_enroot_maps_it():
    assert platform_of_machine("x86_64") == "linux/amd64"
    assert platform_of_machine("aarch64") == "linux/arm64"
    with pytest.raises(EfabuildError, match="EFABUILD_PLATFORM"):
        platform_of_machine("mips")


def test_an_index_on_every_tier_names_each_platforms_key_and_the_node_picks_its_own(store, tmp_path, monkeypatch):
    monkeypatch.delenv("EFABUILD_PLATFORM", raising=False)
    keys = publish_platforms(store, tmp_path)
    for root in (tmp_path / "fsx", tmp_path / "cache"):
        path, entry = index_of(root)
        assert json.loads(path.read_bytes())["platforms"] == keys
        assert entry["key"] == keys["linux/amd64"]  # a reader that knows no index gets the first platform
    as_machine(monkeypatch, "aarch64")
    assert store.resolve(NAME) == keys["linux/arm64"]
    assert store.lookup(NAME).name == keys["linux/arm64"] + ".sqsh"
    as_machine(monkeypatch, "x86_64")
    assert store.resolve(NAME) == keys["linux/amd64"]
    monkeypatch.setenv("EFABUILD_PLATFORM", "linux/arm64")
    assert store.resolve(NAME) == keys["linux/arm64"]
    assert store.resolve(f"{NAME}@linux/amd64") == keys["linux/amd64"]  # @ over the environment


def test_a_name_lacking_the_nodes_platform_is_one_line_naming_those_it_has(store, tmp_path, monkeypatch):
    monkeypatch.delenv("EFABUILD_PLATFORM", raising=False)
    publish_platforms(store, tmp_path, platforms=("linux/amd64",))
    as_machine(monkeypatch, "aarch64")
    with pytest.raises(NotFound) as raised:
        store.lookup(NAME)
    assert str(raised.value) == ("demo:train has no linux/arm64 artifact (it has linux/amd64); build it with "
                                 "[builder] platforms or set EFABUILD_PLATFORM")


def test_a_key_names_its_one_artifact_on_any_node_with_a_warning_on_another_platform(store, tmp_path, monkeypatch):
    monkeypatch.delenv("EFABUILD_PLATFORM", raising=False)
    keys = publish_platforms(store, tmp_path)
    said = collect_warnings(monkeypatch)
    as_machine(monkeypatch, "x86_64")
    assert store.lookup(keys["linux/arm64"][:12]).name == keys["linux/arm64"] + ".sqsh"
    assert said == [f"{keys['linux/arm64'][:12]} is a linux/arm64 artifact, this node is linux/amd64"]
    with pytest.raises(InputError, match="a key names one artifact"):
        store.resolve(keys["linux/arm64"] + "@linux/arm64")


def test_an_old_store_without_index_resolves_as_before_on_every_node(store, tmp_path, monkeypatch):
    sqsh = make_sqsh(tmp_path, os.urandom(20_000))
    key = key_for("old")
    store.publish(key, sqsh, record_for(key, NAME, sqsh))  # no platform in the record, no index
    said = collect_warnings(monkeypatch)
    for machine in ("x86_64", "aarch64"):
        as_machine(monkeypatch, machine)
        assert store.lookup(NAME).name == key + ".sqsh"
    assert said == []
    entry = json.loads((tmp_path / "fsx" / "refs" / "demo" / "train.json").read_text())["history"][-1]
    assert "index" not in entry


def test_gc_keeps_every_platform_the_current_index_names(store, tmp_path, monkeypatch):
    old = publish_platforms(store, tmp_path, label="v1")
    # arm64 published first: by creation time the newest of the name is amd64's
    new = publish_platforms(store, tmp_path, platforms=("linux/arm64", "linux/amd64"), label="v2")
    report = store.gc(keep=1, dry_run=False)
    gone = {removal.record.key for removal in report.removals}
    assert gone == set(old.values())
    for key in new.values():
        assert store.where(key, remote=False) == ("shared", "local")


def forged(tmp_path: Path, store: Store, data: bytes) -> None:
    for root in (tmp_path / "fsx", tmp_path / "cache"):
        rewrite_index(root, data)


def test_a_rewritten_entry_naming_another_platforms_or_names_key_is_refused(store, tmp_path, monkeypatch):
    keys = publish_platforms(store, tmp_path)
    other = publish_platforms(store, tmp_path, name="demo:other", label="o")
    monkeypatch.setenv("EFABUILD_PLATFORM", "linux/arm64")
    for planted, says in [(keys["linux/amd64"], "is for linux/amd64, not linux/arm64"),
                          (other["linux/arm64"], "names 'demo:other', not demo:train")]:
        forged(tmp_path, store, index_bytes(NAME, {**keys, "linux/arm64": planted}, "2030-01-01T00:00:00Z"))
        with pytest.raises(EfabuildError) as raised:
            store.lookup(NAME)
        assert str(raised.value) == (f"refusing demo:train@linux/arm64: its platform index names {planted[:12]}, "
                                     f"whose record {says} (a rewritten index?)")


HOSTILE = {
    "malformed JSON": (b"{not json", "not a JSON platform index"),
    "unknown platform": (json.dumps({"version": 1, "name": NAME, "created": "t",
                                     "platforms": {"Linux/AMD64;x": "a" * 64}}).encode(),
                         "platform 'Linux/AMD64;x' is not os/arch[/variant]"),
    "key not hex": (json.dumps({"version": 1, "name": NAME, "created": "t",
                                "platforms": {"linux/arm64": "../../etc/passwd"}}).encode(),
                    "the key of linux/arm64 is not 64 lowercase hex characters"),
    "another name's index": (index_bytes("demo:other", {"linux/arm64": "a" * 64}, "t"),
                             "the platform index is for demo:other, not demo:train"),
    "oversized": (b" " * (64 << 10) + b"{}", "more than such a file can be"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_index_is_one_line(store, tmp_path, monkeypatch, case):
    publish_platforms(store, tmp_path)
    data, says = HOSTILE[case]
    forged(tmp_path, store, data)
    with pytest.raises(EfabuildError) as raised:
        store.lookup(NAME)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_a_symlinked_or_swapped_index_is_never_followed(store, tmp_path, monkeypatch):
    publish_platforms(store, tmp_path)
    outside = tmp_path / "outside.json"
    for root in (tmp_path / "fsx", tmp_path / "cache"):
        path, _ = index_of(root)
        outside.write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(outside)
    with pytest.raises(EfabuildError, match="a symbolic link, not a file"):
        store.lookup(NAME)
    # an index whose bytes are not those its entry names (damaged, or rewritten in place)
    for root in (tmp_path / "fsx", tmp_path / "cache"):
        path, _ = index_of(root)
        path.unlink()
        path.write_bytes(outside.read_bytes().replace(b"linux/amd64", b"linux/amd65"))
    with pytest.raises(EfabuildError, match="its sha256 is not the .* its name's history names"):
        store.lookup(NAME)


def test_the_index_is_written_atomically_and_by_its_sha256(store, tmp_path):
    publish_platforms(store, tmp_path)
    import hashlib

    path, entry = index_of(tmp_path / "fsx")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["index"] == path.name[:-5]
    assert os.listdir(tmp_path / "fsx" / "tmp") == []  # no temp file left behind


def test_both_platforms_are_listed_for_the_set_published(store, tmp_path):
    keys = publish_platforms(store, tmp_path)
    assert {listing.record.platform for listing in store.ls(remote=False)} == set(BOTH)
    assert {listing.record.key for listing in store.ls(remote=False)} == set(keys.values())


@pytest.mark.s3
def test_a_cold_node_fetches_its_platforms_artifact_in_chunks_from_s3(tmp_path, settings, monkeypatch, s3_client):
    from tests.kits.storekit import CHUNKED

    builder = Store([FilesystemTier(tmp_path / "cache", "local")], settings, show_progress=False, s3_options=CHUNKED)
    keys = publish_platforms(builder, tmp_path / "exports")
    listed = s3_client.list_objects_v2(Bucket=settings.bucket, Prefix="images/platforms/")["Contents"]
    assert [item["Key"].rsplit("/", 1)[-1] for item in listed] == [index_of(tmp_path / "cache")[1]["index"] + ".json"]
    for machine, env, platform in [("aarch64", None, "linux/arm64"), ("x86_64", None, "linux/amd64"),
                                   ("x86_64", "linux/arm64", "linux/arm64")]:
        as_machine(monkeypatch, machine)
        if env:
            monkeypatch.setenv("EFABUILD_PLATFORM", env)
        else:
            monkeypatch.delenv("EFABUILD_PLATFORM", raising=False)
        node_root = tmp_path / f"node-{machine}-{env is not None}"
        node = Store([FilesystemTier(node_root, "shared")], settings, show_progress=False, s3_options=CHUNKED)
        path = node.lookup(NAME)
        assert path.name == keys[platform] + ".sqsh"
        assert node.s3.last_transfer.chunks > 0  # fetched through the chunk index, not as a whole object
        assert node.fs_tiers[0].has(keys[platform]) and not node.fs_tiers[0].has(keys[
            "linux/amd64" if platform == "linux/arm64" else "linux/arm64"])
        # the fetch copied the name and its index: --no-fetch on this node resolves the same
        assert node.lookup(NAME, fetch=False) == path
        assert index_of(node_root)[1]["via"] == "s3"


@pytest.mark.s3
def test_a_rewritten_s3_index_is_refused_before_a_fetch_writes_a_byte(tmp_path, settings, monkeypatch, s3_client):
    builder = Store([FilesystemTier(tmp_path / "cache", "local")], settings, show_progress=False)
    keys = publish_platforms(builder, tmp_path / "exports")
    from efabuild.platforms import index_digest

    forged = index_bytes(NAME, {**keys, "linux/arm64": keys["linux/amd64"]}, "2030-01-01T00:00:00Z")
    digest = index_digest(forged)
    s3_client.put_object(Bucket=settings.bucket, Key=f"images/platforms/{digest[:2]}/{digest}.json", Body=forged)
    entry = f"images/refs/demo/train/2030-01-01T00:00:00Z.{keys['linux/amd64']}"
    s3_client.put_object(Bucket=settings.bucket, Key=entry, Body=digest.encode())
    monkeypatch.setenv("EFABUILD_PLATFORM", "linux/arm64")
    node = Store([FilesystemTier(tmp_path / "node", "shared")], settings, show_progress=False)
    with pytest.raises(EfabuildError, match=r"refusing demo:train@linux/arm64: its platform index names .*, "
                                            r"whose record is for linux/amd64, not linux/arm64"):
        node.lookup(NAME)
    assert not (tmp_path / "node" / "objects").exists() or not any((tmp_path / "node" / "objects").rglob("*.sqsh"))


def test_one_platforms_new_artifact_moves_the_name_only_with_the_index(store, tmp_path, monkeypatch):
    """A make stores each platform's artifact, then the index: between the two (or when the make
    fails after arm64's), an amd64 node must still get amd64's artifact, not the newest one stored."""
    monkeypatch.setenv("EFABUILD_PLATFORM", "linux/amd64")
    old = publish_platforms(store, tmp_path, label="v1")
    where = tmp_path / "v2-arm64"
    where.mkdir()
    key = key_for("v2 arm64")
    sqsh = make_sqsh(where, os.urandom(20_000))
    store.publish(key, sqsh, record_for(key, NAME, sqsh)._replace(platform="linux/arm64"))
    assert store.lookup(NAME).name == old["linux/amd64"] + ".sqsh"
    assert store.resolve(f"{NAME}@linux/arm64") == old["linux/arm64"]
    store.publish_index(NAME, {"linux/amd64": old["linux/amd64"], "linux/arm64": key})
    assert store.resolve(f"{NAME}@linux/arm64") == key
    assert store.resolve(NAME) == old["linux/amd64"]


@pytest.mark.s3
@pytest.mark.parametrize("body", [b"not an index digest\n", b"a" * 4096])
def test_an_s3_history_entry_holding_no_index_digest_is_one_line(tmp_path, settings, s3_client, body):
    builder = Store([FilesystemTier(tmp_path / "cache", "local")], settings, show_progress=False)
    keys = publish_platforms(builder, tmp_path / "exports")
    entry = f"images/refs/demo/train/2030-01-01T00:00:00Z.{keys['linux/amd64']}"
    s3_client.put_object(Bucket=settings.bucket, Key=entry, Body=body)
    node = Store([FilesystemTier(tmp_path / "node", "shared")], settings, show_progress=False)
    with pytest.raises(EfabuildError) as raised:
        node.lookup(NAME)
    assert "\n" not in str(raised.value)
    assert ("names no platform index" in str(raised.value)) or ("larger than the 128 bytes" in str(raised.value))


def test_gc_keeps_every_platform_of_an_entry_it_keeps(store, tmp_path):
    """A pinned (or otherwise kept) entry's index names the other platforms of that version: a
    name set back to it must find them all."""
    old = publish_platforms(store, tmp_path, label="v1")
    publish_platforms(store, tmp_path, label="v2")
    publish_platforms(store, tmp_path, label="v3")
    report = store.gc(keep=2, pins=(old["linux/amd64"],), dry_run=True)
    assert set(old.values()) <= set(report.kept)


def test_a_warm_make_naming_a_stored_platforms_key_keeps_the_index(store, tmp_path, monkeypatch):
    """A make that finds an artifact stored names it again (Store.name): for one platform's key of
    an indexed name that must not turn the name into a plain entry of that key."""
    monkeypatch.setenv("EFABUILD_PLATFORM", "linux/amd64")
    keys = publish_platforms(store, tmp_path)
    store.name(NAME, keys["linux/arm64"])
    assert store.resolve(NAME) == keys["linux/amd64"]
    assert "index" in index_of(tmp_path / "fsx")[1]


def test_an_old_stores_name_asked_for_another_platform_says_so_by_its_manifest(store, tmp_path, monkeypatch):
    """A record from before platforms names none; its manifest does (`platform`): NAME@os/arch of
    another platform is refused, the manifest's own is handed out."""
    from efabuild.errors import NotFound

    sqsh = make_sqsh(tmp_path, os.urandom(20_000))
    key = key_for("old amd64")
    manifest = json.dumps({"key": key, "platform": "linux/amd64"}).encode()
    store.publish(key, sqsh, record_for(key, NAME, sqsh), manifest)
    monkeypatch.delenv("EFABUILD_PLATFORM", raising=False)
    assert store.lookup(f"{NAME}@linux/amd64").name == key + ".sqsh"
    with pytest.raises(NotFound, match=r"demo:train has no linux/arm64 artifact \(it has linux/amd64\)"):
        store.lookup(f"{NAME}@linux/arm64")
    as_machine(monkeypatch, "aarch64")
    assert store.lookup(NAME).name == key + ".sqsh"  # not asked for: as it always resolved


def test_diff_and_show_of_an_old_stores_name_at_another_platform_are_refused(store, tmp_path):
    sqsh = make_sqsh(tmp_path, os.urandom(20_000))
    key = key_for("old amd64, resolved")
    store.publish(key, sqsh, record_for(key, NAME, sqsh), json.dumps({"key": key, "platform": "linux/amd64"}).encode())
    assert store.resolve(f"{NAME}@linux/amd64") == key
    with pytest.raises(NotFound, match="has no linux/arm64 artifact"):
        store.resolve(f"{NAME}@linux/arm64")


def test_gc_stops_with_one_line_when_a_current_index_is_missing(store, tmp_path):
    publish_platforms(store, tmp_path)
    for root in (tmp_path / "fsx", tmp_path / "cache"):
        index_of(root)[0].unlink()
    with pytest.raises(EfabuildError) as raised:
        store.gc(keep=1, dry_run=False)
    assert "gc cannot tell what it keeps" in str(raised.value) and "\n" not in str(raised.value)
    assert len([listing for listing in store.ls(remote=False)]) == 2  # nothing deleted


def test_a_make_that_changed_no_key_leaves_the_names_index_as_it_is(store, tmp_path):
    """Every make publishes each name's index; one whose keys are those of the current index
    would differ only by its time: no new index or history entry (a no-op make wrote one per name
    on every run, and the history grew by one entry per make). A signing make still signs an
    index stored unsigned, and a changed key moves it."""
    keys = publish_platforms(store, tmp_path, label="v1")
    history = store.fs_tiers[0].names.read(NAME)
    assert store.publish_index(NAME, dict(keys)) == ""
    assert store.fs_tiers[0].names.read(NAME) == history
    signed = []
    assert store.publish_index(NAME, dict(keys), sign=lambda data: signed.append(data) or b"{}") != ""
    assert len(signed) == 1 and len(store.fs_tiers[0].names.read(NAME)) == len(history) + 1
    assert store.publish_index(NAME, dict(keys), sign=lambda data: signed.append(data) or b"{}") == ""
    assert len(signed) == 1
    newer = publish_platforms(store, tmp_path, label="v2")  # new keys: a new index
    assert store.resolve(f"{NAME}@linux/arm64") == newer["linux/arm64"]
    assert len(store.fs_tiers[0].names.read(NAME)) == len(history) + 2
