"""[store] settings: one parser, so `plan`/`make` and `lookup`/`ls`/`gc` accept and refuse alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.storekit import efabuild
from tests.kits.wsfactory import make_workspace

BAD_STORE_SETTINGS = {
    "empty shared": ('shared = ""', "store.shared", "must not be empty"),
    "pin that is no ref": ('pins = ["nope"]', "store.pins[0]", "not a key, key prefix"),
    "root as local": ('local = "/"', "store.local", "is the filesystem root"),
    "empty local": ('local = ""', "store.local", "must not be empty"),
    "local is a file": ('local = "BUILD.toml"', "store.local", "is not a directory"),
    "shared under /proc": ('shared = "/proc/self/cwd/store"', "store.shared", "is under /proc"),
    "NUL byte": ('local = "cache\\u0000x"', "store.local", "must not contain a NUL byte"),
    "unknown user": ('local = "~nosuchuser-efabuild/cache"', "store.local", "no such user"),
}


@pytest.mark.parametrize("setting", BAD_STORE_SETTINGS.values(), ids=BAD_STORE_SETTINGS.keys())
def test_plan_and_lookup_refuse_a_bad_store_setting_with_the_same_line(tmp_path: Path, setting) -> None:
    line, key, problem = setting
    root = make_workspace(tmp_path / "ws", build=f'[workspace]\ngraphs = ["graphs/*.toml"]\n[store]\n{line}\n')
    state_existed = Path("/state").exists()
    plan = efabuild("plan", "--offline", cwd=root)
    lookup = efabuild("lookup", "stack:user", cwd=root)
    ls = efabuild("ls", cwd=root)
    for result in (plan, lookup, ls):
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr
        assert "BUILD.toml: " in lines[0] and f"{key}: " in lines[0] and problem in lines[0]
    # the same words after the file name, whoever read the file
    assert {r.stderr.split(f"{key}: ", 1)[1] for r in (plan, lookup, ls)} == {plan.stderr.split(f"{key}: ", 1)[1]}
    if not state_existed:
        assert not Path("/state").exists()  # `local = "/"` must never reach the hash cache


def test_bare_store_paths_are_checked_like_workspace_ones(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for store, problem in ((str(afile), "is not a directory"), ("/", "is the filesystem root"),
                           ("", "must not be empty"), ("/proc/1", "is under /proc")):
        result = efabuild("lookup", "--store", store, "stack:user", cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.startswith("efabuild: --store: "), result.stderr
        assert problem in result.stderr and len(result.stderr.splitlines()) == 1
        result = efabuild("ls", cwd=tmp_path, env={"EFABUILD_STORE": store})
        if store:  # an empty variable means "not set"
            assert result.returncode == 2 and result.stderr.startswith("efabuild: EFABUILD_STORE: ")
            assert problem in result.stderr


def test_good_settings_give_one_config_to_both_readers(tmp_path: Path) -> None:
    from efabuild.settings import S3Config, StoreConfig
    from efabuild.store.config import locate
    from efabuild.workspace import load_workspace

    root = make_workspace(tmp_path / "ws", build='[workspace]\ngraphs = ["graphs/*.toml"]\n[store]\n'
                          'local = "c"\nshared = "../fsx"\nkeep = 2\npins = ["stack:user"]\n'
                          '[store.s3]\nbucket = "b"\nprefix = "/p/"\n')
    from_workspace = load_workspace(root).settings.store
    from_locate = locate(None, root / "app")
    expected = StoreConfig(root.resolve() / "c", tmp_path.resolve() / "fsx", S3Config("b", "p"), 2,
                           ("stack:user",))
    # they differ only in how they name BUILD.toml in messages
    assert from_workspace._replace(source="") == from_locate._replace(source="") == expected._replace(source="")


def test_reading_the_store_settings_loads_no_attrs() -> None:
    """`efabuild lookup` runs in every job: locating a store (BUILD.toml's [store], settings.py) stays
    stdlib only, so a settings module that imported the attrs model at its top would slow every job."""
    import subprocess
    import sys

    from tests.kits.storekit import REPO

    probe = ("import sys\nimport efabuild.store.lookup, efabuild.settings\n"
             "print(' '.join(m for m in ('attrs', 'efabuild.model', 'difflib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.stdout.strip() == ""
