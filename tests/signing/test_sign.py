"""Signed statements: made with real keys, checked by `verify`, `lookup --require-signature`, the
Pyxis importer and cosign; refused when anything about the artifact was changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from efabuild.signing import dsse
from efabuild.signing.keys import PemSigner
from efabuild.store.layout import ENVELOPE_SUFFIX
from tests.kits.storekit import cache_dir
from tests.kits.signkit import NAME, make_key, object_path, stored_artifact, trust_config
from tests.kits.storekit import efabuild, key_for


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    base = tmp_path_factory.mktemp("keys")
    return {"ec": make_key(base / "a", "ec"), "ed25519": make_key(base / "b", "ed25519"),
            "other": make_key(base / "c", "ec")}


def node_env(tmp_path: Path, store: Path, *public_keys: Path) -> dict[str, str]:
    """A compute node: a bare store, a trust policy, the user's own verification cache."""
    config = trust_config(tmp_path / "trust.toml", *public_keys)
    pyxis = tmp_path / "pyxis.toml"
    pyxis.write_text(f'store = "{store}"\nrequire_signature = true\n')
    cache = cache_dir(tmp_path / "verified")
    return {"EFABUILD_TRUST_CONFIG": str(config), "EFABUILD_VERIFY_CACHE": str(cache),
            "EFABUILD_PYXIS_CONFIG": str(pyxis), "EFABUILD_STORE": str(store)}


def three_ways(ref: str, env: dict[str, str]) -> dict[str, subprocess.CompletedProcess]:
    """The artifact as verify, a job script's lookup and Pyxis' importer see it."""
    return {
        "verify": efabuild("verify", ref, env=env),
        "lookup": efabuild("lookup", "--require-signature", ref, env=env),
        "importer": efabuild("pyxis-importer", "get", f"docker://efabuild://{ref}", env=env),
    }


@pytest.mark.parametrize("kind", ["ec", "ed25519"])
def test_a_signed_artifact_verifies_everywhere(tmp_path, keys, kind):
    private, public = keys[kind]
    store, key = stored_artifact(tmp_path, PemSigner(private))
    envelope = object_path(store, key, ".intoto.jsonl").read_bytes()
    assert envelope.count(b"\n") == 1  # one envelope, one line
    statement = dsse.decode(envelope).statement()
    record = json.loads(object_path(store, key, ".json").read_text())
    assert statement["subject"] == [{"name": f"{key}.sqsh", "digest": {
        "blake3": record["digest"].split(":")[1], "sha256": record["sha256"]}}]
    env = node_env(tmp_path, store, public)
    results = three_ways(NAME, env)
    assert results["verify"].returncode == 0, results["verify"].stdout + results["verify"].stderr
    assert results["verify"].stdout == f"ok    {key[:12]} store\n"
    for how in ("lookup", "importer"):
        assert results[how].returncode == 0, results[how].stderr
        assert results[how].stdout.strip() == str(object_path(store, key, ".sqsh"))
    sha = efabuild("verify", "--all", "--sha256", "--json", env=env)
    assert sha.returncode == 0 and json.loads(sha.stdout)["ok"] is True
    # named like every other command's JSON: name, key (and the tier that holds it)
    assert json.loads(sha.stdout)["results"] == [{"key": key, "name": NAME, "tier": "store", "problems": []}]


def _flip_byte(store: Path, key: str, other: Path) -> None:
    sqsh = object_path(store, key, ".sqsh")
    os.chmod(sqsh, 0o644)
    with open(sqsh, "r+b") as handle:
        handle.seek(4096)
        byte = handle.read(1)
        handle.seek(4096)
        handle.write(bytes([byte[0] ^ 1]))


def _swap_statement(store: Path, key: str, other: Path) -> None:
    """The envelope of another artifact, validly signed by the trusted key, put beside this one."""
    _, other_key = stored_artifact(other, PemSigner(other.parent / "keys-ec.pem"), label="other")
    shutil.copy(object_path(other / "store", other_key, ".intoto.jsonl"), object_path(store, key, ".intoto.jsonl"))


