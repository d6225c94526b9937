"""A second round of hostile inputs: what another user of the machine or of a shared path can
plant for a builder's efabuild to trust, and what a workspace's own settings and git state can
smuggle onto a command line.

Each case plants one thing the way a co-tenant would (as another uid where it matters: the tests
run as root when the machine allows it, and hand the planted file to `nobody`), then runs what the
builder runs and checks what the builder would: the keys, the exit code, the command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from efabuild.make.hashcache import HashState
from tests.kits.inprocess import run_efabuild
from tests.kits.wsfactory import REPO, SIMPLE_GRAPH, make_workspace

ROOT = os.geteuid() == 0
NOBODY = 65534


def plan_keys(root: Path) -> tuple[dict[str, str], int]:
    proc = run_efabuild(["-C", str(root), "plan", "--offline", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    return {layer["name"]: layer["key"] for layer in data["layers"]}, data["context_files_read"]


def age(path: Path) -> None:
    past = time.time() - 60
    os.utime(path, (past, past))


@pytest.mark.parametrize("planted_as", [
    pytest.param("another user", marks=pytest.mark.skipif(not ROOT, reason="planting a file as another user needs root")),
    "this user, writable by the group"])
def test_a_hash_cache_another_user_planted_never_keeps_a_changed_file_s_old_key(tmp_path, planted_as, settled_clock):
    """The local store may be configured on a shared path (`local = "/fsx/..."`); whoever can
    write its state/ directory must not be able to make a changed context file look unchanged
    (the make would then reuse the artifact built from the old file). A cache file of this user's
    that the group may write is as good as theirs (slip: only the write bit for others checked)."""
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    for path in (root / "app").rglob("*"):
        age(path)
    before, _ = plan_keys(root)
    cache = root / "cache" / "state" / "hashes"
    old_digest = HashState(cache).lookup("app/train.py")[-1]

    train = root / "app" / "train.py"
    train.write_text("print('a change the builder made')\n")
    age(train)
    # the co-tenant's cache: the new file's stat stamp, the old file's digest
    planted = HashState(cache)
    planted.put("app/train.py", train.stat(), old_digest)
    planted.save()
    assert HashState(cache).get("app/train.py", train.stat()) == old_digest  # believed if it were ours
    if planted_as == "another user":
        os.chown(cache, NOBODY, NOBODY)
        os.chmod(cache, 0o644)
    else:
        os.chmod(cache, 0o664)

    after, read = plan_keys(root)
    assert after["stack:user"] != before["stack:user"]
    assert read == 2  # the planted cache is not used at all
    cache.unlink()  # with no cache at all: the same keys
    assert plan_keys(root)[0] == after


@pytest.mark.parametrize("url", ["https://h/x\n\x1b]2;title\x07\x1b[31m$(touch /tmp/x)", "https://h/x\rspoof", "https://h/x\tmore"])
def test_a_remote_url_with_control_characters_or_spaces_is_no_source_label(tmp_path, url):
    """The `origin` URL becomes a label in the image, its /etc/rc and every `docker inspect`: a
    line break or terminal escape there would reach whoever reads them."""
    from efabuild.make.gitstate import REVISION, SOURCE, git_labels

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=a@b", "-c", "user.name=n", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "config", "remote.origin.url", url], check=True)
    labels = git_labels(tmp_path)
    assert REVISION in labels and SOURCE not in labels
    subprocess.run(["git", "-C", str(tmp_path), "config", "remote.origin.url", "https://tok:x@h/x.git"], check=True)
    assert git_labels(tmp_path)[SOURCE] == "https://h/x.git"


ESCAPES = "\x1b]2;title\x07\x1b[2J"


def test_gc_never_prints_a_planted_leftover_s_name_raw(tmp_path, capsys):
    """tmp/ is writable by every builder; a name shaped like a dead writer's leftover may end in
    anything. gc (run by an admin, as root) prints what it removes: a terminal escape in it must
    not reach the terminal, nor a line break forge a line of gc's own output."""
    from efabuild.cli import main
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.host.owner import this_host
    from efabuild.store.tiered import Store
    from tests.kits.storekit import key_for, make_sqsh, record_for

    root = tmp_path / "store"
    key = key_for("planted-names")
    sqsh = make_sqsh(tmp_path, os.urandom(5000), name="a")
    Store([FilesystemTier(root, "store")], show_progress=False).publish(key, sqsh, record_for(key, "g:a", sqsh))
    (root / "tmp").mkdir(exist_ok=True)
    forged = "\nremoved leftover  store  FORGED"  # a line of its own, were the newline printed
    dead = 2 ** 22 + 1  # above any pid_max: no process has it
    (root / "tmp" / f"context-{this_host()}.{dead}.1-deadbeef-{ESCAPES}{forged}").mkdir()
    (root / "tmp" / f"efatmp.{this_host()}.{dead}.1.abcd1234.{ESCAPES}{forged}").write_text("x")
    for argv in (["gc"], ["gc", "--yes"]):
        assert main([*argv, "--store", str(root)]) == 0
        out, err = capsys.readouterr()
        assert "\x1b" not in out + err
        assert not any(line.startswith("removed leftover  store  FORGED") for line in out.splitlines()), out
        assert len([line for line in out.splitlines() if "leftover" in line]) == 2, out
    assert os.listdir(root / "tmp") == []


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "directory", "huge"])
def test_a_signing_key_that_is_no_small_file_is_one_line_not_a_hang(tmp_path, kind):
    """`[sign] key` and `sign --key` name a PEM file: a device, a FIFO or a huge file there is bad
    input (one line naming it, exit 2), never a read without end, a hang or a MemoryError."""
    key = {"dev-zero": Path("/dev/zero"), "fifo": tmp_path / "key.pem", "directory": tmp_path / "keys",
           "huge": tmp_path / "big.pem"}[kind]
    if kind == "fifo":
        os.mkfifo(key)
    elif kind == "directory":
        key.mkdir()
    elif kind == "huge":
        with open(key, "wb") as out:
            out.truncate(1 << 30)  # sparse: 1 GiB read as zeros
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH},
                          build=f'[workspace]\ngraphs = ["graphs/*.toml"]\n[sign]\nkey = "{key}"\n')
    for argv in (["sign", "--key", str(key), "stack:user"], ["sign", "stack:user"]):
        proc = subprocess.run([sys.executable, "-m", "efabuild", *argv], cwd=root, capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
        assert str(key) in proc.stderr and "Traceback" not in proc.stderr


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _huge(path: Path) -> None:
    with open(path, "wb") as out:
        out.truncate(300 << 20)  # sparse: 300 MiB of zeros to read


@pytest.mark.parametrize("plant", [
    pytest.param(_fifo, id="fifo"),
    pytest.param(lambda p: p.mkdir(), id="directory"),
    pytest.param(lambda p: p.write_text("[1]"), id="a-list"),
    pytest.param(lambda p: p.write_text('{"builds": [1, {"time": "x"}, {"key": 5}]}'), id="junk-entries"),
    pytest.param(lambda p: p.write_text('{"builds": "abc"}'), id="builds-a-string"),
    pytest.param(_huge, id="huge"),
])
def test_a_build_record_planted_in_a_shared_local_store_is_passed_over(tmp_path, plant):
    """builds/ lives in the local store, which may be configured on a shared path: a record there
    that is no small JSON object is treated as absent, never a hang, a traceback or a huge read."""
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    keys, _ = plan_keys(root)
    for name in ("efa", "deepep"):
        (root / "cache" / "builds" / "layers" / "stack").mkdir(parents=True, exist_ok=True)
        path = root / "cache" / "builds" / "layers" / "stack" / f"{name}.json"
        plant(path)
    key = keys["stack:user"]
    (root / "cache" / "builds" / "keys" / key[:2]).mkdir(parents=True, exist_ok=True)
    plant(root / "cache" / "builds" / "keys" / key[:2] / f"{key}.json")
    proc = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), "plan", "--offline", "--json"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    layers = {layer["name"]: layer for layer in json.loads(proc.stdout)["layers"]}
    assert {name: layer["key"] for name, layer in layers.items()} == keys
    assert all(layer["state"] == "to build" for layer in layers.values())


