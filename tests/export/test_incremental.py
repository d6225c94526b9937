"""export/incremental.py without an engine: the ancestor's bytes must stay the checked ones until
the child written from them is hashed and kept (the layer-diff and engine parts: tests/make/)."""

from __future__ import annotations

import os
import time

import pytest

from efabuild.export.incremental import Ancestor, _unchanged
from efabuild.export.squash import ExportJob, Unkept, keep_export
from efabuild.export.tarfilter import RewritePlan
from efabuild.host import statstamp
from efabuild.host.digest import Splice, file_digest


def _ancestor(path, **fields) -> Ancestor:
    return Ancestor("a" * 64, "efabuild/efa:x", path, file_digest(path), {}, **fields)


def test_an_ancestor_rewritten_in_place_after_its_check_is_not_built_on(tmp_path):
    """In a shared tier the file's owner may rewrite it between the check and the copy: the child
    would then carry bytes nobody checked, under this make's record. Its stamp, taken before the
    check, tells."""
    sqsh = tmp_path / "efa.sqsh"
    sqsh.write_bytes(b"checked bytes")
    ancestor = _ancestor(sqsh, stamp=statstamp.stamp(os.stat(sqsh)))
    assert _unchanged(ancestor) is None
    time.sleep(0.01)
    sqsh.write_bytes(b"planted bytes")  # same size
    assert _unchanged(ancestor) == "the ancestor's copy changed while the child was written from it"


def test_another_users_ancestor_is_believed_only_once_its_stamp_has_settled(tmp_path, monkeypatch):
    """Within one tick of the clock a rewrite leaves the stamp as it was: another user's file
    written in the last 2 s proves nothing; this user's own file may be as fresh as make left it."""
    sqsh = tmp_path / "efa.sqsh"
    sqsh.write_bytes(b"bytes")
    if os.geteuid() == 0:
        os.chown(sqsh, 65534, 65534)
    else:
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    ancestor = _ancestor(sqsh, stamp=statstamp.stamp(os.stat(sqsh)))
    assert _unchanged(ancestor) == "the ancestor's copy, another user's, was written within the last 2 s"
    monkeypatch.setattr(statstamp, "clock_ns", lambda: time.time_ns() + 60_000_000_000)
    assert _unchanged(ancestor) is None


def test_a_refused_child_is_never_moved_to_its_name(tmp_path):
    source = tmp_path / "efa.sqsh"
    source.write_bytes(os.urandom(1 << 20))
    tmp = tmp_path / "child.tmp"
    tmp.write_bytes(source.read_bytes()[:4096] + b"new tail")
    job = ExportJob("img", tmp_path / "child.sqsh", (), RewritePlan((), "", frozenset(), frozenset()), None,
                    time.monotonic())
    with pytest.raises(Unkept, match="changed"):
        keep_export(tmp, job, True, splice=Splice(str(source), 96, 4096),
                    still_valid=lambda: "the ancestor's copy changed while the child was written from it")
    assert not (tmp_path / "child.sqsh").exists()
    kept = keep_export(tmp, job, True, splice=Splice(str(source), 96, 4096))
    assert kept.digest == file_digest(tmp_path / "child.sqsh")
