"""The docs say what the code does: the generated pages (command reference, pictures, performance)
are what scripts/make-docs.py makes from the code now, every command and option is in the
reference, relative links resolve, every `efabuild` command in a shell example parses against the
CLI (none is run), and the README's example workspace plans offline."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from efabuild.cli import COMMANDS, build_parser, main
from tests.kits.inprocess import run_efabuild

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = REPO / "README.md"


def _make_docs():
    spec = importlib.util.spec_from_file_location("make_docs", REPO / "scripts" / "make-docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


# ---------------------------------------------------------------- generated, so they cannot drift


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot draws the pictures")
def test_the_generated_docs_are_what_the_script_makes_from_the_code_now():
    files = _make_docs().generate()
    stale = [path for path, data in sorted(files.items())
             if not (DOCS / path).is_file() or (DOCS / path).read_bytes() != data]
    assert not stale, f"out of date: {stale}; run python3 scripts/make-docs.py and commit docs/"
    pages = {p.name for p in (DOCS / "reference" / "commands").glob("*.md")}
    assert pages == {Path(p).name for p in files if p.startswith("reference/commands/")}


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_that_help_shows_is_in_the_commands_page(command, capsys):
    page = (DOCS / "reference" / "commands" / f"{command}.md").read_text().replace("\\|", "|")
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = capsys.readouterr()
    help_text = shown.out or shown.err  # the importer's help goes to stderr
    options = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", help_text.split("\noptions:\n", 1)[1]
                             .split("\nexamples:\n", 1)[0]))
    assert options and all(re.search(rf"(?<![\w-]){o}(?![\w-])", page) for o in options), \
        sorted(o for o in options if o not in page)
    for action in _command_parsers()[command]._actions:
        for name in action.option_strings or [action.metavar or action.dest]:
            assert name in page, f"efabuild {command}: {name} is not in its reference page"
    usage = help_text.split("\n\n", 1)[0].split()
    assert " ".join(usage) in " ".join(page.split()), "the usage differs from --help's"
    examples = [line.strip() for line in help_text.split("\nexamples:\n", 1)[1].splitlines() if line.strip()]
    assert examples and all(example in page for example in examples)


def test_the_index_lists_every_command():
    index = (DOCS / "reference" / "commands" / "README.md").read_text()
    for command in COMMANDS:
        assert f"]({command}.md)" in index, command


# ---------------------------------------------------------------- the performance page


def _bench(mode: str) -> dict:
    def check(name: str, value: float, target: float, better: str, full: bool, unit: str = "×") -> dict:
        met = value >= target if better == "higher" else value <= target
        return {"name": name, "value": value, "target": target, "better": better, "unit": unit, "met": met,
                "full_size_only": full, "efabuild": "x", "baseline": "y"}

    return {"mode": mode, "repeats": 3, "started": "2026-11-30T10:00:00Z",
            "machine": {"nproc": 2, "cpu": "Test CPU 9000", "memory": "8.0 GiB", "kernel": "6.1.0",
                        "python": "3.11.2", "docker": "26.1.5", "mksquashfs": "mksquashfs version 4.6.1",
                        "blake3": "1.0.0", "boto3": "1.34.0"},
            "scenarios": [{"id": "chunked", "what": "one file changed", "error": None, "notes": ["a note"],
                           "checks": [check("publish: bytes sent", 9.2, 1.0, "lower", True, "%"),
                                      check("ls: time vs listing the records", 4.0, 3.0, "lower", False),
                                      check("vs boto3 upload_file", 2.5, 1.0, "higher", False)]},
                          {"id": "plan", "what": "no-op", "error": "BenchError: no engine", "checks": []}]}


def _rows(page: str) -> dict[str, list[str]]:
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] not in ("scenario", "---"):
            rows[cells[1]] = cells
    return rows


def test_a_quick_runs_full_size_target_is_not_applicable_and_a_real_miss_is_missed():
    page = _make_docs().performance_page(_bench("quick"), "bench.json")
    rows = _rows(page)
    assert rows["publish: bytes sent"][4:] == ["9.2 %", "≤ 1.0 %", "n/a at this size"]
    assert rows["ls: time vs listing the records"][6] == "**missed**"
    assert rows["vs boto3 upload_file"][4:] == ["2.50×", "≥ 1.00×", "yes"]
    assert "error: BenchError: no engine" in page


def test_at_full_size_the_same_figure_is_a_miss():
    rows = _rows(_make_docs().performance_page(_bench("full"), "bench.json"))
    assert rows["publish: bytes sent"][6] == "**missed**"


def test_the_performance_page_names_the_machine_and_versions():
    page = _make_docs().performance_page(_bench("quick"), "bench.json")
    header = page.split("\n| scenario")[0]
    for fact in ("2 vCPU Test CPU 9000", "8.0 GiB", "Linux 6.1.0", "Python 3.11.2", "Docker 26.1.5",
                 "blake3 1.0.0", "boto3 1.34.0", "--quick", "2026-11-30T10:00:00Z"):
        assert fact in header, fact


def _committed_bench() -> dict:
    return json.loads((DOCS / "performance" / "bench.json").read_text())


def test_the_committed_bench_json_is_one_full_size_run_of_every_scenario():
    data = _committed_bench()
    assert data["mode"] == "full" and data["machine"]["nproc"]
    assert "transcribed" not in data, "figures copied by hand are not a run"
    assert re.fullmatch(r"[0-9a-f]{12}", data["run_id"])
    assert re.fullmatch(r"[0-9a-f]{40}", data["commit"]) and data["dirty"] is False
    assert data["started"] < data["finished"] and data["seconds"] > 0
    assert all(len(data[k]) == 3 and all(x >= 0 for x in data[k]) for k in ("load_before", "load_after"))
    bench = (REPO / "scripts" / "bench.py").read_text()
    every = list(eval(re.search(r"SCENARIOS = (\(.*?\))", bench, re.S).group(1)))  # noqa: S307
    assert data["selected"] == every and [s["id"] for s in data["scenarios"]] == every
    assert not [s["id"] for s in data["scenarios"] if s["error"]]
    for scenario in data["scenarios"]:
        for check in scenario["checks"]:
            assert {"name", "value", "target", "better", "unit", "met", "full_size_only"} <= set(check)
    if (REPO / ".git").exists() and shutil.which("git"):  # the run's commit is in this history
        known = subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", data["commit"], "HEAD"])
        assert known.returncode == 0, f"commit {data['commit']} is not an ancestor of HEAD"


def test_the_performance_page_is_what_its_json_makes():
    made = _make_docs().performance_page(_committed_bench(), "docs/performance/bench.json")
    assert (DOCS / "performance.md").read_text() == made, "run python3 scripts/make-docs.py and commit docs/"
    assert "full size" in made.split("\n\n")[2]


# ---------------------------------------------------------------- links


def _prose(text: str) -> str:
    """The text outside code blocks and code spans, where Markdown makes links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", _without_code_blocks(path.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def test_every_relative_link_resolves():
    broken = []
    for page in _pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_page_is_reachable_from_the_readme():
    seen, todo = set(), [README.resolve()]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.is_file():
            continue
        seen.add(page)
        for target in re.findall(r"\]\(([^)\s#]+)", _prose(page.read_text())):
            if not re.match(r"[a-z]+:", target):
                todo.append((page.parent / target).resolve())
    missing = [str(p.relative_to(REPO)) for p in DOCS.rglob("*.md") if p.resolve() not in seen]
    assert not missing, missing