def _untrusted_key(store: Path, key: str, other: Path) -> None:
    """Re-signed by a key the node does not trust (same statement, its signature replaced)."""
    path = object_path(store, key, ".intoto.jsonl")
    envelope = dsse.decode(path.read_bytes())
    signer = PemSigner(other.parent / "keys-other.pem")
    bare = dsse.Envelope(envelope.payload)
    path.write_bytes(dsse.encode(bare.with_signature(signer.sign(bare.pae()))))


def _moved_under_another_key(store: Path, key: str, other: Path) -> str:
    """Every file of the artifact, intact and validly signed, copied under another key."""
    moved = key_for("moved elsewhere")
    (store / "objects" / moved[:2]).mkdir(exist_ok=True)
    for suffix in (".json", ".manifest.json", ".intoto.jsonl", ".sqsh"):
        shutil.copy(object_path(store, key, suffix), object_path(store, moved, suffix))
    return moved


def _statement_by_link(store: Path, key: str, other: Path) -> None:
    """The valid envelope moved out of the store and linked back: the store holds no signature."""
    path = object_path(store, key, ".intoto.jsonl")
    other.mkdir()
    shutil.move(path, other / "statement.intoto.jsonl")
    path.symlink_to(other / "statement.intoto.jsonl")



def _second_envelope(store: Path, key: str, other: Path) -> None:
    """Another envelope appended as a second line: cosign refuses such a bundle, so verify must too
    (whatever the first line says)."""
    path = object_path(store, key, ".intoto.jsonl")
    data = path.read_bytes()
    os.chmod(path, 0o644)
    path.write_bytes(data + data)

def _rewrite_json(path: Path, edit) -> bytes:  # noqa: ANN001
    data = json.loads(path.read_bytes())
    edit(data)
    text = json.dumps(data, sort_keys=True).encode()
    os.chmod(path, 0o644)
    path.write_bytes(text)
    return text


def _new_manifest(store: Path, key: str, manifest: bytes) -> None:
    """`manifest` beside the artifact, and the record's manifest digest made to match (the record
    is not signed: whoever may write the store may rewrite it)."""
    from efabuild.host.digest import bytes_digest

    path = object_path(store, key, ".manifest.json")
    os.chmod(path, 0o644)
    path.write_bytes(manifest)
    _rewrite_json(object_path(store, key, ".json"), lambda record: record.update(manifest_digest=bytes_digest(manifest)))


def _manifest_of_another_artifact(store: Path, key: str, other: Path) -> None:
    other_store, other_key = stored_artifact(other, None, label="other")
    _new_manifest(store, key, object_path(other_store, other_key, ".manifest.json").read_bytes())


def _manifest_with_another_sha256(store: Path, key: str, other: Path) -> None:
    path = object_path(store, key, ".manifest.json")
    _new_manifest(store, key, _rewrite_json(path, lambda m: m["artifact"].update(sha256="0" * 64)))


def _unsigned_files_with_another_sha256(store: Path, key: str, other: Path) -> None:
    """Every unsigned file rewritten to agree on another sha256 (what a cosign verifier would look
    up): only the signed statement still says which it is."""
    _rewrite_json(object_path(store, key, ".json"), lambda record: record.update(sha256="0" * 64))
    _manifest_with_another_sha256(store, key, other)


def _second_subject(store: Path, key: str, other: Path) -> None:
    """Slip: several subjects accepted. The trusted key's signature on a statement naming this file
    and another one: a statement vouches for exactly one artifact, or one signed for a set could
    be replayed for any of them."""
    path = object_path(store, key, ".intoto.jsonl")
    envelope = dsse.decode(path.read_bytes())
    statement = json.loads(envelope.payload)
    statement["subject"].append({"name": f"{key_for('another')}.sqsh", "digest": {"blake3": "0" * 64}})
    bare = dsse.Envelope(json.dumps(statement).encode(), envelope.payload_type)
    os.chmod(path, 0o644)
    path.write_bytes(dsse.encode(bare.with_signature(PemSigner(other.parent / "keys-ec.pem").sign(bare.pae()))))