@pytest.mark.engine
@pytest.mark.parametrize("plant", ["symlink", "hardlink"])
def test_make_never_writes_its_build_log_through_a_planted_link(tmp_path, docker_engine, plant):
    """logs/ lives in the local store, which may be configured on a shared path: a link planted
    where a layer's build log goes (its key is what `plan` prints) must not make a make, run by
    root or by the builder, overwrite the file it points at."""
    import uuid

    from fixtures.builder import MINI_NGC_TAG, build_fixtures

    build_fixtures()
    graph = (f'[layers.a]\nbase = "{MINI_NGC_TAG}"\ndockerfile = "RUN echo {uuid.uuid4().hex} > /run-id"\n')
    root = make_workspace(tmp_path / "ws", {"g": graph})
    victim = tmp_path / "precious"
    victim.write_text("the user's own file\n")
    plan = run_efabuild(["-C", str(root), "plan", "--json"], capture_output=True, text=True)
    key = json.loads(plan.stdout)["layers"][0]["key"]
    log = root / "cache" / "logs" / "g" / "a" / f"{key}.log"
    log.parent.mkdir(parents=True)
    if plant == "symlink":
        log.symlink_to(victim)
    else:
        os.link(victim, log)
    try:
        proc = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), "make", "g:a"], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, proc.stderr
        assert victim.read_text() == "the user's own file\n"
        assert not log.is_symlink() and log.stat().st_nlink == 1 and f"building efabuild/a:{key}" in log.read_text()
    finally:
        subprocess.run(["docker", "image", "rm", "-f", f"efabuild/a:{key}"], capture_output=True)


