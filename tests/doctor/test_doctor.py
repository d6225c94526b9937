"""efabuild doctor on log excerpts in the real formats (tests/data/logs/): NCCL 2.18-2.30,
aws-ofi-nccl 1.6 / 1.9 / 1.14 / 1.21 wordings, Open MPI, BuildKit plain progress, nccl-tests."""

from __future__ import annotations

import io
import json
import subprocess
import time
from pathlib import Path

import blake3
import pytest

from efabuild.cli import main
from efabuild.host.digest import file_digest
from efabuild.doctor import examine
from efabuild.doctor.compare import compare_with_manifest, manifest_versions
from efabuild.store import Store
from efabuild.store.record import ArtifactRecord

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def run(name: str, **options):
    path = LOGS / name
    with path.open() as handle:
        return examine([(name, handle)], **options)


def ids(report, severity: str | None = None) -> set[str]:
    return {d.id for d in report.diagnoses if severity is None or d.severity == severity}


def test_efa_path_with_new_aws_ofi_nccl_wording():
    report = run("efa-new.log", expect_nics=8, baseline_gbps=300)
    assert ids(report, "problem") == set()
    assert "efa-path" in ids(report, "ok")
    assert {"optional-plugin", "bootstrap-socket"} <= ids(report, "harmless")
    assert "cuda-forward-compat" in ids(report, "info")
    assert {c: [v for v, _ in vs] for c, vs in report.versions.items()} == {
        "nccl": ["2.30.7"], "aws-ofi-nccl": ["1.21.1"], "libfabric": ["2.6"]}
    bandwidth = next(d for d in report.diagnoses if d.id == "bandwidth")
    assert "341.34 GB/s" in bandwidth.title  # the best row of the nccl-tests table
    efa = next(d for d in report.diagnoses if d.id == "efa-path")
    assert "found 8 nics" in efa.explanation and efa.evidence[0].line == 22


def test_efa_path_with_old_aws_ofi_nccl_wording_and_nic_mismatch():
    report = run("efa-old.log", expect_nics=8)
    assert "efa-path" in ids(report, "ok")
    assert ids(report, "problem") == {"nic-count"}
    nic = next(d for d in report.diagnoses if d.id == "nic-count")
    assert "found 4 nics, expected 8" in nic.title and nic.evidence[0].line == 10
    assert "collnet-symbol" in ids(report, "harmless")
    assert {c: [v for v, _ in vs] for c, vs in report.versions.items()} == {
        "nccl": ["2.21.5"], "aws-ofi-nccl": ["1.9.1-aws"], "libfabric": ["1.22"]}
    assert ids(run("efa-old.log", expect_nics=4), "problem") == set()


def test_oldest_plugin_wording():
    report = run("ofi-oldest.log")
    assert "efa-path" in ids(report, "ok")
    assert report.versions["aws-ofi-nccl"][0][0] == "1.6.0"


@pytest.mark.parametrize("name, cause", [
    ("tcp-fallback.log", "InfiniBand settings are set (NCCL_IB_HCA)"),
    ("tcp-fallback-old.log", "NCCL_NET_PLUGIN is 'none', not 'ofi'"),
])
def test_tcp_fallback_with_its_likely_causes(name, cause):
    report = run(name)
    assert {"tcp-fallback", "plugin-load-failed"} <= ids(report, "problem")
    assert "efa-path" not in ids(report)
    fallback = next(d for d in report.diagnoses if d.id == "tcp-fallback")
    assert cause in fallback.explanation
    assert any("Using network Socket" in e.text for e in fallback.evidence)
    assert "bootstrap-socket" not in ids(report)  # with a real fallback the Bootstrap line is not the story


def test_no_efa_device_in_the_container():
    report = run("no-device.log")
    assert {"no-efa-device", "tcp-fallback"} <= ids(report, "problem")
    device = next(d for d in report.diagnoses if d.id == "no-efa-device")
    assert "/dev/infiniband" in device.explanation
    assert [e.line for e in device.evidence] == [4, 5]