TAMPERING = {
    "flipped byte": (_flip_byte, "digest blake3:"),
    "swapped statement": (_swap_statement, "the statement is for"),
    "untrusted key": (_untrusted_key, "none by a key trusted by"),
    "moved under another key": (_moved_under_another_key, "the record is for"),
    "statement by link": (_statement_by_link, "intoto.jsonl: a symbolic link, not a file"),
    "second envelope": (_second_envelope, "holds 2 envelopes, not exactly one"),
    "manifest of another artifact": (_manifest_of_another_artifact, "the manifest is for"),
    "manifest with another sha256": (_manifest_with_another_sha256, "the manifest's digests differ"),
    "unsigned files with another sha256": (_unsigned_files_with_another_sha256,
                                           "the statement's subject has sha256 "),
    "second subject": (_second_subject, "the statement must name exactly one subject"),
}


@pytest.mark.parametrize("case", TAMPERING)
def test_tampering_is_refused_by_verify_lookup_and_the_importer(tmp_path, keys, case):
    private, public = keys["ec"]
    for name in ("ec", "other"):
        shutil.copy(keys[name][0], tmp_path / f"keys-{name}.pem")
    store, key = stored_artifact(tmp_path / "a", PemSigner(private))
    env = node_env(tmp_path, store, public)
    # a first lookup verifies and (the files being 2 s old) caches the result
    tamper, problem = TAMPERING[case]
    moved = tamper(store, key, tmp_path / "b")
    ref = moved or key
    results = three_ways(ref, env)
    for how, result in results.items():
        assert result.returncode == 1, f"{how} accepted it: {result.stdout}{result.stderr}"
        assert problem in result.stdout + result.stderr, f"{how}: {result.stdout}{result.stderr}"
    assert results["verify"].stdout.startswith(f"FAIL  {ref[:12]} store: ")
    as_json = efabuild("verify", "--json", ref, env=env)
    [result] = json.loads(as_json.stdout)["results"]
    assert as_json.returncode == 1 and problem in " ".join(result["problems"])
    # a record that is not this key's names nothing
    assert result["name"] == (None if case == "moved under another key" else NAME), result
    # a record under another key's file name is no artifact at all: refused before any signature
    prefix = f"efabuild: {object_path(store, ref, '.json')}: " if case == "moved under another key" \
        else f"efabuild: refusing {ref}: "
    for how in ("lookup", "importer"):
        err = results[how].stderr
        assert err.startswith(prefix) and err.count("\n") == 1, err
        assert results[how].stdout == ""


def test_unsigned_artifact_and_missing_policy_are_one_line(tmp_path, keys):
    store, key = stored_artifact(tmp_path, None)
    env = node_env(tmp_path, store, keys["ec"][1])
    unsigned = efabuild("lookup", "--require-signature", key, env=env)
    assert unsigned.returncode == 1 and unsigned.stderr.count("\n") == 1
    assert "unsigned (no " in unsigned.stderr
    plain = efabuild("lookup", key, env=env)  # without the flag nothing is asked
    assert plain.returncode == 0
    no_policy = efabuild("lookup", "--require-signature", key,
                         env={**env, "EFABUILD_TRUST_CONFIG": str(tmp_path / "absent.toml")})
    assert no_policy.returncode == 2
    assert no_policy.stderr == (f"efabuild: no trusted keys: signatures are required but {tmp_path / 'absent.toml'} "
                                "does not exist (an admin writes it from a workspace's [trust] with `efabuild trust "
                                f"--write {tmp_path / 'absent.toml'}`)\n")
    (tmp_path / "empty.toml").write_text("[trust]\nkeys = []\n")
    empty = efabuild("lookup", "--require-signature", key,
                     env={**env, "EFABUILD_TRUST_CONFIG": str(tmp_path / "empty.toml")})
    assert empty.returncode == 2 and empty.stderr.endswith(f"{tmp_path / 'empty.toml'} names no keys (`[trust] keys = [...]`)\n")


