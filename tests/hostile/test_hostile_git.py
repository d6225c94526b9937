"""A workspace's git state becomes image labels: a remote URL's secrets must not, and a git that
hangs must not hold make for more than one timeout."""

from __future__ import annotations

import os
import subprocess

import pytest

from efabuild.make import gitstate
from efabuild.make.gitstate import REVISION, SOURCE, git_labels, vcs_of


def _repo(path, url):
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.email=a@b", "-c", "user.name=n", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    subprocess.run(["git", "-C", str(path), "config", "remote.origin.url", url], check=True)


@pytest.mark.parametrize(("url", "source"), [
    ("https://user:pa@SECRET@git.example.com/r.git", "https://git.example.com/r.git"),  # a raw @ in the password
    ("https://git.example.com/r.git?private_token=SECRET", "https://git.example.com/r.git"),
    ("https://git.example.com/r.git#SECRET", "https://git.example.com/r.git"),
    ("ssh://git:SECRET@git.example.com:2222/r", "ssh://git.example.com:2222/r"),
    ("user:SECRET@git.example.com:r.git", "git.example.com:r.git"),
    ("git@git.example.com:team/r.git", "git@git.example.com:team/r.git"),  # a user name, no secret
    ("user:pa@SECRET@git.example.com:r.git", "git.example.com:r.git"),
    ("user:pa/SECRET@git.example.com:r.git", "git.example.com:r.git"),
    # an @ in the path is the path's: the URL stays whole
    ("git@git.example.com:team/stack@v2.git", "git@git.example.com:team/stack@v2.git"),
    ("builder@git.example.com:/srv/infra@2026/stack.git", "builder@git.example.com:/srv/infra@2026/stack.git"),
])
def test_no_part_of_a_remote_url_s_password_or_token_reaches_a_label(tmp_path, url, source):
    _repo(tmp_path, url)
    labels = git_labels(tmp_path)
    assert labels[SOURCE] == source
    assert not any("SECRET" in value for value in labels.values())


@pytest.mark.slow
def test_a_config_including_a_fifo_costs_one_timeout_not_one_per_question(tmp_path, monkeypatch):
    """git reads its config (and what it includes) for every command: a FIFO there blocks each one
    until its timeout. The first that times out ends the questions."""
    _repo(tmp_path, "https://git.example.com/r.git")
    os.mkfifo(tmp_path / "hang")
    subprocess.run(["git", "-C", str(tmp_path), "config", "include.path", str(tmp_path / "hang")], check=True)
    monkeypatch.setattr(gitstate, "_TIMEOUT_S", 1)
    real_run, runs = subprocess.run, []

    def counted(argv, **kwargs):  # the real git, counted
        runs.append(argv)
        return real_run(argv, **kwargs)

    monkeypatch.setattr(subprocess, "run", counted)
    assert git_labels(tmp_path) == {}
    assert len(runs) == 1


def test_a_repository_another_user_owns_gives_no_labels(tmp_path):
    """As root in a workspace under another user's checkout, git refuses the repository (its
    safe.directory check): nothing of theirs is read or run."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the checkout to another user")
    _repo(tmp_path / "theirs", "https://git.example.com/theirs.git")
    subprocess.run(["git", "-C", str(tmp_path / "theirs"), "config", "core.fsmonitor",
                    f"touch {tmp_path}/ran"], check=True)
    (tmp_path / "theirs" / "ws").mkdir()
    subprocess.run(["chown", "-R", "nobody", str(tmp_path / "theirs")], check=True)
    assert git_labels(tmp_path / "theirs" / "ws") == {}
    assert not (tmp_path / "ran").exists()
    assert REVISION not in git_labels(tmp_path / "theirs")


def test_a_remote_url_too_long_for_an_argument_is_no_source_label(tmp_path):
    """Labels reach `docker buildx build` as arguments: a 200 KB origin URL in .git/config failed
    every build with 'Argument list too long', naming neither the URL nor the file."""
    _repo(tmp_path, "https://git.example.com/r.git")
    with open(tmp_path / ".git" / "config", "a") as config:
        config.write('[remote "origin"]\n\turl = https://git.example.com/' + "a" * 200_000 + "\n")
    labels = git_labels(tmp_path)
    assert REVISION in labels and SOURCE not in labels


def test_a_manifest_takes_only_well_formed_git_labels_from_an_image():
    """An image on a shared engine or from a registry may carry any label: the manifest's vcs keeps
    a commit id and a printable URL without its credentials, nothing else."""
    commit = "a" * 40
    assert vcs_of({REVISION: commit, SOURCE: "https://bot:t0ken@git.example.com/t.git?x=1"}) == {
        "revision": commit, "source": "https://git.example.com/t.git"}
    assert vcs_of({REVISION: commit, SOURCE: "https://x/\x1b[2Jy.git"}) == {"revision": commit}
    assert vcs_of({REVISION: commit + "\n# forged", SOURCE: "https://x/y.git"}) == {}
    assert vcs_of({REVISION: "", SOURCE: "https://x/y.git"}) == vcs_of({}) == {}
