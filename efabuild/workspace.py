"""Read BUILD.toml and graphs/*.toml into the frozen model, or fail with one InputError line.

Every message names the file, the key inside it and the problem, e.g.
`graphs/demo.toml: layers.user.parent: unknown layer 'deepp' (did you mean 'deepep'?)`.
"""

from __future__ import annotations

import difflib
import glob
import os
import re
from pathlib import Path
from typing import Any

from efabuild import configfile, grammar
from efabuild.configfile import Table, type_name
from efabuild.errors import InputError
from efabuild.grammar import ARG_NAME
from efabuild.model import BaseImage, Graph, Layer, LintIgnore, Workspace
from efabuild.configfile import platform_list
from efabuild.settings import BUILD_FILE, parse_settings
from efabuild.tomlkeys import key_line

# Patterns are used with fullmatch: `$` would also match before a trailing newline.
# Lowercase, like a Docker repository path component: safe as an image tag part and a file name.
SAFE_NAME = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
MAX_NAME = 64
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def find_root(start: Path) -> Path:
    """The nearest directory at or above `start` that holds BUILD.toml."""
    start = start.resolve()
    for directory in (start, *start.parents):
        if (directory / BUILD_FILE).is_file():
            return directory
    raise InputError(f"no {BUILD_FILE} here or in any parent directory (use -C DIR)", str(start))


def load_workspace(root: Path) -> Workspace:
    root = root.resolve()
    build_path = root / BUILD_FILE
    settings = parse_settings(_read_toml(build_path, root), build_path.name, root)
    graphs = tuple(_graph(path, root) for path in _graph_paths(settings.graph_files, root))
    _check_unique_graphs(graphs, root)
    ws = Workspace(root=root, settings=settings, graphs=graphs)
    _check_parents(ws)
    _check_cycles(ws)
    return _resolve_platforms(ws)


# --- reading ------------------------------------------------------------------------------------


def _read_toml(path: Path, root: Path, text: str | None = None) -> dict[str, Any]:
    where = _rel(path, root)
    return configfile.parse_toml(configfile.read_text(path, where) if text is None else text, where)


# --- graphs/*.toml ------------------------------------------------------------------------------

# the kernel's MAX_ARG_STRLEN: the longest single argument or environment string, with its NUL
MAX_ARG_BYTES = 128 << 10
LAYER_KEYS = ("base", "digest", "parent", "dockerfile", "dockerfile_file", "args", "context",
              "exclude", "artifact", "ignore", "secrets", "platforms")


def _graph_paths(patterns: tuple[str, ...], root: Path) -> list[Path]:
    paths: list[Path] = []
    for pattern in patterns:
        where = f"{BUILD_FILE}: workspace.graphs: {pattern!r}"
        if not pattern or os.path.isabs(pattern) or "\0" in pattern:
            raise InputError("must be a path or glob relative to the workspace", where)
        matches = sorted(glob.glob(pattern, root_dir=root, recursive=True))
        if not matches:
            raise InputError("matches no file" if glob.has_magic(pattern) else "file not found", where)
        for match in matches:
            path = root / os.path.normpath(match)
            try:
                resolved = path.resolve()
            except (OSError, RuntimeError):  # a symlink loop
                raise InputError(f"'{match}' is a symlink loop", where) from None
            if root not in resolved.parents:
                raise InputError(f"'{match}' is outside the workspace", where)
            if path not in paths:
                paths.append(path)
    return paths


def _graph(path: Path, root: Path) -> Graph:
    file = _rel(path, root)
    name = path.stem
    _check_name(name, f"{file}: graph name (the file name)")
    text = configfile.read_text(path, file)
    top = Table(_read_toml(path, root, text), file, "", ("graph", "layers", "platforms"))
    meta = top.table("graph", ("description",))
    layers_data = top.get("layers", dict, {})  # layer names are free-form: each is checked below
    layers: list[Layer] = []
    if not layers_data:
        raise InputError("no layers: add a [layers.NAME] table", file)
    for layer_name, data in layers_data.items():
        layers.append(_layer(name, layer_name, data, path, file, text, root))
    platforms = platform_list(top, "platforms") if "platforms" in top.data else ()
    return Graph(name=name, source=path, description=meta.get("description", str, "") if meta else "",
                 layers=tuple(layers), platforms=platforms)