def test_two_open_mpis():
    report = run("mpi-clash.log")
    assert ids(report, "problem") == {"mpi-clash"}
    assert {e.line for e in report.diagnoses[0].evidence} == {1, 10, 14}


def test_build_log_with_empty_apt_lists():
    report = run("build-apt.log")
    assert ids(report, "problem") == {"apt-lists-empty"}
    assert "same RUN" in report.diagnoses[0].fix


def test_dev_fuse_closed_to_the_job_user_when_a_sqsh_is_mounted_per_step():
    """Pyxis with use_squashfuse=1 runs squashfuse as the job's user; Enroot prints squashfuse's
    'fuse: failed to open /dev/fuse: Permission denied' as a [WARN] and then 'Failed to mount'."""
    report = run("fuse-denied.log")
    assert ids(report, "problem") == {"fuse-permission"}  # the mount failure is its consequence, not another
    [fuse] = report.diagnoses
    assert fuse.title == "squashfuse could not open /dev/fuse (Permission denied)"
    assert [e.line for e in fuse.evidence] == [3, 4]
    assert "0666" in fuse.fix and "--container-name" in fuse.fix


def test_a_container_reused_by_a_fixed_name_may_be_an_earlier_build():
    """Pyxis keeps a named container after the job (container_scope=global) and starts it again
    for the name, whatever --container-image says: slurmd logs 'reusing existing container filesystem'."""
    report = run("stale-container.log")
    assert ids(report) == {"stale-container"}
    [stale] = report.diagnoses
    assert stale.severity == "warning" and "reused container train, kept on the node" in stale.title
    assert "efabuild lookup --key" in stale.fix and "prune-containers" in stale.fix
    assert [e.line for e in stale.evidence] == [2, 3]


def test_a_fixed_name_the_log_shows_created_from_one_build_and_asked_for_another_names_both():
    """Two jobs' `set -x` lines and slurmd's in one log: the first srun of the name unpacked one build,
    the later one asked for the next build by path and Pyxis reused the container: which ran is known."""
    report = run("two-builds-container.log")
    stale = [d for d in report.diagnoses if d.id == "stale-container"]
    assert [(d.severity, d.title) for d in stale] == [
        ("problem", "the step that asked for artifact 7c0de5a1b2c3… (line 6) started container train, created from "
                    "artifact 3f9c2be1d0a4… (line 2)")]
    assert "train-${KEY:0:12}" in stale[0].fix
    # the same lines in two files (the job's output, slurmd's log): each start is named by its file too
    text = (LOGS / "two-builds-container.log").read_text().splitlines(keepends=True)
    report = examine([("job-16.out", io.StringIO("".join(text[:4]))), ("job-17.out", io.StringIO("".join(text[4:])))])
    [stale] = [d for d in report.diagnoses if d.id == "stale-container"]
    assert "(job-17.out:2) started container train, created from artifact 3f9c2be1d0a4… (job-16.out:2)" in stale.title
    # a reuse before the second image was asked for is an earlier step's: not evidence of that one
    swapped = "".join(text[:2] + text[6:7] + text[4:6])
    report = examine([("job.out", io.StringIO(swapped))])
    assert [d.severity for d in report.diagnoses if d.id == "stale-container"] == ["warning"]


def test_a_container_named_by_another_key_than_the_image_asked_for_is_a_problem():
    report = run("other-key-container.log")
    [stale] = report.diagnoses
    assert (stale.id, stale.severity) == ("stale-container", "problem")
    assert stale.title == ("the step started container train-3f9c2be1d0a4 (artifact 3f9c2be1d0a4…), not the artifact "
                           "it asked for (7c0de5a1b2c3…)")


def test_a_container_named_by_the_key_of_its_image_is_reuse_as_intended():
    report = run("keyed-container.log")
    assert [(d.id, d.severity) for d in report.diagnoses] == [("container-reused", "info")]
    assert "created from the artifact it asked for (7c0de5a1b2c3…)" in report.diagnoses[0].title