def test_sign_adds_a_signature_to_the_stored_statement_unchanged(tmp_path, keys):
    store, key = stored_artifact(tmp_path, PemSigner(keys["ec"][0]))
    path = object_path(store, key, ".intoto.jsonl")
    before = dsse.decode(path.read_bytes())
    env = {"EFABUILD_STORE": str(store)}
    added = efabuild("sign", key, "--key", str(keys["ed25519"][0]), env=env)
    assert added.returncode == 0, added.stderr
    after = dsse.decode(path.read_bytes())
    assert path.read_bytes().count(b"\n") == 1
    assert after.payload == before.payload and after.signatures[0] == before.signatures[0]
    assert len(after.signatures) == 2
    again = efabuild("sign", key, "--key", str(keys["ed25519"][0]), env=env)
    assert again.returncode == 0 and "already signed" in again.stdout
    assert dsse.decode(path.read_bytes()) == after
    # either key alone is enough
    for kind in ("ec", "ed25519"):
        result = efabuild("verify", key, env=node_env(tmp_path, store, keys[kind][1]))
        assert result.returncode == 0, result.stdout
    # private key material is nowhere in the store or the output
    secret = b"".join(keys["ed25519"][0].read_bytes().splitlines()[1:-1])
    for stored in store.rglob("*"):
        if stored.is_file():
            assert secret not in stored.read_bytes()
    assert secret.decode() not in added.stdout + added.stderr


def test_sign_an_artifact_exported_unsigned(tmp_path, keys):
    store, key = stored_artifact(tmp_path, None)
    env = node_env(tmp_path, store, keys["ec"][1])
    assert efabuild("verify", key, env=env).returncode == 1
    assert efabuild("sign", key, "--key", str(keys["ec"][0]), env=env).returncode == 0
    assert efabuild("verify", key, env=env).returncode == 0


def test_a_bad_signing_key_is_one_line(tmp_path, keys):
    store, key = stored_artifact(tmp_path, None)
    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    result = efabuild("sign", key, "--key", str(bad), env={"EFABUILD_STORE": str(store)})
    assert result.returncode == 2 and result.stderr.startswith(f"efabuild: {bad}: not an unencrypted PEM")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# ---- the verification cache ---------------------------------------------------------------------

# The racy rule trusts no file whose ctime is within 2 s of the verification. No call sets a ctime
# back (os.utime sets the mtime and moves the ctime to now), so rather than waiting 2 s the lookup's
# clock is moved forward instead: in the lookup process, and only there, time.time() reads AHEAD s later.
AHEAD = 3.0
LOOKUP_AND_REPORT_MODULES = """
import sys, time
ahead, real_time = float(sys.argv[2]), time.time
time.time = lambda: real_time() + ahead
from efabuild.cli import main
code = main(["lookup", "--require-signature", sys.argv[1]])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("cryptography", "blake3", "attrs", "boto3"))
print("MODULES", ",".join(loaded), file=sys.stderr)
sys.exit(code)
"""


def cached_lookup(ref: str, env: dict[str, str], ahead: float = AHEAD) -> tuple[int, str, list[str]]:
    """`lookup --require-signature` as a job script runs it, `ahead` seconds after the files changed."""
    full_env = {**os.environ, **env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", LOOKUP_AND_REPORT_MODULES, ref, str(ahead)], capture_output=True,
                          text=True, env=full_env)
    modules = [line for line in done.stderr.splitlines() if line.startswith("MODULES")][0].split(" ", 1)
    return done.returncode, done.stdout, [m for m in (modules[1] if len(modules) > 1 else "").split(",") if m]


