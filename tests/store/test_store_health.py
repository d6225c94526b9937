"""Chunked S3 tier health: audit, verify and lookup --verify see a missing or poisoned chunk and
name it; a publish or a make that meets one stores it again; gc reports them."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from efabuild.cli import main
from efabuild.host.digest import file_digest
from efabuild.settings import S3Config
from efabuild.store.config import store_config_text
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.tiers.s3 import S3Tier
from efabuild.store.chunked.s3 import compress
from efabuild.store.tiered import Store
from tests.data.rootfs import mini_ngc as ngc
from tests.kits.storekit import CHUNKED, collect_warnings, key_for, make_sqsh, publish, record_for

pytestmark = pytest.mark.s3
KEY = "7c" * 32
KiB, MiB = 1024, 1024 * 1024


def chunk_ids(settings: S3Config, key: str) -> list[str]:
    return list(S3Tier(settings).chunk_index(key).unique())


def chunk_key(settings: S3Config, cid: str) -> str:
    return S3Tier(settings).chunks.object(cid)


def poison(s3_client, settings: S3Config, cid: str) -> None:
    """Overwrite a chunk object with other bytes of its length, compressed as efabuild does: a
    valid zstd frame of the right size that does not hash to its id."""
    body = s3_client.get_object(Bucket=settings.bucket, Key=chunk_key(settings, cid))["Body"].read()
    import zstandard

    raw = zstandard.ZstdDecompressor().decompress(body)
    s3_client.put_object(Bucket=settings.bucket, Key=chunk_key(settings, cid),
                         Body=compress(random.Random(1).randbytes(len(raw))))


def fetch_anew(tmp_path: Path, settings: S3Config, key: str, **options) -> Path:
    """The artifact fetched by a node that holds nothing (no seeds): every chunk from S3."""
    node = Store([FilesystemTier(tmp_path / f"node-{os.urandom(4).hex()}", "shared")], settings,
                 show_progress=False, s3_options=options)
    return node.lookup(key)


# ---- audit, verify, lookup --verify -----------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path, settings: S3Config) -> Path:
    """A bare store holding one auditable artifact, copied to a chunked S3 tier."""
    root = tmp_path / "clean"
    ngc.full_image(root)
    ngc.publish(tmp_path / "store", root, tmp_path / "work", KEY)
    (tmp_path / "store" / "store.toml").write_text(store_config_text(settings))
    assert Store.at(tmp_path / "store", show_progress=False).complete(KEY) == {"store": "reused", "s3": "published"}
    return tmp_path / "store"


@pytest.fixture
def trust(tmp_path: Path, monkeypatch) -> None:
    """A node trust policy, which verify needs (the artifact itself is unsigned: its filesystem
    rows fail for that; these tests read the S3 rows)."""
    from efabuild.signing.trust import TRUST_CONFIG_ENV
    from tests.kits.signkit import make_key, trust_config

    _, public = make_key(tmp_path / "keys", "ed25519")
    monkeypatch.setenv(TRUST_CONFIG_ENV, str(trust_config(tmp_path / "trust.toml", public)))


def s3_rows(capsys, *argv: str) -> list[dict]:
    main(["verify", *argv, "--json"])
    return [r for r in json.loads(capsys.readouterr().out)["results"] if r["tier"] == "s3"]


def audit_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["audit", *argv, "--host-efa", "1.50.0", "--json"])
    report = json.loads(capsys.readouterr().out)["artifacts"]
    return code, {c["check"]: c for c in report[0]["checks"]}


def test_audit_all_passes_on_an_intact_chunked_store_and_names_artifact_and_chunk_on_a_damaged_one(
        store: Path, settings: S3Config, s3_client, capsys) -> None:
    code, checks = audit_json(capsys, "--all", "--store", str(store))
    assert code == 0, checks
    assert checks["sqsh-integrity"]["message"].endswith("as recorded, on store, s3")
    first, *_ = chunk_ids(settings, KEY)
    s3_client.delete_object(Bucket=settings.bucket, Key=chunk_key(settings, first))
    code, checks = audit_json(capsys, "--all", "--store", str(store))
    message = checks["sqsh-integrity"]["message"]
    assert code == 1 and checks["sqsh-integrity"]["status"] == "FAIL"
    assert message.startswith(f"s3 tier: {KEY[:12]} (ngc-efa:deepep): chunk {first}: ") and "missing" in message
    assert "store tier" not in message  # the filesystem copy is fine


def test_a_poisoned_chunk_fails_audit_verify_and_lookup_verify_naming_it(store: Path, settings: S3Config,
                                                                         s3_client, capsys, trust) -> None:
    first, *_ = chunk_ids(settings, KEY)
    poison(s3_client, settings, first)
    code, checks = audit_json(capsys, KEY[:12], "--store", str(store))
    assert code == 1 and f"chunk {first}: " in checks["sqsh-integrity"]["message"]
    assert checks["sqsh-integrity"]["message"].endswith("corrupt: its bytes do not hash to its name")
    s3 = s3_rows(capsys, "--all", "--store", str(store))
    assert [r["key"] for r in s3] == [KEY] and f"chunk {first}: " in s3[0]["problems"][0]
    assert main(["lookup", "--verify", "--store", str(store), KEY[:12]]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and f"chunk {first}: " in captured.err and len(captured.err.splitlines()) == 1
    assert main(["lookup", "--store", str(store), KEY[:12]]) == 0  # a plain lookup: the node's copy is good
    capsys.readouterr()


def test_a_poisoned_chunk_the_index_never_noted_is_found_by_the_deep_check_only(
        store: Path, settings: S3Config, s3_client, capsys, trust) -> None:
    """An index from before the ETags were noted, or a chunk planted before a publish that did
    not read it: the quick check sees a chunk there, --deep reads it."""
    tier = S3Tier(settings)
    path = tier.index_object(KEY)
    doc = json.loads(s3_client.get_object(Bucket=settings.bucket, Key=path)["Body"].read())
    del doc["etags"]
    s3_client.put_object(Bucket=settings.bucket, Key=path, Body=json.dumps(doc).encode())
    first, *_ = chunk_ids(settings, KEY)
    poison(s3_client, settings, first)
    assert audit_json(capsys, KEY[:12], "--store", str(store))[0] == 0
    code, checks = audit_json(capsys, KEY[:12], "--store", str(store), "--deep")
    assert code == 1 and f"chunk {first}: " in checks["sqsh-integrity"]["message"]
    assert s3_rows(capsys, "--store", str(store), KEY[:12]) == [
        {"key": KEY, "name": "ngc-efa:deepep", "tier": "s3", "problems": []}]
    (row,) = s3_rows(capsys, "--deep", "--store", str(store), KEY[:12])
    assert len(row["problems"]) == 1 and f"chunk {first}: " in row["problems"][0]
    assert main(["lookup", "--verify", "--deep", "--store", str(store), KEY[:12]]) == 1
    assert f"chunk {first}: " in capsys.readouterr().err


def test_a_whole_object_artifact_is_checked_by_its_size_and_with_deep_its_bytes(
        tmp_path: Path, settings: S3Config, s3_client) -> None:
    sqsh = make_sqsh(tmp_path, os.urandom(256 * KiB), "whole")
    store = Store([FilesystemTier(tmp_path / "cache", "local")], settings, show_progress=False,
                  s3_options={"chunked": False})
    key = publish(store, sqsh)
    assert store.verify(key, deep=True) == [("local", None), ("s3", None)]
    path = store.s3.sqsh_object(key)
    head = s3_client.head_object(Bucket=settings.bucket, Key=path)
    data = bytearray(sqsh.read_bytes())
    data[1000] ^= 0xFF  # same size, same digest stored with it: only reading it tells
    s3_client.put_object(Bucket=settings.bucket, Key=path, Body=bytes(data), Metadata=head["Metadata"])
    assert store.verify(key) == [("local", None), ("s3", None)]
    (_, problem), = [item for item in store.verify(key, deep=True) if item[0] == "s3"]
    assert f"{store.s3.url(path)} holds bytes of digest blake3:" in str(problem)
    s3_client.put_object(Bucket=settings.bucket, Key=path, Body=bytes(data[:-1]), Metadata=head["Metadata"])
    (_, problem), = [item for item in store.verify(key) if item[0] == "s3"]
    assert f"is {len(data) - 1} bytes, its record says {len(data)}" in str(problem)


# ---- publish and make repair what they meet ---------------------------------------------------
@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    return make_sqsh(tmp_path_factory.mktemp("image"), random.Random(5).randbytes(2 * MiB), "v1")


def builder(base: Path, settings: S3Config) -> Store:
    return Store([FilesystemTier(base / "cache", "local")], settings, show_progress=False, s3_options=CHUNKED)


def test_a_chunk_planted_before_the_publish_that_needs_it_is_stored_again(tmp_path, settings, image, s3_client,
                                                                          monkeypatch) -> None:
    from efabuild.chunks.cdc import chunk_file

    ids = list(chunk_file(image, chunking=CHUNKED["chunking"]).unique())
    planted = ids[len(ids) // 2]
    tier = S3Tier(settings)
    s3_client.put_object(Bucket=settings.bucket, Key=tier.chunks.object(planted),
                         Body=compress(b"\0" * 64 * KiB))  # a co-tenant's junk under a future id
    warnings = collect_warnings(monkeypatch)
    key = publish(builder(tmp_path, settings), image)
    assert any(w.startswith(f"{tier.chunks.tier.url(tier.chunks.object(planted))}: ") and w.endswith("; storing it again")
               for w in warnings), warnings
    assert file_digest(fetch_anew(tmp_path, settings, key, **CHUNKED)) == file_digest(image)


@pytest.mark.parametrize("damage", ["delete", "poison"])
def test_a_warm_make_repairs_a_missing_or_poisoned_chunk_from_the_local_copy(tmp_path, s3_bucket, image, s3_client,
                                                                            monkeypatch, damage, fault_proxy) -> None:
    settings = S3Config(bucket=s3_bucket, prefix="images/", region="us-east-1", endpoint_url=fault_proxy.endpoint)
    key = publish(builder(tmp_path, settings), image)
    victim = chunk_ids(settings, key)[1]
    if damage == "delete":
        s3_client.delete_object(Bucket=settings.bucket, Key=chunk_key(settings, victim))
    else:
        poison(s3_client, settings, victim)
    with pytest.raises(Exception, match=victim):
        fetch_anew(tmp_path, settings, key, **CHUNKED)
    store = builder(tmp_path, settings)  # the next make's store, as its plan asks it
    warnings = collect_warnings(monkeypatch)
    assert store.where(key, checked=True) == ("local",)  # S3's copy is not counted as held
    assert any(f"chunk {victim}: " in w for w in warnings), warnings
    before = len(fault_proxy.requests)
    assert store.complete(key) == {"local": "reused", "s3": "repaired"}
    # only the chunk is stored again, and the index noting its ETag: the record and the rest stand
    changed = sorted({(method, path.split("?")[0].split("/", 2)[2]) for method, path, _ in fault_proxy.requests[before:]
                      if method in ("PUT", "POST", "DELETE")})
    assert changed == [("PUT", chunk_key(settings, victim)), ("PUT", store.s3.index_object(key))]
    assert file_digest(fetch_anew(tmp_path, settings, key, **CHUNKED)) == file_digest(image)
    assert builder(tmp_path, settings).where(key, checked=True) == ("local", "s3")  # and no read the next time


def test_the_check_of_an_intact_artifact_reads_no_chunk(tmp_path, s3_bucket, image, fault_proxy) -> None:
    """What a warm make's plan asks S3 of an intact chunked artifact, counted at a proxy: its
    record and index, one LIST per first hex digit of its chunk ids (or a HEAD each when few),
    never a chunk's bytes."""
    settings = S3Config(bucket=s3_bucket, prefix="images/", region="us-east-1", endpoint_url=fault_proxy.endpoint)
    key = publish(builder(tmp_path, settings), image)
    chunks = len(S3Tier(settings).chunk_index(key).unique())
    before = len(fault_proxy.requests)
    assert builder(tmp_path, settings).where(key, checked=True) == ("local", "s3")
    asked = [(method, path.split("?")[0]) for method, path, _ in fault_proxy.requests[before:]]
    assert not [request for request in asked if request[0] == "GET" and "/chunks/" in request[1]], asked
    looks = [request for request in asked if "/chunks/" in request[1] or request[1].endswith(f"/{s3_bucket}")]
    assert 0 < len(looks) <= min(chunks, 16 + 7 * 16)  # a LIST per digit, or a HEAD each under LIST_FROM
    assert sorted(path.rsplit("/", 1)[-1] for method, path in asked if key in path) == [
        f"{key}.chunks.json", f"{key}.json", f"{key}.json"]  # the record's HEAD and GET, the index