def test_squashfuse_missing_on_the_node():
    report = run("squashfuse-missing.log")
    assert ids(report, "problem") == {"squashfs-tool-missing"}
    assert report.diagnoses[0].title == "Enroot could not find squashfuse on the node"
    assert "install squashfuse" in report.diagnoses[0].fix


def test_an_unpack_that_filled_the_disk_and_one_of_a_file_that_is_no_squashfs():
    full = run("unpack-no-space.log")
    assert ids(full, "problem") == {"unpack-failed"}
    assert full.diagnoses[0].title == "Pyxis could not unpack the image: no space left on the node's disk"
    assert [e.line for e in full.diagnoses[0].evidence] == [3, 7] and "ENROOT_DATA_PATH" in full.diagnoses[0].fix
    invalid = run("unpack-invalid.log")
    assert ids(invalid, "problem") == {"invalid-image"}  # the failed unpack is said with its cause
    assert "efabuild lookup --verify" in invalid.diagnoses[0].fix
    assert invalid.diagnoses[0].title == "Enroot cannot read /fsx/efabuild/objects/3f/3f9c.sqsh as a squashfs"


def test_an_image_the_efabuild_importer_refused_is_named_with_its_line():
    report = run("import-refused.log")
    assert ids(report, "problem") == {"import-failed"}
    [refused] = report.diagnoses
    assert refused.title.startswith("Pyxis could not import the image: efabuild's importer said refusing ngc-efa:user: ")
    assert [e.line for e in refused.evidence] == [3, 5] and "efabuild lookup --require-signature" in refused.fix


def test_a_start_that_unpacked_is_a_note_with_what_it_cost():
    report = run("unpacked-start.log")
    assert ids(report) == {"unpacked-start"} and ids(report, "info") == {"unpacked-start"}
    assert "8.45 s" in report.diagnoses[0].explanation and "use_squashfuse=1" in report.diagnoses[0].fix


def test_low_bandwidth_on_libfabric_points_at_cores_per_rank():
    report = run("low-bandwidth.log", baseline_gbps=300)
    assert ids(report, "problem") == {"low-bandwidth"}
    low = next(d for d in report.diagnoses if d.id == "low-bandwidth")
    assert "80.52 GB/s" in low.title and "--cpus-per-task" in low.fix
    assert ids(run("low-bandwidth.log", baseline_gbps=150), "problem") == set()
    assert ids(run("low-bandwidth.log"), "problem") == set()  # no baseline, nothing to compare


def test_pytorch_bandwidth_lines():
    report = run("pytorch-busbw.log", baseline_gbps=300)
    assert next(d for d in report.diagnoses if d.id == "bandwidth").title.startswith(
        "peak bus bandwidth 327.2 GB/s")


def test_ranks_with_different_plugin_versions():
    report = run("mixed-versions.log")
    mixed = next(d for d in report.diagnoses if d.id == "mixed-versions")
    assert mixed.severity == "warning" and "1.21.1 and 1.19.0" in mixed.title


def test_versions_against_an_artifact_manifest():
    manifest = {"measured": {"components": {
        "nccl": {"version": "2.30.7", "source": "/usr/include/nccl.h"},
        "aws-ofi-nccl": {"version": "1.19.0", "source": "dpkg"},
        "libfabric": {"version": "2.6.0", "source": "/opt/amazon/efa/lib/libfabric.so.1"}}}}
    report = run("efa-new.log", manifest=manifest, artifact="ngc-efa:user", ref="ngc-efa:user")
    mismatch = next(d for d in report.diagnoses if d.id == "version-mismatch")
    assert mismatch.severity == "problem"
    assert mismatch.title == "aws-ofi-nccl 1.21.1 in the job, 1.19.0 in ngc-efa:user"
    assert "efabuild lookup ngc-efa:user" in mismatch.fix
    # libfabric 2.6 in the log is the manifest's 2.6.0: NCCL logs only major.minor
    match = next(d for d in report.diagnoses if d.id == "versions-match")
    assert "nccl 2.30.7" in match.title and "libfabric 2.6.0" in match.title


