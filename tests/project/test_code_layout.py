"""The shape of the code, as docs/CONTRIBUTING.md "Code layout" describes it: a pure core at the top
of the package, effects in the packages at the edge, floors that import only downwards and in no
circle, and modules and functions short enough to read.

These read the source (ast), they run nothing of it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).resolve().parents[2] / "efabuild"

# the pure core: decisions and parsing, no engine, store, network or subprocess
CORE = {"__init__", "__main__", "model", "refs", "keys", "dag", "plan", "redact", "errors", "nccl",
        "workspace", "settings", "storesettings", "grammar", "configfile", "tomlkeys", "notices", "display", "platforms"}
# what no core module may import: the edge packages and the modules that reach the outside world
EDGE_PACKAGES = {"make", "cli", "doctor", "host", "engine", "export", "lint", "provenance", "pyxis", "signing",
                 "store"}
OUTSIDE_WORLD = {"subprocess", "socket", "threading", "boto3", "botocore", "python_on_whales", "docker",
                 "shutil", "sqlite3", "urllib.request", "http"}
# only these read files (the workspace, its config files, the store directories they name); the rest
# of the core touches no filesystem
READS_FILES = {"workspace", "settings", "storesettings", "configfile"}
FILESYSTEM = {"os", "stat", "glob", "io", "tempfile"}
# core modules that import a filesystem module for its names alone -> why
NAMES_ONLY = {("display", "os"): "os.fspath: a path's text for a message, no file touched"}
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
            elif stem not in READS_FILES and parts[0] in FILESYSTEM and (stem, name) not in NAMES_ONLY:
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


# -- floors: which package may import which ---------------------------------------------------------
# A module imports only modules of its own floor or a lower one; `__main__` is the CLI's. The core
# is the package's top level (the modules in CORE).
FLOORS = {"core": 0, "host": 1, "chunks": 2, "store": 2, "engine": 2, "provenance": 2, "lint": 2, "doctor": 2,
          "export": 3, "signing": 3, "pyxis": 3, "lazy": 3, "make": 4, "cli": 5}

# Imports inside functions, by module: start-up deferrals. `efabuild CMD` loads CMD's module alone
# (efabuild/cli/__init__.py), so a command module imports what it runs at its header. A plan, a
# lookup, a no-op make and the Pyxis importer must not load what they do not run
# (tests/engine/test_engine_api.py and the start-up figures in README Performance hold them to it),
# so these modules load their heavier neighbours (the engine steps, boto3, attrs classes, the
# export) where a command first needs them. Outside store/, export/ and host/ each was checked
# against the modules those paths load: one stays here only where the header would load more on one
# of them. A new one goes here only with the start-up reason beside it.
DEFERRED: dict[str, set[str]] = {
    # the importer's protocol: no command loads it
    "efabuild.cli": {"efabuild.cli.pyxis_cmd"},
    # doctor reads logs on a node whose installation may lack the store's packages
    "efabuild.cli.doctor_cmd": {"efabuild.store"},
    # the Pyxis importer loads the CLI's package and reports no progress
    "efabuild.cli.reporting": {"efabuild.store.progress"},
    # a lookup's miss alone reads the workspace's graphs, to tell why
    "efabuild.cli.lookup_cmd": {"efabuild.workspace"},
    # a make with --no-lint loads no lint (its findings are printed only when it stops the make);
    # a no-op make no attrs classes nor subprocess: picture and graphviz only when --graph draws,
    # check with --check
    "efabuild.cli.make_cmd": {"efabuild.cli.graphviz", "efabuild.cli.picture", "efabuild.lint",
                              "efabuild.make.check"},
    # the FUSE binding (ctypes over libfuse 3) at mount time only: the module's names are the CLI's too
    "efabuild.lazy.mount": {"efabuild.lazy.fusefile"},
    # ctypes and subprocess with the first docker process: a plan on the socket starts none
    "efabuild.engine.client": {"efabuild.host.children"},
    # with the export: a no-op make's leftover listing needs none
    "efabuild.engine.containers": {"efabuild.host.children"},
    # plan --offline asks no engine; the farm and registry only with [registry] or emulate
    "efabuild.make.prepare": {
        "efabuild.engine.client", "efabuild.engine.images", "efabuild.engine.registry", "efabuild.make.farm"},
    # a no-op make loads none of a layer's work, nor lint with --no-lint
    "efabuild.make.run": {
        "efabuild.engine.build", "efabuild.export.artifact", "efabuild.lint", "efabuild.make.ancestry",
        "efabuild.make.builders", "efabuild.make.engine_steps", "efabuild.make.gitstate", "efabuild.make.publish",
        "efabuild.signing.attest", "efabuild.signing.keys"},
    # `release` looks nothing up; only a lazy importer loads the store and the mount
    "efabuild.pyxis.importer": {"efabuild.pyxis.lookup", "efabuild.pyxis.lazystart"},
    # a hit is stdlib only: the full store and signatures on a miss or when asked
    "efabuild.pyxis.lookup": {
        "efabuild.signing.trust", "efabuild.signing.verify", "efabuild.signing.verifycache", "efabuild.store.record",
        "efabuild.store.tiered", "efabuild.store.transfer"},
    # lookup's fast path imports no blake3
    "efabuild.settings": {"efabuild.redact"},
    # a cached signed lookup checks no key (cryptography); KMS keys with boto3
    "efabuild.signing.trust": {"efabuild.signing.keys"},
    # a cached verification reads stats only: no hashing, DSSE or cryptography
    "efabuild.signing.verify": {
        "efabuild.host.digest", "efabuild.provenance.intoto", "efabuild.signing.dsse", "efabuild.signing.keys",
        "efabuild.store.record"},
    "efabuild.store": {"efabuild.store.record", "efabuild.store.tiered"},
    "efabuild.store.chunked.send": {"efabuild.store.chunked.s3"},
    "efabuild.store.layout": {"efabuild.configfile"},
    "efabuild.store.chunked.s3": {"efabuild.store.s3client"},
    "efabuild.store.chunked.seeds": {"efabuild.store.chunked.assembly"},
    "efabuild.store.gc.sweep": {"efabuild.store.gc.s3chunks"},
    # S3's tier (boto3) when S3 is first used; its chunk checks and gc's grace only when asked
    "efabuild.store.router": {"efabuild.store.tiers.s3", "efabuild.store.gc.s3chunks", "efabuild.store.chunked.health"},
    "efabuild.store.publishing": {"efabuild.store.chunked.health"},
    # the S3 health check loads the S3 chunk store (attrs): a plan or lookup without S3 runs none
    "efabuild.store.tierhealth": {"efabuild.store.chunked.health"},
    # ctypes and the native helper (2 ms): loaded by an ancestor's check, not by every lookup
    "efabuild.store.transfer": {"efabuild.host.blake3tree"},
    # the same: loaded by a chunked fetch's check only where a seed lends it units
    "efabuild.store.chunked.assembly": {"efabuild.host.blake3tree"},
}


class Imports(NamedTuple):
    top: dict[str, set[str]]  # module -> what its header imports
    deferred: dict[str, set[str]]  # module -> what its functions import
    typing: dict[str, set[str]]  # module -> what its `if TYPE_CHECKING:` blocks name


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(name: str, node: ast.Import | ast.ImportFrom, is_package: bool, known: set[str]) -> list[str]:
    """The efabuild modules an import statement loads (`from efabuild.x import y`: y when y is a
    module, else x)."""
    if isinstance(node, ast.Import):
        found = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if is_package else name.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
        found = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for target in found:
        if target.split(".")[0] != "efabuild":
            continue
        while target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        if target != name:
            out.append(target)
    return out


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _import_graph() -> Imports:
    """Every import of one efabuild module by another: at the header, inside a function, or in an
    `if TYPE_CHECKING:` block (which loads nothing, but still ties the two modules' concepts)."""
    paths = {_module_name(p): p for p in _modules()}
    imports = Imports(*({name: set() for name in paths} for _ in range(3)))

    def visit(name: str, node: ast.AST, into: dict[str, set[str]], is_package: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                into[name].update(_targets(name, child, is_package, set(paths)))
            elif _is_type_checking(child):
                visit(name, child, imports.typing, is_package)
            else:
                in_function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                visit(name, child, imports.deferred if in_function and into is imports.top else into, is_package)

    for name, path in paths.items():
        visit(name, ast.parse(path.read_text()), imports.top, path.name == "__init__.py")
    return imports


def _package(module: str) -> str:
    if module == "efabuild.__main__":
        return "cli"
    parts = module.split(".")
    is_package = (PACKAGE.joinpath(*parts[1:]) / "__init__.py").exists()
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and is_package) else "core"


def _edges(imports: Imports) -> dict[str, set[str]]:
    # a module importing its own package (`from efabuild.store import Store`) is no cycle: Python
    # has run the package's __init__ before any module in it
    return {name: {t for t in imports.top[name] | imports.deferred[name] | imports.typing[name]
                   if not name.startswith(t + ".")}
            for name in imports.top}


def _home(module: str) -> tuple[str, ...]:
    """The package a module sits in, at its full depth (efabuild.store.gc.sweep: efabuild.store.gc)."""
    parts = tuple(module.split("."))
    return parts if (PACKAGE.joinpath(*parts[1:]) / "__init__.py").exists() else parts[:-1]


def _cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected parts of more than one node (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.add(tuple(sorted(part)))
    return found


def test_no_import_cycle_between_files():
    assert _cycles(_edges(_import_graph())) == set()


def test_no_import_cycle_between_packages_at_any_depth():
    """Two sibling packages at any depth (store.chunked and store.gc, host and store) import each
    other in one direction only. A package and a package inside it are no siblings: store/'s own
    modules sit below and above its subpackages alike."""
    packages: dict[str, set[str]] = {}
    for name, targets in _edges(_import_graph()).items():
        for target in targets:
            home, there = _home(name), _home(target)
            common = 0
            while common < min(len(home), len(there)) and home[common] == there[common]:
                common += 1
            if common < len(home) and common < len(there):  # siblings under their common package
                packages.setdefault(".".join(home[:common + 1]), set()).add(".".join(there[:common + 1]))
    assert _cycles(packages) == set()


def test_every_package_has_a_floor_and_imports_only_its_floor_or_lower():
    imports = _import_graph()
    assert {_package(name) for name in imports.top} == set(FLOORS), "a package without a floor in FLOORS"
    upward = sorted(f"{name} -> {target}" for name, targets in _edges(imports).items() for target in targets
                    if FLOORS[_package(target)] > FLOORS[_package(name)])
    assert not upward, "imports up a floor:\n" + "\n".join(upward)


def test_imports_inside_functions_are_only_the_listed_start_up_deferrals():
    found = {name: targets for name, targets in _import_graph().deferred.items() if targets}
    new = {f"{name} -> {t}" for name, targets in found.items() for t in targets - DEFERRED.get(name, set())}
    gone = {f"{name} -> {t}" for name, targets in DEFERRED.items() for t in targets - found.get(name, set())}
    assert not new, "imports inside functions not in DEFERRED (import at the header unless the start-up " \
                    "budget needs it, then list it):\n" + "\n".join(sorted(new))
    assert not gone, "listed in DEFERRED but no longer inside a function, drop them:\n" + "\n".join(sorted(gone))


MAX_IMPORTS_IN_FUNCTIONS = 120


def test_few_imports_wait_inside_functions():
    """Every `import` statement inside a function body counts, the standard library's too: an import
    goes at the header unless a measured start-up cost keeps it back (module-level `if
    TYPE_CHECKING:` blocks load nothing and do not count)."""
    def inside(node: ast.AST, in_function: bool) -> list[str]:
        found = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                found.append(ast.unparse(child))
            found += inside(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
        return found

    count = {str(path.relative_to(PACKAGE.parent)): len(inside(ast.parse(path.read_text()), False))
             for path in _modules()}
    worst = sorted(((n, name) for name, n in count.items() if n), reverse=True)[:10]
    assert sum(count.values()) <= MAX_IMPORTS_IN_FUNCTIONS, \
        f"{sum(count.values())} imports inside functions; the most in: {worst}"


def test_test_files_sit_in_the_folder_of_what_they_test():
    """tests/README.md says where a test goes; one left at the top would start the flat tree again."""
    tests = PACKAGE.parent / "tests"
    flat = sorted(p.name for p in tests.glob("test_*.py"))
    assert not flat, f"move {flat} into the folder of the package they test (tests/README.md)"
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert folders <= {d.name for d in tests.iterdir() if (d / "__init__.py").exists()}, \
        "every test folder is a package (two test files of one name in two folders would clash)"


def test_the_export_imports_nothing_of_the_store():
    """The export writes a .sqsh and cuts it into chunks (efabuild/chunks/); where it is kept is the
    store's business: no module under export/ imports efabuild.store, inside functions and under
    TYPE_CHECKING included."""
    found = [f"{path.relative_to(PACKAGE.parent)} imports {name}"
             for path in sorted((PACKAGE / "export").rglob("*.py"))
             for name in sorted(_imports(ast.parse(path.read_text())))
             if name == "efabuild.store" or name.startswith("efabuild.store.")]
    assert not found, "\n".join(found)


def test_the_package_imports_nothing_of_the_fixture_builder():
    """The demo's and the tests' stand-in base images are built by fixtures/ beside their sources;
    efabuild's users never run it, so no module of the package imports it (the wheel ships none of it)."""
    found = [f"{path.relative_to(PACKAGE.parent)} imports {name}" for path in _modules()
             for name in sorted(_imports(ast.parse(path.read_text())))
             if name == "fixtures" or name.startswith("fixtures.")]
    assert not found, "\n".join(found)


def _is_interface(node: ast.ClassDef) -> bool:
    bases = {ast.unparse(base) for base in node.bases}
    abstract = any(isinstance(item, ast.FunctionDef) and "abstractmethod" in ast.unparse(decorator)
                   for item in node.body for decorator in getattr(item, "decorator_list", ()))
    return abstract or bool(bases & {"abc.ABC", "ABC", "Protocol", "typing.Protocol"})


def test_no_store_interface_has_more_than_eight_methods():
    """The store's seams stay small (restic's backend: save, load, stat, list, remove): every
    abstract class and Protocol under store/ has at most 8 methods, concrete helpers counted."""
    wide = []
    for path in sorted((PACKAGE / "store").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and _is_interface(node):
                methods = [item.name for item in node.body
                           if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
                if len(methods) > 8:
                    wide.append(f"{path.relative_to(PACKAGE.parent)}:{node.name}: {len(methods)} methods {methods}")
    assert not wide, "\n".join(wide)
