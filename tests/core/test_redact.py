"""redact: which names and values are secrets, and what is shown in their place.

test_secrets attacks a real build from every place a value could leak to; these are the decisions
it relies on, checked one by one.
"""

from __future__ import annotations

import pytest

from efabuild.redact import (
    REDACTED,
    Redactor,
    dockerfile_secret_values,
    is_secret_arg,
    shown_args,
    shown_dockerfile,
    shown_value,
)

TOKEN = "hf_" + "a1B2" * 9  # shaped like a Hugging Face token


@pytest.mark.parametrize("name", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "NGC_API_KEY",
                                  "github-token", "ssh_private_key", "MY_PASSPHRASE", "SESSION_KEY"])
def test_secret_names(name):
    assert is_secret_arg(name, "some value")


@pytest.mark.parametrize("name", ["EFA_INSTALLER_VERSION", "CUDA_ARCH", "HYBRID_EP_COMMIT", "KEY_ORDER"])
def test_other_names_are_shown(name):
    assert not is_secret_arg(name, "1.50.0")
    assert shown_value(name, "1.50.0") == "1.50.0"


@pytest.mark.parametrize("value", [TOKEN, "AKIA" + "ABCDEFGHIJKLMNOP", "ghp_" + "x" * 36, "nvapi-" + "y" * 24,
                                   "https://user:hunter2@example.com/repo.git",
                                   "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n"])
def test_secret_values_under_any_name(value):
    assert is_secret_arg("SOURCE", value)
    assert value not in shown_value("SOURCE", value)


def test_a_stand_in_shows_a_change_but_never_the_value():
    first, second = shown_value("HF_TOKEN", "value-one"), shown_value("HF_TOKEN", "value-two")
    assert first.startswith("<redacted ") and "value-one" not in first
    assert first != second  # a changed secret still shows as a change in a plan
    assert shown_value("HF_TOKEN", first) == first  # idempotent: a stand-in is not hidden again
    assert shown_args({"HF_TOKEN": "value-one", "RUN_ID": "7"}) == {"HF_TOKEN": first, "RUN_ID": "7"}


def test_dockerfile_defaults_are_hidden_with_their_quotes_kept():
    text = f'ARG HF_TOKEN="{TOKEN}"\nENV DB_PASSWORD=hunter22\nARG CUDA=12.4\nRUN echo hi\n'
    assert dockerfile_secret_values(text) == [TOKEN, "hunter22"]
    shown = shown_dockerfile(text)
    assert TOKEN not in shown and "hunter22" not in shown
    lines = shown.splitlines()
    assert lines[0].startswith('ARG HF_TOKEN="<redacted ') and lines[0].endswith('>"')
    assert lines[2:] == ["ARG CUDA=12.4", "RUN echo hi"]
    assert shown_dockerfile(shown) == shown


def test_the_redactor_hides_every_occurrence_and_each_line_of_a_multi_line_secret():
    key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"
    redact = Redactor([key, "abc", "token-123", "token-123456"])
    assert redact(f"a {key} b") == f"a {REDACTED} b"
    assert redact("#5 MIIEvQIBADANBgkqhkiG9w0BAQEFAASC") == f"#5 {REDACTED}"  # a log shows it line by line
    # the longer secret first: no tail of it is left behind
    assert redact("token-123456 and token-123") == f"{REDACTED} and {REDACTED}"
    short = "abc stays: too short to hide without hiding the log"
    assert redact(short) == short
    assert not Redactor(["ab", "  "]) and Redactor(["abcd"])


def test_a_build_hides_its_secret_args_and_its_buildkit_secrets_only():
    redact = Redactor.for_build({"HF_TOKEN": "arg-secret", "RUN_ID": "run-4242"}, ["SECRET_ENV", "UNSET"],
                                {"SECRET_ENV": "from-the-environment", "OTHER": "not-used"})
    assert redact("arg-secret from-the-environment run-4242 not-used") == f"{REDACTED} {REDACTED} run-4242 not-used"