def _layer(graph: str, name: str, data: Any, path: Path, file: str, text: str, root: Path) -> Layer:
    _check_name(name, f"{file}: layers.{name}")
    t = Table(data, file, f"layers.{name}", LAYER_KEYS)
    base = _base(t)
    dockerfile, dockerfile_file, dockerfile_line = _dockerfile(t, name, text, root)
    args = _args(t)
    secrets = _secrets(t, args)
    context = tuple(_context_path(entry, root, t.where("context")) for entry in t.str_list("context"))
    ignores = _ignores(t)
    parent, header = t.get("parent", str), key_line(text, ("layers", name))
    return Layer(
        graph=graph, name=name, source=path, dockerfile=dockerfile, dockerfile_file=dockerfile_file,
        base=base, parent=_qualify(parent, graph) if parent else None,
        args=tuple(sorted(args.items())), secrets=tuple(sorted(secrets)),
        context=context, exclude=t.str_list("exclude"), artifact=t.get("artifact", bool, False), ignore=ignores,
        line=header.line if header else None, dockerfile_line=dockerfile_line,
        platforms=platform_list(t, "platforms") if "platforms" in t.data else (),
    )


def _base(t: Table) -> BaseImage | None:
    """The layer's base image, when it starts from one rather than from a parent layer."""
    base_ref, parent = t.get("base", str), t.get("parent", str)
    if base_ref and parent:
        raise InputError("has both base and parent: a layer starts from exactly one", t.where())
    if not base_ref and not parent:
        raise InputError("has neither base nor parent: name a base image or a parent layer", t.where())
    digest = t.get("digest", str)
    if digest and not base_ref:
        raise InputError("a digest pins a base image; this layer has a parent", t.where("digest"))
    if digest and not DIGEST.fullmatch(digest):
        raise InputError("must be 'sha256:' and 64 lowercase hex digits", t.where("digest"))
    if base_ref is not None:
        problem = grammar.image_ref_problem(base_ref)
        if problem:
            raise InputError(problem, t.where("base"))
    return BaseImage(ref=base_ref, digest=digest) if base_ref else None


def _args(t: Table) -> dict[str, str]:
    args = t.get("args", dict, {})
    arg_table = Table(args, t.file, f"{t.dotted}.args", tuple(args))
    for arg_name, value in args.items():
        if not ARG_NAME.fullmatch(arg_name):
            raise InputError("not a valid build-arg name", arg_table.where(arg_name))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # TOML reads 1.10 as 1.1: quote it, so the build gets what the file says
            raise InputError(f"must be a string, not {type_name(value)} (quote it: \"{value}\")",
                             arg_table.where(arg_name))
        if not isinstance(value, str):
            raise InputError(f"must be a string, not {type_name(value)}", arg_table.where(arg_name))
        if len(f"{arg_name}={value}".encode("utf-8", "surrogateescape")) >= MAX_ARG_BYTES:
            raise InputError("over 128 KiB: a build arg reaches buildx as one argument (a secret as one "
                             "environment string), which the kernel refuses (put it in a context file)",
                             arg_table.where(arg_name))
    return args


def _secrets(t: Table, args: dict[str, str]) -> tuple[str, ...]:
    secrets = t.str_list("secrets")
    for secret in secrets:
        if not ARG_NAME.fullmatch(secret):
            raise InputError(f"{secret[:40]!r} is not an environment variable name", t.where("secrets"))
        if secret in args:
            raise InputError(f"{secret} is also a build arg: a secret must not be one", t.where("secrets"))
    if len(set(secrets)) != len(secrets):
        raise InputError("names a secret twice", t.where("secrets"))
    return secrets


