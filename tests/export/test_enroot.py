"""The files Enroot writes from an image config, byte for byte.

The expected texts were produced by Enroot's own import code (docker::configure, Enroot 3.x-4.x)
run on the same configs; they are spelled out here so the test needs no Enroot.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efabuild.export.enroot import (
    RC_LOCAL_TEXT,
    ImageConfig,
    bash_quote,
    enroot_files,
    environment_text,
    fstab_text,
    rc_text,
)

NGC_LIKE = {
    "Env": ["PATH=/usr/bin", "A=b c"],
    "Labels": {"z.b": "2", "a.x": "1 2", "m": ""},
    "WorkingDir": "/workspace",
    "Entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"],
    "Cmd": None,
    "Volumes": {"/data": {}, "/a b": {}},
}

RC_TAIL = """
if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

if [ $# -gt 0 ]; then
"""


def test_ngc_like_config_gives_enroots_files() -> None:
    files = enroot_files(ImageConfig.from_docker(NGC_LIKE))
    assert files["etc/environment"] == "PATH=/usr/bin\nA=b c\n"
    # jq's `keys` sorts the volumes; ${ENROOT_ROOTFS} stays literal for Enroot to expand
    assert files["etc/fstab"] == (
        "${ENROOT_ROOTFS}/a b /a b none x-create=dir,bind,rw,nosuid,nodev\n"
        "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n"
    )
    assert files["etc/rc"] == (
        "# a.x 1 2\n# m \n# z.b 2\n"
        "\n"
        'mkdir -p "/workspace" 2> /dev/null\n'
        'cd "/workspace" && unset OLDPWD || exit 1\n'
        + RC_TAIL
        + "    exec '/opt/nvidia/nvidia_entrypoint.sh' \"$@\"\n"
        "else\n"
        "    exec '/opt/nvidia/nvidia_entrypoint.sh' \n"
        "fi\n"
    )
    assert files["etc/rc.local"] == (
        "# This file is sourced by /etc/rc when the container starts.\n"
        "# It can be used to manipulate the entrypoint or the command of the container.\n"
    )


def test_empty_config_runs_a_shell_in_root() -> None:
    cfg = ImageConfig.from_docker({})
    assert environment_text(cfg) == ""
    assert fstab_text(cfg) == ""
    assert rc_text(cfg) == (
        'mkdir -p "/" 2> /dev/null\n'
        'cd "/" && unset OLDPWD || exit 1\n'
        + RC_TAIL
        + '    exec  "$@"\n'
        "else\n"
        "    exec  '/bin/sh'\n"
        "fi\n"
    )
    assert cfg.workdir == "/"


def test_cmd_words_are_quoted_like_bash_and_split_on_newlines() -> None:
    cfg = ImageConfig.from_docker(
        {"Cmd": ["python", "-c", "print('hi')", "it's", "a\tb", "x\ny", ""], "WorkingDir": ""}
    )
    assert "    exec  'python' '-c' 'print('\\''hi'\\'')' 'it'\\''s' $'a\\tb' 'x' 'y' ''\n" in rc_text(cfg)


def test_entrypoint_and_cmd_both_appear() -> None:
    cfg = ImageConfig.from_docker({"Entrypoint": ["/bin/tini", "--"], "Cmd": ["bash"], "Labels": {"k": "vü"}})
    text = rc_text(cfg)
    assert text.startswith("# k vü\n\n")
    assert "    exec '/bin/tini' '--' \"$@\"\nelse\n    exec '/bin/tini' '--' 'bash'\nfi\n" in text


def test_lower_case_keys_and_nulls_from_enroots_downcased_inspect() -> None:
    cfg = ImageConfig.from_docker({"env": None, "labels": None, "workingdir": None, "cmd": ["sh"]})
    assert cfg == ImageConfig(cmd=("sh",))


def test_rc_local_text_is_the_constant() -> None:
    assert enroot_files(ImageConfig())["etc/rc.local"] == RC_LOCAL_TEXT


# ASCII with control characters, and a few printable non-ASCII letters (wider Unicode differs
# between Python's isprintable and glibc's iswprint in corners that no image uses)
_WORDS = st.text(
    alphabet=st.sampled_from([chr(c) for c in range(1, 128)] + list("éü한")), max_size=12
)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is the reference for ${x@Q}")
@settings(max_examples=40, deadline=None)
@given(st.lists(_WORDS, min_size=1, max_size=6))
def test_bash_quote_evaluates_to_the_word_in_bash(words: list[str]) -> None:
    """What matters to /etc/rc is that bash reads each quoted word back as the word itself."""
    script = 'for q in "$@"; do eval "w=$q"; printf "%s\\0" "$w"; done'
    out = subprocess.run(
        ["bash", "-c", script, "bash", *[bash_quote(w) for w in words]],
        capture_output=True, check=True, env={"LC_ALL": "C.UTF-8"},
    ).stdout.decode("utf-8", "surrogateescape")
    assert out.split("\0")[:-1] == words


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is the reference for ${x@Q}")
@pytest.mark.parametrize("word", ["'", "''", "a'b", "it's", "", "plain", "tab\there", "new\nline", "é", "\x7f", "$x `y`"])
def test_bash_quote_writes_what_bash_writes(word: str) -> None:
    """Byte for byte as `${w@Q}`, so /etc/rc is the file Enroot writes (bash quotes a lone `'` as `\\'`)."""
    out = subprocess.run(["bash", "-c", 'printf "%s" "${1@Q}"', "bash", word],
                         capture_output=True, check=True, env={"LC_ALL": "C.UTF-8"}).stdout.decode()
    assert bash_quote(word) == out


@pytest.mark.parametrize("value", ["line one\ntouch {marker}", "it's\nbroken", "a\n\n\nb\n"])
def test_a_label_with_newlines_stays_one_comment_line_as_enroot_writes_it(tmp_path, value) -> None:
    """Enroot ≥ 4.1.2 writes label newlines as spaces. A label copied into /etc/rc with its newline
    ran its second line as a command at every container start, or broke the script's syntax."""
    marker = tmp_path / "ran"
    value = value.format(marker=marker)
    cfg = ImageConfig.from_docker({"Labels": {"org.example.note": value}, "Cmd": ["true"],
                                   "WorkingDir": str(tmp_path)})
    rc = rc_text(cfg)
    assert rc.startswith(f"# org.example.note {value.replace(chr(10), ' ')}\n\n")
    script = tmp_path / "rc"
    script.write_text(rc)
    # Enroot starts the container with `/etc/rc` run by the image's bash
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=10)
    assert (done.returncode, done.stderr) == (0, "")
    assert not marker.exists()