def test_manifest_comparison_is_pure_and_leaves_unknowns_alone():
    # the flat form and null values: unknown is reported, never compared
    assert manifest_versions({"measured": {"nccl": {"version": "2.30.7"}, "libfabric": {"version": None}}}) == {
        "nccl": "2.30.7", "aws-ofi-nccl": None, "libfabric": None}
    report = run("efa-new.log")
    out = compare_with_manifest({k: list(v) for k, v in report.versions.items()},
                                {"measured": {"nccl": {"version": "2.30.7"}}}, "m.json")
    assert [(d.id, d.severity) for d in out] == [("versions-match", "ok"), ("versions-unknown", "info")]
    assert "aws-ofi-nccl, libfabric" in out[1].title


def test_every_rule_gives_only_the_ids_it_is_registered_with():
    """The registry is what doctor knows: each rule names the diagnoses it gives, no two rules share one."""
    from efabuild.doctor.diagnose import RULES, Seen
    from efabuild.doctor.facts import Facts
    from efabuild.doctor.scan import scan_lines

    registered = [i for r in RULES for i in r.ids]
    assert len(registered) == len(set(registered)) and all(r.catches for r in RULES)
    given = set()
    for path in sorted(LOGS.glob("*.log")):
        facts = Facts(scan_lines(path.name, path.read_text().splitlines()))
        for options in ({}, {"expect_nics": 8, "baseline_gbps": 400.0}):
            seen = Seen.of(facts, options.get("expect_nics"), options.get("baseline_gbps"))
            for r in RULES:
                out = {d.id for d in r.check(seen)}
                assert out <= set(r.ids), (path.name, r.ids, out)
                given |= out
    assert "efa-path" in given and "tcp-fallback" in given


def test_unrecognised_text():
    report = examine([("x.log", io.StringIO("hello\nworld\n"))])
    assert [d.id for d in report.diagnoses] == ["nothing-recognised"]