def test_a_cached_lookup_reads_stats_only_and_catches_a_flip_with_mtime_restored(tmp_path, keys):
    store, key = stored_artifact(tmp_path, PemSigner(keys["ec"][0]))
    env = node_env(tmp_path, store, keys["ec"][1])
    code, _, modules = cached_lookup(key, env)
    assert code == 0 and "cryptography" in modules  # the first lookup verified in full
    cache = Path(env["EFABUILD_VERIFY_CACHE"])
    assert oct(cache.stat().st_mode & 0o777) == "0o700" and len(list(cache.iterdir())) == 1
    code, out, modules = cached_lookup(key, env)
    assert code == 0 and out.strip() == str(object_path(store, key, ".sqsh"))
    assert modules == []  # no cryptography, no hashing: stats and small reads only
    # a byte flipped in place, its mtime put back: ctime still moves, so it is verified again
    sqsh = object_path(store, key, ".sqsh")
    before = sqsh.stat()
    _flip_byte(store, key, tmp_path)
    os.chmod(sqsh, 0o444)
    os.utime(sqsh, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert sqsh.stat().st_mtime_ns == before.st_mtime_ns and sqsh.stat().st_size == before.st_size
    code, out, modules = cached_lookup(key, env)
    assert code == 1 and out == "" and "cryptography" in modules


@pytest.mark.slow
def test_an_entry_planted_by_another_user_is_ignored(tmp_path, keys):
    from efabuild.signing import verifycache

    store, key = stored_artifact(tmp_path, PemSigner(keys["ec"][0]))
    env = node_env(tmp_path, store, keys["ec"][1])
    assert cached_lookup(key, env)[0] == 0
    cache = Path(env["EFABUILD_VERIFY_CACHE"])
    entry = next(cache.iterdir())
    nobody = 65534
    os.chown(entry, nobody, nobody)  # as if another user had written it
    assert cached_lookup(key, env)[2] != [], "an entry owned by someone else was believed"
    # the full verification replaced it with the user's own
    assert next(cache.iterdir()).stat().st_uid == os.geteuid()
    os.chmod(next(cache.iterdir()), 0o620)  # writable by the group: not believed (slip: others' bit only)
    assert "cryptography" in cached_lookup(key, env)[2]
    os.chmod(next(cache.iterdir()), 0o666)  # writable by others: not believed either
    assert "cryptography" in cached_lookup(key, env)[2]
    os.chown(cache, nobody, nobody)  # someone else's directory: neither read nor written
    assert "cryptography" in cached_lookup(key, env)[2]
    assert next(cache.iterdir()).stat().st_uid == os.geteuid() and verifycache.RACY_SECONDS == 2.0


def test_a_killed_writers_temp_entry_is_removed_by_the_next_write(tmp_path, keys):
    from efabuild.host.owner import Owner, owned_name

    store, key = stored_artifact(tmp_path, PemSigner(keys["ec"][0]))
    env = node_env(tmp_path, store, keys["ec"][1])
    cache = Path(env["EFABUILD_VERIFY_CACHE"])
    me = Owner.current()
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    killed = cache / f".entry-{me.host}.{dead}.{me.start}-0badc0de-tmp"
    killed.write_bytes(b'{"half an ')  # a lookup killed between writing and renaming its entry
    live = cache / owned_name(".entry", "tmp")  # this process's: still being written
    live.write_bytes(b"")
    assert cached_lookup(key, env)[0] == 0
    assert not killed.exists() and live.exists()
    assert len(list(cache.glob("*.json"))) == 1


def test_nothing_is_cached_within_two_seconds_of_a_change(tmp_path, keys):
    store, key = stored_artifact(tmp_path, PemSigner(keys["ec"][0]))
    env = node_env(tmp_path, store, keys["ec"][1])
    assert cached_lookup(key, env, ahead=0)[0] == 0  # the files are younger than 2 s
    cache = Path(env["EFABUILD_VERIFY_CACHE"])
    assert not cache.exists() or list(cache.iterdir()) == []
    assert cached_lookup(key, env)[0] == 0 and len(list(cache.iterdir())) == 1  # 2 s on, remembered


def test_a_changed_trust_policy_verifies_again(tmp_path, keys):
    store, key = stored_artifact(tmp_path, PemSigner(keys["ec"][0]))
    env = node_env(tmp_path, store, keys["ec"][1])
    assert cached_lookup(key, env)[0] == 0
    trust_config(Path(env["EFABUILD_TRUST_CONFIG"]), keys["other"][1])  # the old key no longer trusted
    code, _, modules = cached_lookup(key, env)
    assert code == 1 and "cryptography" in modules



@pytest.mark.slow
@pytest.mark.parametrize("signed_by, kept", [("ec", "other"), ("other", "ec")])
def test_a_key_dropped_from_a_policy_of_two_no_longer_passes_from_the_cache(tmp_path, keys, signed_by, kept):
    """Slip: the policy digest that binds cached verifications covers only some of its keys. A key
    revoked from a policy of two would keep passing what it signed, answered from the cache."""
    store, key = stored_artifact(tmp_path, PemSigner(keys[signed_by][0]))
    env = node_env(tmp_path, store, keys["ec"][1], keys["other"][1])
    assert cached_lookup(key, env)[0] == 0
    trust_config(Path(env["EFABUILD_TRUST_CONFIG"]), keys[kept][1])  # the signer's key revoked
    code, _, modules = cached_lookup(key, env)
    assert code == 1 and "cryptography" in modules


def test_a_signature_without_a_keyid_is_checked_against_every_trusted_key(tmp_path, keys):
    """DSSE makes keyid optional, and other signers leave it empty. Slip: a signature is passed over
    unless its keyid names the key, and such an envelope, validly signed by a trusted key, is refused."""
    private, public = keys["ec"]
    store, key = stored_artifact(tmp_path, PemSigner(private))
    path = object_path(store, key, ".intoto.jsonl")
    bare = dsse.Envelope(dsse.decode(path.read_bytes()).payload)
    signature = PemSigner(private).sign(bare.pae())
    os.chmod(path, 0o644)
    path.write_bytes(dsse.encode(bare.with_signature(dsse.Signature("", signature.sig))))
    for how, result in three_ways(key, node_env(tmp_path, store, public)).items():
        assert result.returncode == 0, f"{how}: {result.stdout}{result.stderr}"

# ---- cosign, the third-party verifier -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["ec", "ed25519"])
def test_cosign_accepts_the_envelope(tmp_path, keys, kind):
    cosign = shutil.which("cosign")
    assert cosign, "cosign is not installed: scripts/setup-host.sh installs it (Debian trixie's cosign)"
    private, public = keys[kind]
    store, key = stored_artifact(tmp_path, PemSigner(private))
    # a second signature by another key in the same envelope must not confuse it
    assert efabuild("sign", key, "--key", str(keys["other"][0]), env={"EFABUILD_STORE": str(store)}).returncode == 0
    sqsh, bundle = object_path(store, key, ".sqsh"), object_path(store, key, ".intoto.jsonl")
    command = [cosign, "verify-blob-attestation", "--key", str(public), "--insecure-ignore-tlog",
               "--type", "slsaprovenance1", "--signature", str(bundle), str(sqsh)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Verified OK" in done.stdout + done.stderr, done.stderr
    # and refuses another file
    other = tmp_path / "other.sqsh"
    other.write_bytes(sqsh.read_bytes() + b"\0")
    done = subprocess.run(command[:-1] + [str(other)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0


@pytest.mark.s3
def test_the_signed_statement_travels_through_s3_to_a_node_that_fetches(tmp_path, keys, moto_server, s3_bucket):
    from efabuild.settings import S3Config
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier

    builder_store, key = stored_artifact(tmp_path / "builder", PemSigner(keys["ec"][0]))
    s3 = S3Config(bucket=s3_bucket, prefix="efabuild", region="us-east-1", endpoint_url=moto_server)
    builder = Store([FilesystemTier(builder_store, "local")], s3, show_progress=False)
    assert builder.complete(key) == {"local": "reused", "s3": "published"}
    envelope = object_path(builder_store, key, ".intoto.jsonl").read_bytes()
    assert builder.s3.sidecar(key, ENVELOPE_SUFFIX) == envelope
    # a compute node: its store knows only where S3 is; the first lookup fetches, then verifies
    node = tmp_path / "node"
    node.mkdir()
    shutil.copy(builder_store / "store.toml", node / "store.toml")
    env = node_env(tmp_path, node, keys["ec"][1])
    fetched = efabuild("lookup", "--require-signature", NAME, env=env)
    assert fetched.returncode == 0, fetched.stderr
    assert object_path(node, key, ".intoto.jsonl").read_bytes() == envelope
    # a signature added later reaches every tier holding the artifact
    added = efabuild("sign", key, "--key", str(keys["ed25519"][0]), env={"EFABUILD_STORE": str(builder_store)})
    assert added.returncode == 0 and "stored on store, s3" in added.stdout, added.stdout + added.stderr
    assert len(dsse.decode(builder.s3.sidecar(key, ENVELOPE_SUFFIX)).signatures) == 2


def test_a_bad_trust_policy_is_one_line_naming_the_file(tmp_path, keys):
    store, key = stored_artifact(tmp_path, PemSigner(keys["ec"][0]))
    env = node_env(tmp_path, store, keys["ec"][1])
    config = Path(env["EFABUILD_TRUST_CONFIG"])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = {
        "[trust\n": "invalid TOML",
        "[trust]\nkeys = [\"missing.pem\"]\n": f"no such PEM public key file {tmp_path / 'missing.pem'}",
        f"[trust]\nkeys = [\"{fifo}\"]\n": "not a regular file (a FIFO)",  # never opened blocking
        "[trust]\nkey = []\n": "unknown key 'key'",
        "[trust]\nkeys = [\"arn:aws:kms:us-east-1:1:key/x\"]\n": "a KMS key must be resolved",
    }
    for text, problem in cases.items():
        config.write_text(text)
        for args in (("verify", key), ("lookup", "--require-signature", key)):
            result = efabuild(*args, env=env)
            assert result.returncode == 2 and result.stderr.startswith(f"efabuild: {config}"), result.stderr
            assert problem in result.stderr and result.stderr.count("\n") == 1, result.stderr
    os.unlink(config)
    os.mkfifo(config)
    result = efabuild("lookup", "--require-signature", key, env=env)
    assert result.returncode == 2 and "not a regular file" in result.stderr


def test_a_fifo_planted_as_the_statement_is_refused_not_waited_on(tmp_path, keys):
    store, key = stored_artifact(tmp_path, PemSigner(keys["ec"][0]))
    env = node_env(tmp_path, store, keys["ec"][1])
    envelope = object_path(store, key, ".intoto.jsonl")
    envelope.unlink()
    os.mkfifo(envelope)
    for args in (("verify", key), ("lookup", "--require-signature", key)):
        result = efabuild(*args, env=env)
        assert result.returncode == 1 and "a FIFO, not a file" in result.stdout + result.stderr


@pytest.mark.s3
def test_an_artifact_only_s3_holds_is_verified_once_fetched(tmp_path, keys, moto_server, s3_bucket):
    """Slip: the signature is checked on a local hit only. A node that requires signatures would
    then fetch an unsigned artifact that only S3 holds, and start it."""
    from efabuild.settings import S3Config
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.tiered import Store
    from tests.kits.storekit import make_sqsh, record_for

    settings = S3Config(bucket=s3_bucket, prefix="signed/", region="us-east-1", endpoint_url=moto_server)
    builder = Store([FilesystemTier(tmp_path / "builder" / "cache", "local")], settings, show_progress=False)
    sqsh = make_sqsh(tmp_path, os.urandom(50_000), "unsigned")
    key = key_for("only in s3, unsigned")
    builder.publish(key, sqsh, record_for(key, NAME, sqsh))
    node = tmp_path / "fsx"
    node.mkdir()
    (node / "store.toml").write_text((tmp_path / "builder" / "cache" / "store.toml").read_text())
    env = node_env(tmp_path, node, keys["ec"][1])
    refused = efabuild("lookup", "--require-signature", key, env=env)
    assert (refused.returncode, refused.stdout) == (1, ""), refused.stderr
    assert refused.stderr.startswith(f"efabuild: refusing {key}: ") and "unsigned (no " in refused.stderr
    assert efabuild("lookup", key, env=env).returncode == 0  # fetched: only the signature was missing


@pytest.mark.s3
@pytest.mark.parametrize("size", ["as published", "forged"])
@pytest.mark.parametrize("how", ["lookup", "importer"])
def test_a_refused_fetch_leaves_no_unsigned_bytes_on_the_node(tmp_path, keys, moto_server, s3_bucket, how, size):
    """A fetch that --require-signature refuses writes nothing a plain lookup could serve: the
    statement (signed by a key the node does not trust) is checked against S3's record before a
    byte is fetched, so a record forged to 1 TiB costs no write either."""
    from efabuild.settings import S3Config
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.tiered import Store

    builder_store, key = stored_artifact(tmp_path / "builder", PemSigner(keys["other"][0]))
    settings = S3Config(bucket=s3_bucket, prefix="signed/", region="us-east-1", endpoint_url=moto_server)
    builder = Store([FilesystemTier(builder_store, "local")], settings, show_progress=False)
    builder.complete(key)
    record = json.loads(object_path(builder_store, key, ".json").read_text())
    if size == "forged":
        builder.s3.client.put_object(Bucket=s3_bucket, Key=builder.s3.record_object(key),
                                     Body=json.dumps({**record, "size": 1 << 40}).encode())
    node = tmp_path / "fsx"
    node.mkdir()
    shutil.copy(builder_store / "store.toml", node / "store.toml")
    env = node_env(tmp_path, node, keys["ec"][1])
    args = ("lookup", "--require-signature", key) if how == "lookup" else (
        "pyxis-importer", "get", f"docker://efabuild://{key}")
    refused = efabuild(*args, env=env)
    assert (refused.returncode, refused.stdout) == (1, ""), refused.stderr
    assert refused.stderr.startswith(f"efabuild: refusing {key}: s3://{s3_bucket}/signed/objects/") \
        and "none by a key trusted by" in refused.stderr, refused.stderr
    assert not object_path(node, key, ".sqsh").exists()
    assert [path for path in (node / "tmp").rglob("*")] == [] and list(node.rglob("*.sqsh")) == []
    plain = efabuild("lookup", "--no-fetch", key, env=env)
    assert (plain.returncode, plain.stdout) == (1, "") and "--no-fetch: S3 not asked" in plain.stderr


@pytest.mark.parametrize("planted", ["directory", "link"])
def test_trust_write_to_a_planted_path_is_one_line_and_leaves_it(tmp_path, keys, planted):
    """`efabuild trust --write /etc/efabuild/trust.toml` as root: a directory or a link at the path
    is one line, exit 2 (not a traceback), and nothing is written through the link."""
    ws = tmp_path / "ws"
    (ws / "graphs").mkdir(parents=True)
    (ws / "BUILD.toml").write_text(f'[workspace]\ngraphs = ["graphs/*.toml"]\n[trust]\nkeys = ["{keys["ec"][1]}"]\n')
    out, victim = tmp_path / "trust.toml", tmp_path / "victim"
    victim.write_text("another file\n")
    out.mkdir() if planted == "directory" else out.symlink_to(victim)
    done = efabuild("trust", "--write", str(out), cwd=ws)
    kind = "a directory" if planted == "directory" else "a symbolic link"
    assert done.returncode == 2 and done.stderr.startswith(f"efabuild: {out}: {kind}, not a file")
    assert victim.read_text() == "another file\n" and (out.is_dir() or out.is_symlink())
