"""Job-script rules: host EFA libraries mounted or put on the library path, NCCL settings exported
into the job, cores per rank (tests/data/lint/scripts/, markers as in test_lint_rules.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from efabuild.cli import main
from efabuild.lint import lint_workspace
from efabuild.lint.scripts import is_job_script, job_scripts, lint_script
from efabuild.workspace import load_workspace
from tests.lint.test_lint_rules import expected_findings
from tests.kits.wsfactory import make_workspace

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "lint" / "scripts"
GRAPH = """\
[layers.app]
base = "nvcr.io/nvidia/pytorch:26.08-py3"
digest = "sha256:""" + "ab" * 32 + """"
dockerfile = '''
RUN echo app
'''
"""


def test_bad_job_script_reports_each_marked_line():
    path = SCRIPTS / "bad.sbatch"
    findings = lint_script(path, "scripts/bad.sbatch")
    expected = expected_findings(path.read_text())
    assert sorted((f.rule, f.line) for f in findings) == sorted((r, line) for r, line, _ in expected)
    for rule, line, part in expected:
        if part:
            assert any(f.rule == rule and f.line == line and part in f.message for f in findings)
    assert all(f.layer is None and f.file == "scripts/bad.sbatch" for f in findings)
    assert {f.severity for f in findings if f.rule in ("EFA006", "EFA007", "EFA008", "EFA009")} == {"error"}
    assert {f.severity for f in findings if f.rule in ("EFA015", "EFA016")} == {"info"}


def test_good_job_script_is_clean():
    findings = lint_script(SCRIPTS / "good.sbatch", "scripts/good.sbatch")
    assert [(f.rule, f.severity, f.line) for f in findings] == [("EFA019", "info", 10)]  # its start mode, named


def problems(findings):
    """All but the start-mode note (EFA019), which every script that starts a container gets."""
    return [f for f in findings if f.rule != "EFA019"]


def test_only_job_scripts_are_linted(tmp_path, monkeypatch, capsys):
    root = make_workspace(tmp_path / "ws", graphs={"g": GRAPH}, files={})
    (root / "scripts" / "jobs").mkdir(parents=True)
    for name in ("bad.sbatch", "good.sbatch", "not-a-job.sh"):
        shutil.copy(SCRIPTS / name, root / "scripts" / "jobs" / name)
    (root / "scripts" / "notes.txt").write_text("srun --container-mounts=/opt/amazon:/opt/amazon\n")
    assert [p.name for p in job_scripts(root)] == ["bad.sbatch", "good.sbatch"]
    assert not is_job_script(root / "scripts" / "jobs" / "not-a-job.sh")
    findings = lint_workspace(load_workspace(root))
    assert {f.file for f in problems(findings)} == {"scripts/jobs/bad.sbatch"}
    # naming a graph lints just that graph; naming a script lints just that script
    assert lint_workspace(load_workspace(root), ["g"]) == []
    monkeypatch.chdir(root)
    assert main(["lint", "scripts/jobs/good.sbatch"]) == 0
    assert main(["lint", "scripts/jobs/bad.sbatch"]) == 1
    assert "scripts/jobs/bad.sbatch:8: EFA009 error:" in capsys.readouterr().out


def test_cores_given_on_srun_or_salloc_count(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\nsalloc -N 2 -c 24 --gres=gpu:8\nsrun --container-image=/fsx/a.sqsh true\n")
    assert problems(lint_script(script, "run.sh")) == []
    script.write_text("#!/bin/bash\nsrun --container-image=/fsx/a.sqsh --cpus-per-task 24 true\n")
    assert problems(lint_script(script, "run.sh")) == []


def test_variables_handed_over_with_srun_export_are_checked(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n#SBATCH -c 24\n"
                      "srun --export=ALL,NCCL_DEBUG=INFO,NCCL_IB_GID_INDEX=3 --container-image=/fsx/a.sqsh true\n"
                      "NCCL_NET_PLUGIN=ofi LD_LIBRARY_PATH=/opt/amazon/efa/lib srun --container-name=a true\n")
    assert sorted((f.rule, f.line) for f in problems(lint_script(script, "run.sh"))) == [("EFA007", 3), ("EFA009", 4)]


def test_the_start_mode_a_script_chose_and_starts_that_unpack_where_one_would_mount(tmp_path):
    """Pyxis (0.22 or later, use_squashfuse=1) starts from the .sqsh only an unnamed container that
    is not saved: a name no later srun reuses, or --container-save, unpacks the whole image again
    (8.45 s against 1.17 s for the bench's 1.44 GB image)."""
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n#SBATCH -c 24\n"
                      "srun --container-image=/fsx/a.sqsh --container-name=train true\n"
                      "srun --container-name=train:exec python train.py\n"
                      "srun --container-image=/fsx/a.sqsh python eval.py\n"
                      "srun --container-image=/fsx/a.sqsh python eval2.py\n")
    notes = lint_script(script, "run.sh")
    assert [(f.rule, f.severity, f.line) for f in notes] == [("EFA019", "info", 3), ("EFA019", "info", 5)]
    assert "unpack once per node and reuse by name (train)" in notes[0].message
    assert "mount per step" in notes[1].message and "use_squashfuse=1" in notes[1].message

    script.write_text("#!/bin/bash\n#SBATCH -c 24\n"
                      "srun --container-image=/fsx/a.sqsh --container-name=once python train.py\n"
                      "srun --container-image=/fsx/a.sqsh --container-save=/fsx/after.sqsh python setup.py\n")
    warnings = lint_script(script, "run.sh")
    assert [(f.rule, f.severity, f.line) for f in warnings] == [("EFA020", "warning", 3), ("EFA020", "warning", 4)]
    assert "names its container (once) but no other srun uses the name" in warnings[0].message
    assert warnings[1].message.startswith("--container-save: Pyxis unpacks the image for this step")


