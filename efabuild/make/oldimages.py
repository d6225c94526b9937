"""Engine images a workspace's makes built and no layer needs any more: what `gc --images` removes.

An image is old when this workspace's build records name its key for a layer and that key is no
layer's current key. Images other workspaces built on a shared engine are touched only when one
of them built the same key (the same inputs give the same tag, and the engine cannot say who else
needs it): that workspace then rebuilds the layer, nothing stored is lost. The base images and the
fixture images carry no efabuild key.
"""

from __future__ import annotations

from efabuild.engine.images import existing_tags, untag_image
from efabuild.engine.registry import remote_ref
from efabuild.errors import EfabuildError
from efabuild.make.prepare import Prepared
from efabuild.refs import image_tag


def old_image_tags(prepared: Prepared, existing: set[str]) -> list[str]:
    """Tags (`efabuild/<layer>:<key>`) among `existing` whose key this workspace built and no
    layer's current key is, and their `[registry]` names (`REGISTRY/efabuild/<layer>:<key>`, which
    a push killed before removing it left: kept, it would keep the image), sorted."""
    current = {lp.key for lp in prepared.plan.layers}
    old = set()
    for name in prepared.order:
        layer = prepared.graph.nodes[name]["layer"]
        old |= {image_tag(layer.name, entry["key"]) for entry in prepared.records.history(name)
                if entry["key"] not in current}
    registry = prepared.ws.settings.registry
    if registry is not None:
        old |= {remote_ref(tag, registry) for tag in old}
    return sorted(old & existing)


def remove_old_images(prepared: Prepared, remove: bool) -> list[tuple[str, str | None]]:
    """(tag, None) for each old image, removed when `remove`; (tag, why) for one the engine kept
    (a container uses it)."""
    done = []
    for tag in old_image_tags(prepared, existing_tags(prepared.engine, "")):  # the registry's names too
        try:
            if remove:
                untag_image(prepared.engine, tag)
            done.append((tag, None))
        except EfabuildError as exc:
            done.append((tag, str(exc)))
    return done