def test_cli_exit_codes_stdin_json_and_manifest_file(tmp_path, monkeypatch, capsys):
    assert main(["doctor", str(LOGS / "efa-new.log"), "--expect-nics", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK efa-path: NCCL runs over EFA")
    assert "versions seen: nccl 2.30.7; aws-ofi-nccl 1.21.1; libfabric 2.6" in out
    assert main(["doctor", str(LOGS / "efa-new.log"), str(LOGS / "mpi-clash.log")]) == 1
    assert capsys.readouterr().out.startswith("PROBLEM mpi-clash:")
    monkeypatch.setattr("sys.stdin", io.StringIO((LOGS / "tcp-fallback.log").read_text()))
    assert main(["doctor", "-", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["problems"] == 2 and data["diagnoses"][0]["evidence"][0]["file"] == "-"
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"measured": {"components": {"aws-ofi-nccl": {"version": "1.21.1"}}}}))
    assert main(["doctor", str(LOGS / "efa-new.log"), "--manifest", str(manifest)]) == 0
    assert "OK versions-match" in capsys.readouterr().out
    manifest.write_text("not json")
    assert main(["doctor", str(LOGS / "efa-new.log"), "--manifest", str(manifest)]) == 2
    assert main(["doctor", str(tmp_path / "absent.log")]) == 2
    err = capsys.readouterr().err
    assert "not JSON" in err and "absent.log: cannot read" in err


def test_artifact_ref_reads_the_manifest_from_the_store(tmp_path, capsys, monkeypatch):
    # a real store with one published artifact and its manifest (the .sqsh content does not matter)
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "hello").write_text("hi\n")
    sqsh = tmp_path / "a.sqsh"
    subprocess.run(["mksquashfs", str(rootfs), str(sqsh), "-noappend", "-all-root", "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    key = blake3.blake3(b"doctor test").hexdigest()
    manifest = {"key": key, "measured": {"components": {
        "nccl": {"version": "2.30.7"}, "aws-ofi-nccl": {"version": "1.19.0"}, "libfabric": {"version": None}}}}
    store = Store.at(tmp_path / "store")
    record = ArtifactRecord.for_file(key, "ngc-efa:user", sqsh, file_digest(sqsh))
    store.publish(key, sqsh, record, json.dumps(manifest).encode())
    monkeypatch.chdir(tmp_path)
    log = str(LOGS / "efa-new.log")
    assert main(["doctor", log, "--artifact", "ngc-efa:user", "--store", str(tmp_path / "store")]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM version-mismatch: aws-ofi-nccl 1.21.1 in the job, 1.19.0 in ngc-efa:user" in out
    assert "efabuild lookup ngc-efa:user" in out and "does not record libfabric" in out
    assert main(["doctor", log, "--artifact", "ngc-efa:other", "--store", str(tmp_path / "store")]) == 1
    assert "no artifact named ngc-efa:other" in capsys.readouterr().err
    assert main(["doctor", log, "--artifact", "x:y", "--manifest", "m.json"]) == 2


def test_rdma_probe_failing_on_a_sendrecv_instance_is_not_a_missing_device():
    """aws-ofi-nccl tries RDMA first; on instances without it the probe's fi_getinfo fails and the
    job runs over SENDRECV on EFA. The plugin given as a full path is the ofi plugin too."""
    report = run("g6-sendrecv.log", expect_nics=1)
    assert not report.problems and "no-efa-device" not in ids(report)
    assert "rdma-protocol-unavailable" in ids(report, "info") and "efa-path" in ids(report)
    assert "net-plugin-env" not in ids(report)


def test_libfabric_version_from_fi_info_with_the_amazon_suffix():
    assert run("fi-info-version.log").versions["libfabric"][0][0] == "2.6.0"


def test_plugin_file_name_is_cut_where_nccl_ends_it(capsys):
    """`Could not find: libnccl-net-ofi.so. Using internal network plugin.`: the missing file is
    libnccl-net-ofi.so, named once, not NCCL's sentence after it."""
    assert main(["doctor", str(LOGS / "plugin-not-found.log")]) == 1
    out = capsys.readouterr().out
    why = next(line for line in out.splitlines() if "could not load or initialise its network plugin" in line)
    assert "(libnccl-net-ofi.so);" in why
    assert "Using internal" not in why
    report = run("plugin-not-found.log")
    assert "tuner-missing" in ids(report, "info")


@pytest.mark.parametrize("line, kind, value", [
    ("pyxis:     [WARN] fuse: failed to open /dev/fuse: Permission denied{}  ", "fuse-open-failed",
     "Permission denied{}"),
    ("pyxis:     efabuild: refusing ngc-efa:user: unsigned{}\t", "importer-said", "refusing ngc-efa:user: unsigned{}"),
    ("NCCL INFO NCCL_IB_HCA set by environment to mlx5{}. ", "env", "mlx5{}"),
], ids=["fuse", "importer", "nccl-env"])
def test_a_line_with_a_long_run_of_spaces_is_read_in_linear_time(line, kind, value):
    """A job's line of 200k spaces inside a value (a progress bar redrawn with blanks) cost minutes
    per line (hours at doctor's 1 MiB cap) while a lazy group retried its `\\s*$` tail at every
    space; it is read at once, the value running to its last non-space character."""
    from efabuild.doctor.scan import scan_lines

    blanks = " " * 200_000 + "x"
    started = time.monotonic()
    found = [o for o in scan_lines("job.out", [line.format(blanks)]) if o.kind == kind]
    assert time.monotonic() - started < 5
    assert [o.value if kind != "env" else o.extra for o in found] == [value.format(blanks)]