@pytest.mark.skipif(not ROOT, reason="planting a file as another user needs root")
def test_a_kms_key_resolution_another_user_planted_is_not_trusted(tmp_path):
    """`efabuild trust` keeps the public key of each KMS ARN of [trust] under the local store
    (state/trust/), which may sit on a shared path. Whoever can write there must not be able to
    put their own public key in its place and have artifacts they sign accepted."""
    from efabuild.signing.keys import PemSigner
    from efabuild.signing.trust import kms_cache_name
    from tests.kits.signkit import make_key, stored_artifact

    arn = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    private, public = make_key(tmp_path / "keys", "ec")  # the co-tenant's own key pair
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH},
                          build=f'[workspace]\ngraphs = ["graphs/*.toml"]\n[store]\nlocal = "store"\n'
                                f'[trust]\nkeys = ["{arn}"]\n')
    _, key = stored_artifact(root, PemSigner(private))
    resolved = root / "store" / "state" / "trust" / kms_cache_name(arn)
    resolved.parent.mkdir(parents=True)
    resolved.write_bytes(public.read_bytes())
    resolved.chmod(0o644)

    def lookup() -> subprocess.CompletedProcess:
        return run_efabuild(["-C", str(root), "lookup", "--require-signature", key], capture_output=True, text=True)

    os.chown(resolved, NOBODY, NOBODY)
    refused = lookup()
    assert refused.returncode != 0 and refused.stdout == ""
    assert str(resolved) in refused.stderr and len(refused.stderr.splitlines()) == 1, refused.stderr
    os.chown(resolved, os.geteuid(), os.getegid())  # as if this user had resolved it: trusted
    assert lookup().returncode == 0


KMS_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


@pytest.mark.parametrize("how", ["option", "build-toml", "trust-table"])
@pytest.mark.parametrize("url, expected", [("http://u:hunter2@127.0.0.1:9", "must not hold credentials"),
                                           ("not a url", "http:// or https://"),
                                           ("-h", "http:// or https://")])
def test_a_kms_endpoint_is_checked_before_boto3_sees_it(tmp_path, how, url, expected):
    """A KMS endpoint (`sign --endpoint-url`, `[sign] endpoint_url`) is checked as the S3 one is:
    one line and exit 2, never a traceback, and a password in it never repeated."""
    build = '[workspace]\ngraphs = ["graphs/*.toml"]\n'
    argv = ["sign", "stack:user"]
    if how == "option":
        argv[1:1] = ["--key", KMS_ARN, f"--endpoint-url={url}"]
    elif how == "trust-table":  # `efabuild trust` resolves [trust]'s KMS keys there
        build += f'[trust]\nkeys = ["{KMS_ARN}"]\nendpoint_url = "{url}"\n'
        argv = ["trust"]
    else:
        build += f'[sign]\nkey = "{KMS_ARN}"\nendpoint_url = "{url}"\n'
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH}, build=build)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_MAX_ATTEMPTS": "1"}
    proc = run_efabuild(["-C", str(root), *argv], capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and expected in proc.stderr, proc.stderr
    assert "hunter2" not in proc.stderr
    assert {"option": "--endpoint-url", "build-toml": "sign.endpoint_url",
            "trust-table": "trust.endpoint_url"}[how] in proc.stderr


@pytest.mark.parametrize("table", ["sign", "store.s3"])
def test_a_region_boto3_would_refuse_is_one_line_naming_the_setting(tmp_path, table):
    build = '[workspace]\ngraphs = ["graphs/*.toml"]\n'
    build += (f'[sign]\nkey = "{KMS_ARN}"\n' if table == "sign" else '[store.s3]\nbucket = "b"\n')
    build += 'region = "us east/../1"\n'
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH}, build=build)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_MAX_ATTEMPTS": "1"}
    for argv in (["sign", "stack:user"] if table == "sign" else ["ls"], ["plan", "--offline"]):
        proc = run_efabuild(["-C", str(root), *argv], capture_output=True, text=True, env=env)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and f"{table}.region" in proc.stderr, proc.stderr


def _limited_memory() -> None:
    import resource

    # 192 MiB is over twice what efabuild needs; a failure here is a MemoryError, not the OOM killer
    resource.setrlimit(resource.RLIMIT_AS, (192 << 20, 192 << 20))


@pytest.mark.parametrize("argv", [["doctor", "/dev/zero"], ["doctor", "--manifest", "/dev/zero", "LOG"]])
def test_doctor_given_a_device_is_one_line_not_an_endless_read(tmp_path, argv):
    log = tmp_path / "job.out"
    log.write_text("NCCL INFO NET/OFI Selected provider is efa\n")
    argv = [str(log) if a == "LOG" else a for a in argv]
    proc = subprocess.run([sys.executable, "-m", "efabuild", *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, preexec_fn=_limited_memory)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.splitlines()) == 1 and "/dev/zero" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_doctor_reads_a_log_with_an_endless_line_in_bounded_memory(tmp_path):
    """A job's output may hold a line of megabytes (a progress bar without newlines): it is cut,
    and what follows it is still read."""
    log = tmp_path / "job.out"
    with open(log, "wb") as out:
        out.truncate(512 << 20)  # sparse: a line of 512 MiB of NULs, more than twice what the process may hold
        out.seek(0, os.SEEK_END)
        out.write(b"\nNCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n")
    proc = subprocess.run([sys.executable, "-m", "efabuild", "doctor", "--json", str(log)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)},
                          preexec_fn=_limited_memory)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "socket" in proc.stdout.lower(), proc.stdout
