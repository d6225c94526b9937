"""make --check's image tag names its owner, so a killed check's image can be told from a live one's
(the removal itself, after a real kill -9, is in tests/make/test_check.py)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from efabuild.engine.client import connect
from efabuild.engine.leftovers import check_image_owner, check_image_tag, dead_check_images, remove_images
from efabuild.settings import BuilderSettings
from efabuild.grammar import IMAGE_REF
from efabuild.host.owner import Owner
from tests.kits.storekit import key_for


def test_a_check_tag_is_a_valid_reference_naming_this_process():
    key = key_for("check")
    tag = check_image_tag("deepep", key)
    assert IMAGE_REF.fullmatch(tag) and tag.startswith(f"efabuild-check/deepep:{key[:12]}-")
    assert check_image_owner(tag) == Owner.current() and not Owner.current().gone()


def test_only_a_gone_owner_makes_a_check_image_a_leftover():
    me = Owner.current()
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    key = key_for("check")
    assert check_image_owner(f"efabuild-check/user:{key[:12]}-{me.host}.{dead}.{me.start}").gone()
    assert check_image_owner(f"efabuild-check/user:{key[:12]}-{me.host}.{me.pid}.{me.start + 1}").gone()
    assert not check_image_owner(f"efabuild-check/user:{key[:12]}-elsewhere.{dead}.{me.start}").gone()
    # the layer's own image, and a check image of an efabuild that did not name owners: not judged
    assert check_image_owner(f"efabuild/user:{key[:12]}-{me.host}.{dead}.{me.start}") is None
    assert check_image_owner(f"efabuild-check/user:{key}") is None


@pytest.mark.engine
def test_check_images_are_judged_by_their_owner_or_unowned_by_when_they_were_tagged(busybox_image):
    engine = connect(BuilderSettings())
    me, key = Owner.current(), key_for(uuid.uuid4().hex)
    layer = f"t{uuid.uuid4().hex[:12]}"
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    live = check_image_tag(layer, key)
    killed = f"efabuild-check/{layer}:{key[:12]}-{me.host}.{dead}.{me.start}"
    unowned = f"efabuild-check/{layer}:{key}"  # as an efabuild tagged it before it named owners
    for tag in (live, killed, unowned):
        subprocess.run(["docker", "image", "tag", busybox_image, tag], check=True)

    def ours(found: list[str]) -> list[str]:
        return [tag for tag in found if f"/{layer}:" in tag]

    try:
        assert ours(dead_check_images(engine)) == [killed]  # an unowned one tagged just now may be in use
        in_two_days = time.time() + 2 * 24 * 3600  # instead of waiting a day
        assert ours(dead_check_images(engine, now=in_two_days)) == sorted([killed, unowned])
        remove_images(engine, [killed, unowned])
        assert ours(dead_check_images(engine, now=in_two_days)) == []
        listed = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}",
                                 f"efabuild-check/{layer}"], capture_output=True, text=True, check=True).stdout.split()
        assert listed == [live]
        assert subprocess.run(["docker", "image", "inspect", busybox_image], capture_output=True).returncode == 0
    finally:
        subprocess.run(["docker", "image", "rm", live, killed, unowned], capture_output=True)


@pytest.mark.engine
def test_a_label_holding_a_line_break_forges_no_leftover_over_the_cli(busybox_image, tmp_path):
    """On an engine reached through the docker CLI (a context, ssh://, tcp://: a shared one), the
    export containers are listed as text. Whoever can create a container there can put a line
    break in its labels: it must not forge a row naming another's container as a dead export."""
    from efabuild.engine.leftovers import dead_export_containers

    engine = connect(BuilderSettings(context="default"))
    assert engine.api is None  # the CLI's listing, not the socket's JSON
    me, tag = Owner.current(), uuid.uuid4().hex[:12]
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    victim, forger = f"victim-{tag}", f"forger-{tag}"
    store = tmp_path / "cache"
    forged = f"{store}/x\n{victim}\t{me.host}.{dead}.{me.start}\t{store}/y.sqsh"
    try:
        subprocess.run(["docker", "container", "create", "--name", victim, busybox_image, "true"],
                       capture_output=True, check=True)
        subprocess.run(["docker", "container", "create", "--name", forger, "--label", f"org.efabuild.export={forged}",
                        "--label", f"org.efabuild.host.owner={me.token}", busybox_image, "true"],
                       capture_output=True, check=True)
        found = dead_export_containers(engine, [store])
        assert victim not in found and forger not in found  # the forger's own owner (this test) is alive
    finally:
        subprocess.run(["docker", "container", "rm", "-f", victim, forger], capture_output=True)