def _ignores(t: Table) -> tuple[LintIgnore, ...]:
    ignores = []
    for index, entry in enumerate(t.get("ignore", list, [])):
        item = Table(entry, t.file, f"{t.dotted}.ignore[{index}]", ("rule", "reason"))
        rule, reason = item.get("rule", str), item.get("reason", str)
        if not rule:
            raise InputError("missing: which lint rule to ignore", item.where("rule"))
        if not reason or not reason.strip():
            raise InputError(f"ignoring {rule} needs a reason", item.where("reason"))
        ignores.append(LintIgnore(rule=rule, reason=reason))
    return tuple(ignores)


def _dockerfile(t: Table, name: str, text: str, root: Path) -> tuple[str, str | None, int]:
    """The layer's Dockerfile text, the file it comes from (None: inline) and the line it starts on."""
    inline, from_file = t.get("dockerfile", str), t.get("dockerfile_file", str)
    if inline is not None and from_file is not None:
        raise InputError("set dockerfile or dockerfile_file, not both", t.where())
    if from_file is not None:
        rel = _context_path(from_file, root, t.where("dockerfile_file"))
        path = root / rel
        if not path.is_file():
            raise InputError(f"not a file: {rel}", t.where("dockerfile_file"))
        where, line = t.where("dockerfile_file"), 1
        content = configfile.read_text(path, where)
    else:
        content, where, rel = inline or "", t.where("dockerfile"), None
        found = key_line(text, ("layers", name, "dockerfile"))
        line = found.text_line if found else 1
    if not content.strip():
        raise InputError("empty Dockerfile text", where)
    if re.match(r"^\s*FROM\s", _first_instruction(content), re.IGNORECASE):
        raise InputError("starts with FROM: efabuild writes the FROM line from base/parent", where)
    return content, rel, line


def _first_instruction(text: str) -> str:
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line
    return ""


def _context_path(entry: str, root: Path, where: str) -> str:
    """A workspace-relative path that stays inside the workspace, symlinks resolved."""
    if not entry or entry.startswith("/") or os.path.isabs(entry):
        raise InputError(f"'{entry}' must be relative to the workspace", where)
    normalized = os.path.normpath(entry)
    if normalized == ".." or normalized.startswith("../"):
        raise InputError(f"'{entry}' leaves the workspace", where)
    path = root / normalized
    if not path.exists() and not path.is_symlink():
        raise InputError(f"'{entry}' does not exist", where)
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop
        raise InputError(f"'{entry}' is a symlink loop", where) from None
    if resolved != root and root not in resolved.parents:
        raise InputError(f"'{entry}' leads outside the workspace (symlink to {resolved})", where)
    return normalized


def _qualify(parent: str, graph: str) -> str:
    return parent if ":" in parent else f"{graph}:{parent}"


def _check_name(name: str, where: str) -> None:
    if len(name) > MAX_NAME or not SAFE_NAME.fullmatch(name):
        raise InputError(
            f"{name!r} is not a safe name: use lowercase letters, digits and single . _ - inside "
            f"(at most {MAX_NAME} characters)", where)


def _check_unique_graphs(graphs: tuple[Graph, ...], root: Path) -> None:
    seen: dict[str, Graph] = {}
    for graph in graphs:
        if graph.name in seen:
            raise InputError(f"duplicate graph name '{graph.name}' (also {_rel(seen[graph.name].source, root)})",
                             _rel(graph.source, root))
        seen[graph.name] = graph