def test_a_make_that_meets_a_poisoned_chunk_the_quick_check_missed_stores_it_again(tmp_path, settings, image,
                                                                                     s3_client, monkeypatch) -> None:
    """A chunk planted under the ETag the index noted (as if before the publish that reused it):
    a make on a builder holding nothing copies from S3, meets it, reads every chunk, and the
    export it falls back to stores that chunk again."""
    key = publish(builder(tmp_path / "first", settings), image)
    victim = chunk_ids(settings, key)[1]
    poison(s3_client, settings, victim)
    tier = S3Tier(settings)
    path = tier.index_object(key)
    doc = json.loads(s3_client.get_object(Bucket=settings.bucket, Key=path)["Body"].read())
    doc["etags"][victim] = s3_client.head_object(Bucket=settings.bucket, Key=chunk_key(settings, victim))[
        "ETag"].strip('"')
    s3_client.put_object(Bucket=settings.bucket, Key=path, Body=json.dumps(doc).encode())
    store = builder(tmp_path / "second", settings)
    warnings = collect_warnings(monkeypatch)
    assert store.where(key, checked=True) == ("s3",)  # the quick check cannot tell
    assert store.complete(key) is None  # no good copy: the make exports
    assert any(victim in w and w.endswith("; not copied from there") for w in warnings), warnings
    assert store.publish(key, image, record_for(key, "demo:user", image)) == {"local": "published",
                                                                              "s3": "repaired"}
    assert file_digest(fetch_anew(tmp_path, settings, key, **CHUNKED)) == file_digest(image)


