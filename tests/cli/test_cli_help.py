"""The command line as a user meets it: help with a description and examples for every command,
no abbreviated options, shell completion that the shell accepts."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import pytest

from efabuild.cli import COMMANDS, build_parser, main
from tests.kits.storekit import REPO, efabuild


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_help_has_a_description_and_examples(command, capsys):
    parser = _command_parsers()[command]
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    shown = capsys.readouterr()
    if command == "pyxis-importer":
        # Pyxis starts whatever an exit 0 prints (tests/pyxis/test_pyxis.py): its help goes to stderr, exit 2
        assert (done.value.code, shown.out) == (2, "")
        out = shown.err
    else:
        assert done.value.code == 0
        out = shown.out
    usage, _, rest = out.partition("\n\n")
    description = rest.split("\n\n", 1)[0]
    assert usage.startswith(f"usage: efabuild {command}")
    assert len(description.split()) >= 8 and not description.startswith(("positional", "options"))
    examples = out.split("\nexamples:\n", 1)[1]
    lines = [line.strip() for line in examples.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert lines and all(f"efabuild {command}" in line or "efabuild" in line for line in lines[:1])
    # every option and argument says what it is for
    for action in parser._actions:
        assert action.help, f"efabuild {command}: {action.option_strings or action.dest} has no help"


def test_build_fixtures_help_has_a_description_and_examples(capsys):
    from fixtures.command import main as build_fixtures_main

    with pytest.raises(SystemExit) as done:
        build_fixtures_main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "does nothing when they are up to date" in out
    assert "\nexamples:\n  python3 scripts/build-fixtures.py" in out


def test_top_level_help_has_examples():
    result = efabuild("--help")
    assert result.returncode == 0 and "\nexamples:\n  efabuild plan" in result.stdout


def test_top_level_help_loads_no_command_module_and_reads_as_every_parser_built():
    """`efabuild --help`, a typo and no command are answered from the summaries: a command's module
    loads its imports at its header, and loading them all would cost the top-level help ~0.3 s."""
    probe = ("import sys\nfrom efabuild.cli import main\n"
             "for argv in (['--help'], ['pla'], []):\n"
             "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('efabuild.cli.') and m.endswith('_cmd')),"
             " file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
    # the same text as when every command's parser is built
    assert efabuild("--help").stdout == build_parser().format_help()


def _value_for(action: argparse.Action) -> list[str]:
    if action.nargs in (0, argparse.REMAINDER):  # a REMAINDER takes every word after it, options too
        return []
    return [str(action.choices[0]) if action.choices else "1"]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_abbreviated_options_are_refused(command):
    parser = build_parser()
    positionals = [v for a in _command_parsers()[command]._actions if not a.option_strings for v in _value_for(a)]
    # the required options given in full: some Pythons stop at a missing one before they
    # report an unrecognized argument (Debian bookworm's 3.11.2 among them)
    positionals += [v for a in _command_parsers()[command]._actions if a.option_strings and a.required
                    for v in (a.option_strings[-1], *_value_for(a))]
    long_options = [(option, action) for action in _command_parsers()[command]._actions
                     for option in action.option_strings if option.startswith("--") and len(option) > 4]
    assert long_options or command == "completion"
    for option, action in long_options:
        abbreviation = option[:-1]
        _, extras = parser.parse_known_args([command, *positionals, abbreviation, *_value_for(action)])
        assert abbreviation in extras, f"efabuild {command} took {abbreviation} for {option}"
    if long_options:
        option, action = long_options[0]
        result = efabuild(command, *positionals, option[:-1], *_value_for(action))
        assert result.returncode == 2 and f"unrecognized arguments: {option[:-1]}" in result.stderr


def test_bash_completion_is_valid_and_completes_commands_and_options(tmp_path):
    result = efabuild("completion", "bash")
    assert result.returncode == 0
    script = tmp_path / "efabuild.bash"
    script.write_text(result.stdout)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0

    def complete(*words: str) -> list[str]:
        probe = (f'source {script}; COMP_WORDS=(efabuild {" ".join(words)}); COMP_CWORD={len(words)}; '
                 f'_shtab_efabuild; printf "%s\\n" "${{COMPREPLY[@]}}"')
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split()

    assert complete("gr") == ["graph"]
    assert complete("lookup", "--ver") == ["--verify"]
    assert set(complete("graph", "--format", "")) >= {"text", "dot", "mermaid"}


@pytest.mark.parametrize("shell", ["zsh", "tcsh"])
def test_other_shells_get_a_script(shell):
    result = efabuild("completion", shell)
    assert result.returncode == 0 and "efabuild" in result.stdout and "lookup" in result.stdout
    if shutil.which(shell) and shell == "zsh":  # zsh -n checks syntax where zsh is installed
        assert subprocess.run(["zsh", "-n"], input=result.stdout, text=True).returncode == 0


def test_lookup_builds_only_its_own_parser_and_loads_no_completion_code(tmp_path):
    """Every job runs `efabuild lookup`: it parses with its own parser only, without help text code."""
    import sys

    from tests.kits.storekit import REPO

    (tmp_path / "BUILD.toml").write_text("")
    probe = ("import sys\nfrom efabuild.cli import main\nstatus = main(['lookup', '--no-fetch', 'demo:user'])\n"
             "print(status, ' '.join(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    status, modules = result.stdout.split(" ", 1)
    loaded = set(modules.split())
    assert status == "1" and "efabuild.cli.lookup_cmd" in loaded
    # (a miss reports through logging, whose traceback module brings textwrap: not help text)
    assert not loaded & {"efabuild.cli.plan_cmd", "efabuild.cli.completion_cmd", "shtab"}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["console script", "python -m efabuild"])
def test_a_real_process_exits_0_1_or_2_with_one_line(tmp_path, how):
    """What a shell or Slurm sees of `efabuild`: its exit status and stderr, from a process of its
    own (the other CLI tests call main() in the test process, tests/kits/inprocess.py). The console
    script is what pip's wrapper runs for [project.scripts] efabuild (this tree is not installed
    here: the shared install must not be repointed)."""
    import sys
    import tomllib

    from tests.kits.storekit import REPO

    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["efabuild"]
    module, function = target.split(":")
    command = {"console script": [sys.executable, "-c", f"import sys; from {module} import {function}; "
                                                        f"sys.exit({function}())"],
               "python -m efabuild": [sys.executable, "-m", "efabuild"]}[how]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, *args], capture_output=True, text=True, cwd=tmp_path, env=env,
                              stdin=subprocess.DEVNULL, timeout=60)

    ok = run("--version")
    assert (ok.returncode, ok.stderr) == (0, "") and ok.stdout.startswith("efabuild ")
    missing = run("lookup", "--store", str(tmp_path / "store"), "--no-fetch", "demo:user")
    assert missing.returncode == 1 and missing.stdout == "" and len(missing.stderr.splitlines()) == 1
    assert missing.stderr.startswith("efabuild: ") and "Traceback" not in missing.stderr
    typo = run("lokup", "demo:user")
    assert typo.returncode == 2 and "invalid choice: 'lokup'" in typo.stderr