def _check_parents(ws: Workspace) -> None:
    layers = ws.layers
    for layer in layers.values():
        if layer.parent and layer.parent not in layers:
            same_graph = [q.split(":", 1)[1] for q in layers if q.startswith(f"{layer.graph}:")]
            wanted = layer.parent.split(":", 1)[1] if layer.parent.startswith(f"{layer.graph}:") else layer.parent
            hint = difflib.get_close_matches(wanted, same_graph + list(layers), n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise InputError(f"unknown layer '{wanted}'{suggestion}",
                             f"{ws.relpath(layer.source)}: layers.{layer.name}.parent")


def _check_cycles(ws: Workspace) -> None:
    """A layer has one parent, so following parents from each layer either ends at a base or
    comes back to a layer of the same walk: a cycle. Iterative and linear (each layer is walked
    once), so a long chain or cycle needs no deep recursion."""
    layers = ws.layers
    done: set[str] = set()
    for start in layers:
        walk: dict[str, int] = {}
        current: str | None = start
        while current is not None and current not in done:
            if current in walk:
                names = list(walk)[walk[current]:] + [current]
                first = layers[current]
                shown = " -> ".join(names) if len(names) <= 8 else (
                    f"{' -> '.join(names[:4])} -> … -> {' -> '.join(names[-3:])} ({len(names) - 1} layers)")
                raise InputError(f"cycle: {shown}",
                                 f"{ws.relpath(first.source)}: layers.{first.name}.parent")
            walk[current] = len(walk)
            current = layers[current].parent
        done.update(walk)


def _resolve_platforms(ws: Workspace) -> Workspace:
    """Each layer's platforms: its own, else its graph's, else the workspace's, in the workspace's
    order. A graph or layer naming a platform the workspace lacks, or a layer asking for one its
    parent is not built for, is one line naming the file and key."""
    every = ws.settings.builder.platforms
    resolved: dict[str, tuple[str, ...]] = {}
    graphs = []
    for graph in ws.graphs:
        file = ws.relpath(graph.source)
        for platform in graph.platforms:
            if platform not in every:
                raise InputError(f"{platform!r} is not one of the workspace's [builder] platforms "
                                 f"({', '.join(every)})", f"{file}: platforms")
        layers = []
        for layer in graph.layers:
            where = f"{file}: layers.{layer.name}.platforms"
            for platform in layer.platforms:
                if platform not in every:
                    raise InputError(f"{platform!r} is not one of the workspace's [builder] platforms "
                                     f"({', '.join(every)})", where)
            layers.append(layer)
        graphs.append((graph, layers))
    declared = {layer.qualname: layer for _, layers in graphs for layer in layers}
    of_graph = {graph.name: graph.platforms for graph in ws.graphs}

    def of(qualname: str) -> tuple[str, ...]:
        # parents first, iteratively: _check_cycles has ruled out a loop
        chain = [qualname]
        while declared[chain[-1]].parent and declared[chain[-1]].parent not in resolved:
            chain.append(declared[chain[-1]].parent)
        for name in reversed(chain):
            layer = declared[name]
            own = layer.platforms or of_graph[layer.graph] or every
            parent = resolved[layer.parent] if layer.parent else every
            if layer.platforms and not set(own) <= set(parent):
                missing = [p for p in own if p not in parent]
                raise InputError(f"{missing[0]} is not built for its parent {layer.parent} "
                                 f"({', '.join(parent)})",
                                 f"{ws.relpath(layer.source)}: layers.{layer.name}.platforms")
            chosen = tuple(p for p in every if p in own and p in parent)
            if not chosen:
                raise InputError(f"no platform left: its graph's ({', '.join(own)}) and its parent "
                                 f"{layer.parent}'s ({', '.join(parent)}) do not meet",
                                 f"{ws.relpath(layer.source)}: layers.{layer.name}")
            resolved[name] = chosen
        return resolved[qualname]

    if len(every) == 1 and not any(g.platforms or any(l.platforms for l in g.layers) for g in ws.graphs):
        return ws._replace(graphs=tuple(g._replace(layers=tuple(l._replace(platforms=every) for l in g.layers))
                                        for g in ws.graphs))
    return ws._replace(graphs=tuple(
        graph._replace(layers=tuple(layer._replace(platforms=of(layer.qualname)) for layer in layers))
        for graph, layers in graphs))


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