def test_a_name_given_once_in_a_loop_is_reused_by_its_later_rounds(tmp_path):
    """EFA020 counted the srun's text, not its runs: a loop over steps with one named srun was
    warned that no other srun uses the name, though every round after the first reuses it."""
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\n#SBATCH -c 24\n"
                      "for step in 1 2 3; do\n"
                      "  srun --container-image=/fsx/a.sqsh --container-name=train python train.py --step $step\n"
                      "done\n"
                      "while read -r cfg; do srun --container-image=/fsx/a.sqsh --container-name=ev eval \"$cfg\"\n"
                      "done <configs\n"
                      "echo all done; srun --container-image=/fsx/a.sqsh --container-name=once python report.py\n")
    findings = lint_script(script, "run.sh")
    assert [(f.rule, f.line) for f in findings] == [("EFA019", 4), ("EFA020", 8)]
    assert "names its container (once)" in findings[1].message


def test_a_fixed_container_name_for_an_image_a_make_moves_is_an_error(tmp_path):
    """Pyxis keeps a named container after the job (container_scope=global): a fixed name given to
    `efabuild lookup NAME` or efabuild://NAME starts the previous build's container in the next job."""
    script = tmp_path / "run.sh"
    cases = {
        'srun --container-image="$(efabuild lookup ngc-efa:user)" --container-name=train true': "ngc-efa:user",
        'IMAGE=$(efabuild lookup --require-signature --store /fsx/s ngc-efa:user@linux/arm64)\n'
        'srun --container-image="$IMAGE" --container-name=train:no_exec true': "ngc-efa:user",
        "srun --container-image=efabuild://demo:user --container-name=train true": "demo:user",
        'REF=demo:user\nsrun --container-image="efabuild://$REF" --container-name=train true': "demo:user",
        # a key looked up from the name is this job's build, and the next job's is the next build's
        'KEY=$(efabuild lookup --key ngc-efa:user)\n'
        'srun --container-image="$(efabuild lookup "$KEY")" --container-name=train true': "ngc-efa:user",
        'KEY=$(efabuild lookup --key demo:user)\nsrun --container-image="efabuild://$KEY" --container-name=train true':
            "demo:user",
        # a fixed name through a variable
        'NAME=train\nsrun --container-image=efabuild://demo:user --container-name="$NAME" true': "demo:user",
    }
    for body, name in cases.items():
        script.write_text(f"#!/bin/bash\n#SBATCH -c 24\n{body}\nsrun --container-name=train python t.py\n")
        stale = [f for f in lint_script(script, "run.sh") if f.rule == "EFA024"]
        assert [(f.severity, f.line) for f in stale] == [("error", body.count("\n") + 3)], body
        assert f"--container-name=train is fixed but the image follows {name}" in stale[0].message
        assert 'KEY=$(efabuild lookup --key' in stale[0].fix and "train-${KEY:0:12}" in stale[0].fix
    # what never moves: a name carrying the key, a key written out, a path, no name at all
    for body in ('KEY=$(efabuild lookup --key ngc-efa:user)\n'
                 'srun --container-image="$(efabuild lookup "$KEY")" --container-name="train-${KEY:0:12}" true',
                 'KEY=$(efabuild lookup --key ngc-efa:user)\nNAME="train-${KEY:0:12}"\n'
                 'srun --container-image="efabuild://$KEY" --container-name="$NAME" true',
                 f"srun --container-image=efabuild://{'ab' * 32} --container-name=train true",
                 "srun --container-image=/fsx/a.sqsh --container-name=train true",
                 'srun --container-image="$(efabuild lookup ngc-efa:user)" true'):
        script.write_text(f"#!/bin/bash\n#SBATCH -c 24\n{body}\nsrun --container-name=train python t.py\n")
        assert not [f for f in lint_script(script, "run.sh") if f.rule == "EFA024"], body


def test_the_example_job_names_its_container_by_the_key_and_its_old_form_was_stale(tmp_path):
    example = Path(__file__).resolve().parents[2] / "scripts" / "example-job.sbatch"
    findings = lint_script(example, "scripts/example-job.sbatch")
    assert not [f for f in findings if f.severity != "info"], findings
    # the form it had before: a fixed name for the name's latest build
    old = tmp_path / "old.sbatch"
    old.write_text(example.read_text().replace('--container-name="$NAME"', "--container-name=train")
                   .replace('"$KEY")', "ngc-efa:user)"))
    assert [f.rule for f in lint_script(old, "old.sbatch") if f.rule == "EFA024"] == ["EFA024", "EFA024"]