def test_a_warm_make_repairs_a_truncated_shared_copy_found_by_a_stat(tmp_path, settings, image, monkeypatch) -> None:
    tiers = [FilesystemTier(tmp_path / "fsx", "shared"), FilesystemTier(tmp_path / "cache", "local")]
    key = publish(Store(tiers, settings, show_progress=False, s3_options=CHUNKED), image)
    shared_copy = tiers[0].sqsh_path(key)
    data = shared_copy.read_bytes()
    shared_copy.unlink()
    shared_copy.write_bytes(data[: len(data) // 2])
    store = Store(tiers, settings, show_progress=False, s3_options=CHUNKED)
    warnings = collect_warnings(monkeypatch)
    assert store.where(key, checked=True) == ("local", "s3")
    assert any(f"shared tier: {shared_copy}: corrupt artifact: {len(data) // 2} bytes" in w for w in warnings)
    assert store.complete(key) == {"local": "reused", "s3": "reused", "shared": "repaired"}
    assert file_digest(shared_copy) == file_digest(image)


def test_an_index_listing_good_chunks_in_another_order_is_found_by_the_deep_check(tmp_path, settings, image,
                                                                                   s3_client) -> None:
    """Record and index agree, every chunk hashes to its id, the file they make is another: only
    hashing the whole (--deep) tells, and a make then publishes the artifact anew."""
    store = builder(tmp_path, settings)
    key = publish(store, image)
    path = store.s3.index_object(key)
    doc = json.loads(s3_client.get_object(Bucket=settings.bucket, Key=path)["Body"].read())
    doc["chunks"] = doc["chunks"][1:] + doc["chunks"][:1]
    s3_client.put_object(Bucket=settings.bucket, Key=path, Body=json.dumps(doc).encode())
    assert store.verify(key) == [("local", None), ("s3", None)]
    (_, problem), = [item for item in store.verify(key, deep=True) if item[0] == "s3"]
    assert str(problem).startswith(f"s3 tier: {key[:12]} (demo:user): the chunks {store.s3.url(path)} lists make "
                                   f"blake3:")
    assert str(problem).endswith(f", its record says {file_digest(image)}")
    s3_client.delete_object(Bucket=settings.bucket, Key=path)  # the operator's repair: the object named goes
    store = builder(tmp_path, settings)
    assert store.where(key, checked=True) == ("local",)
    assert store.complete(key) == {"local": "reused", "s3": "repaired"}
    assert file_digest(fetch_anew(tmp_path, settings, key, **CHUNKED)) == file_digest(image)


# ---- gc ---------------------------------------------------------------------------------------
def test_gc_names_missing_chunks_and_with_deep_poisoned_ones(tmp_path, settings, image, s3_client, capsys) -> None:
    key = publish(builder(tmp_path, settings), image)
    (tmp_path / "cache" / "store.toml").write_text(store_config_text(settings))
    gone, poisoned = chunk_ids(settings, key)[:2]
    s3_client.delete_object(Bucket=settings.bucket, Key=chunk_key(settings, gone))
    poison(s3_client, settings, poisoned)
    assert main(["gc", "--store", str(tmp_path / "cache"), "--s3"]) == 0
    out = capsys.readouterr().out
    assert f"s3 chunk {gone} ({key[:12]} demo:user): missing" in out and poisoned not in out
    assert main(["gc", "--store", str(tmp_path / "cache"), "--s3", "--deep", "--json"]) == 0
    problems = json.loads(capsys.readouterr().out)["s3_chunk_problems"]
    assert {p["chunk"] for p in problems} == {gone, poisoned}
    assert {tuple(p["artifacts"]) for p in problems} == {(key,)}


def test_a_deep_check_holds_a_bounded_window_of_chunk_bytes_whatever_the_index_names() -> None:
    """An index naming 64 MiB chunks (what the index format allows) must not make `--deep` hold
    `workers` of them, a gigabyte, at once."""
    from efabuild.store.chunked.health import WINDOW_BYTES, _windows

    big = tuple((f"{n:064x}", 64 * MiB) for n in range(40))
    groups = _windows(big, 16)
    assert [c for group in groups for c in group] == list(big)  # every chunk, in file order
    assert max(sum(length for _, length in group) for group in groups) <= max(WINDOW_BYTES, 64 * MiB)
    small = tuple((f"{n:064x}", 4 * MiB) for n in range(40))
    assert [len(group) for group in _windows(small, 16)] == [16, 16, 8]
    assert _windows((), 16) == []


def test_a_job_start_with_verify_takes_a_good_node_copy_whatever_the_bucket_lost(store: Path, settings: S3Config,
                                                                                 s3_client, tmp_path: Path) -> None:
    """The Pyxis importer's `verify = true` re-hashes the node's copy; a chunk missing from the
    bucket is for `lookup --verify`, audit and make to report, not a reason to refuse a job."""
    from efabuild.cli import pyxis_importer_main
    from tests.kits.inprocess import run_efabuild

    first, *_ = chunk_ids(settings, KEY)
    s3_client.delete_object(Bucket=settings.bucket, Key=chunk_key(settings, first))
    config = tmp_path / "pyxis.toml"
    config.write_text(f'store = "{store}"\nverify = true\n')
    runtime = tmp_path / "pyxis-runtime"
    runtime.mkdir()
    env = {**os.environ, "EFABUILD_PYXIS_CONFIG": str(config), "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
           "PYXIS_RUNTIME_PATH": str(runtime), "PYXIS_VERSION": "0.24.0", "HOME": str(tmp_path)}
    env.pop("EFABUILD_STORE", None)
    result = run_efabuild(["get", f"docker://efabuild://{KEY[:12]}"], env=env, cwd=tmp_path,
                          entry=pyxis_importer_main)
    assert (result.returncode, result.stdout) == (0, f"{store / 'objects' / KEY[:2] / KEY}.sqsh\n"), result.stderr
    assert main(["lookup", "--verify", "--store", str(store), KEY[:12]]) == 1