# ---------------------------------------------------------------- shell examples


SHELL_BLOCKS = {"sh", "bash", "shell", "console", ""}


def _shell_lines(text: str) -> list[str]:
    """Command lines of the shell examples: every line of a sh block, the `$ ` lines of others."""
    lines = []
    for language, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if language not in SHELL_BLOCKS:
            continue
        joined = re.sub(r"\\\n\s*", " ", body)
        for line in joined.splitlines():
            if line.startswith("$ "):
                lines.append(line[2:])
            elif language in ("sh", "bash", "shell"):
                lines.append(line)
    return lines


def _efabuild_commands(line: str) -> list[list[str]]:
    """The argument lists of every `efabuild` command in a shell line, `$(…)` and pipelines too."""
    lexer = shlex.shlex(line.replace("$(", " ( "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], None
    for token in lexer:
        if token and set(token) <= set("();|&<>"):
            if current is not None:
                commands.append(current)
            current = None
            if ">" in token or "<" in token:  # the redirection's file is no argument
                next(lexer, None)
            continue
        if current is None:
            if re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", token):  # VAR=value before the command
                continue
            current = [] if token == "efabuild" else None
            if current is None:
                current = False  # another program: skip to the next separator
            continue
        if current is not False:
            current.append(token)
    if current is not None:
        commands.append(current)
    return [c for c in commands if c is not False]


def test_the_example_extractor_finds_commands_in_substitutions_and_pipelines():
    assert _efabuild_commands("srun --container-image=$(efabuild lookup --store /fsx x:y) hostname") \
        == [["lookup", "--store", "/fsx", "x:y"]]
    assert _efabuild_commands("EFABUILD_STORE=/fsx efabuild audit --all  # on a node") == [["audit", "--all"]]
    assert _efabuild_commands("efabuild completion bash > /etc/x && efabuild ls") \
        == [["completion", "bash"], ["ls"]]
    assert _efabuild_commands("chgrp -R g /fsx && chmod g+s /fsx") == []


def _parse_problem(args: list[str]) -> str | None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(args)
        except SystemExit as exc:
            if exc.code not in (0, None):
                return err.getvalue().strip().splitlines()[-1]
    return None


def test_every_efabuild_command_in_a_shell_example_parses():
    problems, seen = [], 0
    for page in _pages():
        for line in _shell_lines(page.read_text()):
            for args in _efabuild_commands(line):
                seen += 1
                problem = _parse_problem(args)
                if problem:
                    problems.append(f"{page.relative_to(REPO)}: efabuild {' '.join(args)}: {problem}")
    assert seen > 50 and not problems, "\n".join(problems)


def test_a_wrong_example_would_be_caught():
    assert _parse_problem(["gc", "[--keep", "N]"])
    assert _parse_problem(["lookup", "--ver", "x"])  # no abbreviations
    assert _parse_problem(["make", "demo"]) is None


# ---------------------------------------------------------------- the README


def _workspace_from(page: Path, root: Path) -> list[str]:
    """Write a page's example workspace (toml blocks whose first line names their file) into root."""
    written = []
    for block in re.findall(r"^```toml\n(.*?)^```", page.read_text(), flags=re.S | re.M):
        first = block.splitlines()[0]
        if re.fullmatch(r"# (BUILD\.toml|graphs/[\w.-]+\.toml)", first):
            path = root / first[2:]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block)
            written.append(first[2:])
    return written


