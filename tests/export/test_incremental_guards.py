"""The incremental export's rules that stand between a child and another image's bytes, each on
its own: the ancestor is the nearest artifact layer below, and the image's layers must start with
that ancestor image's (pure, with stand-ins for the plan and the layer source)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from efabuild.export import incremental
from efabuild.export.incremental import LayerSourceUnavailable, ancestor_layer, layers_digest


def test_the_ancestor_is_the_nearest_artifact_layer_below():
    chain = [SimpleNamespace(qualname=name, artifact=artifact)
             for name, artifact in (("g:base", True), ("g:efa", True), ("g:deepep", False), ("g:user", True))]
    plan = SimpleNamespace(chain=lambda qualname: chain[: [c.qualname for c in chain].index(qualname) + 1])
    assert ancestor_layer(plan, "g:user").qualname == "g:efa"  # not g:base, the farthest
    assert ancestor_layer(plan, "g:deepep").qualname == "g:efa"
    assert ancestor_layer(plan, "g:base") is None


class _Source:
    where = "engine's"

    def __init__(self, layers, below) -> None:  # noqa: ANN001
        self.layers, self.below, self.opened = layers, below, None

    def diff_ids(self, ancestor):  # noqa: ANN001, ANN202
        return self.layers, self.below

    def open(self, first, count):  # noqa: ANN001, ANN202
        self.opened = (first, count)
        return []


def test_the_images_layers_must_start_with_the_ancestor_images():
    below = ("sha256:a", "sha256:b")
    ancestor = SimpleNamespace(export={"image_layers": layers_digest(below)}, tag="efabuild/efa:k")
    good = _Source(("sha256:a", "sha256:b", "sha256:c"), below)
    assert incremental._diff_streams(good, ancestor) == [] and good.opened == (2, 3)
    # the same number of layers below, but others: the child's diffs would sit on another image's files
    for layers in (("sha256:x", "sha256:b", "sha256:c"), ("sha256:a", "sha256:x", "sha256:c"), ("sha256:a",)):
        other = _Source(layers, below)
        with pytest.raises(LayerSourceUnavailable, match="do not start with the ancestor image's"):
            incremental._diff_streams(other, ancestor)
        assert other.opened is None
