"""The shape of the code, as docs/CONTRIBUTING.md "Code layout" describes it: a pure core at the top of the
package, effects in the packages at the edge, and modules and functions short enough to read.

These read the source (ast), they run nothing of it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "efabuild"

# the pure core: decisions and parsing, no engine, store, network or subprocess
CORE = {"__init__", "__main__", "model", "refs", "keys", "dag", "plan", "redact", "errors", "nccl",
        "workspace", "settings", "grammar", "configfile", "tomlkeys", "notices"}
# what no core module may import: the edge packages and the modules that reach the outside world
EDGE_PACKAGES = {"build", "cli", "doctor", "engine", "export", "lint", "provenance", "pyxis", "signing",
                 "store"}
OUTSIDE_WORLD = {"subprocess", "socket", "threading", "boto3", "botocore", "python_on_whales", "docker",
                 "shutil", "sqlite3", "urllib.request", "http"}
# only these read files (the workspace, its config files, the store directories they name); the rest
# of the core touches no filesystem
READS_FILES = {"workspace", "settings", "configfile"}
FILESYSTEM = {"os", "stat", "glob", "io", "tempfile"}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# (module path, function qualname or None for the module) -> why it stays longer
EXCEPTIONS: dict[tuple[str, str | None], str] = {
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            if node.module == "efabuild":
                names.update(f"efabuild.{alias.name}" for alias in node.names)
    return names


def test_the_top_level_holds_only_the_pure_core():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top == CORE, f"modules at the top that are not the pure core: {sorted(top - CORE)}"


def test_no_core_module_reaches_the_engine_the_store_or_the_outside_world():
    problems = []
    for stem in sorted(CORE - {"__main__"}):
        tree = ast.parse((PACKAGE / f"{stem}.py").read_text())
        for name in sorted(_imports(tree)):
            parts = name.split(".")
            if parts[0] == "efabuild" and len(parts) > 1 and parts[1] in EDGE_PACKAGES:
                problems.append(f"{stem} imports {name}")
            elif name in OUTSIDE_WORLD or parts[0] in OUTSIDE_WORLD:
                problems.append(f"{stem} imports {name}")
            elif stem not in READS_FILES and parts[0] in FILESYSTEM:
                problems.append(f"{stem} imports {name}, but only {sorted(READS_FILES)} read files")
    assert not problems, "\n".join(problems)


def _long_functions(path: Path, tree: ast.AST) -> list[tuple[str, int]]:
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                length = child.end_lineno - child.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append((name, length))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return found


def test_modules_and_functions_stay_short_with_few_stated_exceptions():
    assert len(EXCEPTIONS) <= 5 and all(EXCEPTIONS.values())
    too_long = []
    for path in _modules():
        rel = str(path.relative_to(PACKAGE.parent))
        text = path.read_text()
        lines = text.count("\n") + (not text.endswith("\n"))
        if lines > MAX_MODULE_LINES and (rel, None) not in EXCEPTIONS:
            too_long.append(f"{rel}: {lines} lines")
        for name, length in _long_functions(path, ast.parse(text)):
            if (rel, name) not in EXCEPTIONS:
                too_long.append(f"{rel}:{name}: {length} lines")
    assert not too_long, "over the limits:\n" + "\n".join(too_long)
