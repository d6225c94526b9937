"""make --check's image tag names its owner, so a killed check's image can be told from a live one's
(the removal itself, after a real kill -9, is in tests/test_check.py)."""

from __future__ import annotations

import subprocess
import sys

from efabuild.engine.leftovers import check_image_owner, check_image_tag
from efabuild.grammar import IMAGE_REF
from efabuild.store.owner import Owner
from tests.storekit import key_for


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