@pytest.mark.parametrize("page", [README, DOCS / "getting-started.md"], ids=["README", "getting-started"])
def test_the_example_workspace_plans_offline_and_lints_without_errors(page, tmp_path):
    written = _workspace_from(page, tmp_path)
    assert "BUILD.toml" in written and any(w.startswith("graphs/") for w in written)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "train.py").write_text("print('training')\n")
    done = run_efabuild(["plan", "--offline", "--json"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    layers = {layer["name"]: layer for layer in json.loads(done.stdout)["layers"]}
    assert set(layers) == {"train:efa", "train:user"}
    assert all(layer["state"] == "to build" for layer in layers.values())
    # the commands the page shows next name its layers
    text = page.read_text()
    assert "efabuild make train" in text and "train:user" in text
    linted = run_efabuild(["lint"], cwd=tmp_path)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_readme_is_short_and_keeps_its_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    for command in ("bash scripts/run-demo.sh", "bash scripts/run-tests.sh"):
        assert f"\n{command} " in text, command


# ---------------------------------------------------------------- hand-written lists that follow the code


def test_the_lint_guide_lists_every_rule_with_its_severity():
    from efabuild.lint.finding import RULES

    table = dict(re.findall(r"^\| (EFA\d{3}) \| (\w+) \|", (DOCS / "guides" / "lint.md").read_text(), flags=re.M))
    assert table == {rule.id: rule.severity for rule in RULES.values()}


def test_lint_help_names_the_range_of_rules_there_are():
    from efabuild.lint.finding import RULES

    help_text = " ".join(_command_parsers()["lint"].format_help().split())
    assert f"rules {min(RULES)}-{max(RULES)}," in help_text


def test_the_json_page_names_every_command_that_takes_json():
    takes_json = {name for name, parser in _command_parsers().items()
                  if any("--json" in action.option_strings for action in parser._actions)}
    listed = re.search(r"Every `--json` \(([^)]*)\)", (DOCS / "reference" / "json.md").read_text()).group(1)
    named = {word.split()[0] for word in re.split(r",\s*", " ".join(listed.split()))}
    assert named == takes_json


def test_the_environment_page_names_every_efabuild_variable_the_code_reads():
    read = set()
    for source in (REPO / "efabuild").rglob("*.py"):
        read |= set(re.findall(r"\b(EFABUILD_[A-Z_]+)\b", source.read_text()))
    page = (DOCS / "reference" / "environment.md").read_text()
    assert read and not {name for name in read if f"`{name}`" not in page}
