"""The manifest as an in-toto Statement v1 with a SLSA provenance v1 predicate.

Derived from the manifest alone, so it is as deterministic as the manifest. Digest sets: in-toto
predefines sha256, sha512, blake2b... but not blake3; unknown algorithm names are allowed and
consumers ignore the ones they do not know. The subject therefore carries `blake3` (what the store
uses) and `sha256` when the exporter computed one, which is what standard tooling matches on.
The chunk index the artifact was cut into, where one was, is a byproduct named `<key>.chunks`
with its blake3: signed with the rest, it lets a lazy mount trust chunk ids before the whole file
is read. Components without a digest are named by package URL (`pkg:generic/NAME@VERSION`); a component
whose version is unknown is left out rather than guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:efabuild:build-type:layer-chain:v1"
BUILDER_ID = "urn:efabuild:builder:buildkit"

# measured components listed as resolved dependencies, with the names their packages go by
_DEPENDENCIES = (
    ("efa-installer", "aws-efa-installer"),
    ("libfabric", "libfabric"),
    ("aws-ofi-nccl", "aws-ofi-nccl"),
    ("nccl", "nccl"),
    ("cuda", "cuda"),
    ("cudnn", "cudnn"),
    ("pytorch", "torch"),
    ("deepep", "deep_ep"),
)


def to_intoto(manifest: Mapping[str, Any]) -> dict[str, Any]:
    artifact = manifest["artifact"]
    subject_digest = {"blake3": artifact["digest"].split(":", 1)[1]}
    if artifact.get("sha256"):
        subject_digest["sha256"] = artifact["sha256"]
    graph, _, layer = manifest["name"].partition(":")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f"{manifest['key']}.sqsh", "digest": subject_digest}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "graph": graph,
                    "layer": layer,
                    "chain": [
                        {
                            "layer": entry["layer"],
                            "key": entry["key"],
                            "args": (entry.get("inputs") or {}).get("args") or {},
                            "dockerfileDigest": (entry.get("inputs") or {}).get("dockerfile_digest"),
                        }
                        for entry in manifest.get("chain", [])
                    ],
                },
                "internalParameters": {"export": artifact.get("export") or {}},
                "resolvedDependencies": _dependencies(manifest),
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": dict(manifest.get("builder") or {})},
                "metadata": _metadata(manifest),
                **_byproducts(manifest),
            },
        },
    }


def chunk_index_name(key: str) -> str:
    return f"{key}.chunks"


def _byproducts(manifest: Mapping[str, Any]) -> dict[str, Any]:
    chunk_index = manifest["artifact"].get("chunk_index")
    if not isinstance(chunk_index, str) or not chunk_index.startswith("blake3:"):
        return {}
    return {"byproducts": [{"name": chunk_index_name(manifest["key"]),
                            "digest": {"blake3": chunk_index.split(":", 1)[1]}}]}


def _dependencies(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    deps: list[dict[str, Any]] = []
    vcs = manifest.get("vcs")
    if isinstance(vcs, dict) and vcs.get("revision"):  # the workspace's commit the layers were built from
        source: dict[str, Any] = {"name": "workspace", "digest": {"gitCommit": vcs["revision"]}}
        if vcs.get("source"):
            source["uri"] = f"git+{vcs['source']}"
        deps.append(source)
    base = manifest.get("base")
    if base and base.get("ref"):
        entry: dict[str, Any] = {"name": "base-image", "uri": f"docker://{base['ref']}"}
        if base.get("digest") and ":" in base["digest"]:
            algorithm, value = base["digest"].split(":", 1)
            entry["digest"] = {algorithm: value}
        deps.append(entry)
    components = (manifest.get("measured") or {}).get("components") or {}
    for name, package in _DEPENDENCIES:
        component = components.get(name) or {}
        version = component.get("version")
        if version is None:
            continue
        entry = {"name": name, "uri": f"pkg:generic/{package}@{version}"}
        if component.get("commit"):
            entry["digest"] = {"gitCommit": component["commit"]}
        if component.get("source"):
            entry["annotations"] = {"source": component["source"]}
        deps.append(entry)
    return deps


def _metadata(manifest: Mapping[str, Any]) -> dict[str, Any]:
    times = manifest.get("times") or {}
    metadata: dict[str, Any] = {"invocationId": manifest["key"]}
    if times.get("started"):
        metadata["startedOn"] = times["started"]
    if times.get("finished"):
        metadata["finishedOn"] = times["finished"]
    return metadata
