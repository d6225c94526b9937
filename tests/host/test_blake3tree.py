"""host/blake3tree.py: BLAKE3 digests from the chaining values of 1 MiB subtrees (native/blake3cv.c,
built by scripts/setup-host.sh), the same digests the blake3 binding gives."""

from __future__ import annotations

import os
import random

import pytest

from efabuild.host import blake3tree
from efabuild.host.digest import file_digest
from tests.kits.storekit import give_to_another_user

MiB = 1 << 20


@pytest.fixture
def native():
    lib = blake3tree.native()
    assert lib is not None, ("the BLAKE3 helper is not built: scripts/setup-host.sh builds it "
                             f"({blake3tree.DEFAULT_LIBRARY}, or ${blake3tree.LIBRARY_ENV})")
    return lib


@pytest.mark.parametrize("size", [0, 1, 1023, 1024, 1025, 4096, MiB - 1, MiB, MiB + 1, 2 * MiB, 3 * MiB + 777,
                                  (33 * MiB) + 12345])
def test_a_file_hashed_from_its_subtrees_has_the_digest_the_binding_gives(tmp_path, native, size):
    path = tmp_path / "f"
    path.write_bytes(random.Random(size).randbytes(size))
    tree = blake3tree.file_tree(path)
    assert tree.digest == file_digest(path)
    assert len(tree.cvs) == 32 * (size // MiB)


def test_a_file_reusing_anothers_bytes_is_hashed_from_its_subtrees_at_any_split(tmp_path, native):
    """The child of an incremental export: another head (its superblock), the ancestor's bytes at
    the same offsets, a tail of its own."""
    rng = random.Random(21)
    for _ in range(10):
        size = rng.randrange(MiB, 24 * MiB)
        source = rng.randbytes(size)
        (tmp_path / "source").write_bytes(source)
        lo = rng.choice([0, 96, rng.randrange(0, size)])
        hi = rng.randrange(lo, size)
        (tmp_path / "child").write_bytes(rng.randbytes(lo) + source[lo:hi] + rng.randbytes(rng.randrange(0, 3 * MiB)))
        tree = blake3tree.file_tree(tmp_path / "source")
        assert blake3tree.spliced_digest(tmp_path / "child", lo, hi, tree) == file_digest(tmp_path / "child")


def test_the_reused_units_are_not_read_again(tmp_path, native):
    """What makes it cheap, shown by breaking the contract on purpose: the child's own bytes in the
    range are zeros, yet its digest is that of the file with the source's bytes there."""
    rng = random.Random(4)
    source = rng.randbytes(8 * MiB)
    tail = rng.randbytes(MiB // 3)
    (tmp_path / "source").write_bytes(source)
    (tmp_path / "child").write_bytes(b"\0" * (8 * MiB) + tail)
    (tmp_path / "true").write_bytes(source + tail)
    tree = blake3tree.file_tree(tmp_path / "source")
    assert blake3tree.spliced_digest(tmp_path / "child", 0, 8 * MiB, tree) == file_digest(tmp_path / "true")


def test_without_the_helper_nothing_is_hashed_from_subtrees(tmp_path, monkeypatch):
    monkeypatch.setenv(blake3tree.LIBRARY_ENV, str(tmp_path / "missing.so"))
    blake3tree.native.cache_clear()
    try:
        (tmp_path / "f").write_bytes(b"x" * MiB)
        assert blake3tree.file_tree(tmp_path / "f") is None
    finally:
        monkeypatch.undo()
        blake3tree.native.cache_clear()


def _planted_library(directory, marker):  # noqa: ANN001, ANN202
    """A shared library whose loading alone runs code: it creates `marker`."""
    import shutil
    import subprocess

    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    source = directory / "planted.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void ran(void) '
                      f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    library = directory / "libplanted.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=120)
    return library


@pytest.mark.parametrize("how", ["writable by others", "in a directory others write", "another user's"])
def test_a_library_another_user_could_have_written_is_never_loaded(tmp_path, monkeypatch, how):
    """$EFABUILD_BLAKE3_LIB is read from the environment of whoever runs efabuild (a root make, a
    job's step): a library someone else could write would run their code as this user."""
    directory = tmp_path / "lib"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    marker = tmp_path / "ran"
    library = _planted_library(directory, marker)
    library.chmod(0o755)
    if how == "writable by others":
        library.chmod(0o777)
    elif how == "in a directory others write":
        directory.chmod(0o1777)
    else:
        give_to_another_user(library, monkeypatch)
    monkeypatch.setenv(blake3tree.LIBRARY_ENV, str(library))
    blake3tree.native.cache_clear()
    try:
        (tmp_path / "f").write_bytes(b"x" * MiB)
        assert blake3tree.file_tree(tmp_path / "f") is None  # hashed whole, as without the helper
        assert not marker.exists()
    finally:
        monkeypatch.undo()
        blake3tree.native.cache_clear()


def _other_library(directory):  # noqa: ANN001, ANN202
    """A shared library (this user's, so trusted) without the helper's functions."""
    import shutil
    import subprocess

    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    (directory / "other.c").write_text("int efabuild_parent_not(void) { return 0; }\n")
    library = directory / "libother.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(directory / "other.c")], check=True,
                   timeout=120)
    library.chmod(0o755)
    return library


@pytest.mark.parametrize("which", ["native", "installed"])
def test_a_library_without_the_helpers_functions_is_not_used_and_nothing_fails(tmp_path, monkeypatch, which):
    """$EFABUILD_BLAKE3_LIB naming another library (root's, so trusted), or an installed helper
    built before a function was added: the file is hashed whole, as without the helper, where its
    first use ended the command (a make, a fetch at a job's start) with a traceback."""
    directory = tmp_path / "lib"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    library = _other_library(directory)
    if which == "native":
        monkeypatch.setenv(blake3tree.LIBRARY_ENV, str(library))
    else:
        monkeypatch.setattr(blake3tree, "DEFAULT_LIBRARY", str(library))
    loader = getattr(blake3tree, which)
    loader.cache_clear()
    try:
        assert loader() is None
        (tmp_path / "f").write_bytes(b"x" * MiB)
        if which == "native":  # what make's ancestor check hashes with
            assert blake3tree.file_tree(tmp_path / "f") is None
    finally:
        monkeypatch.undo()
        loader.cache_clear()


def test_each_load_uses_the_library_it_checked_not_one_loaded_before_under_the_same_descriptor(tmp_path,
                                                                                              monkeypatch):
    """A library is loaded as /proc/self/fd/N, and the dynamic loader hands back whatever it loaded
    under that name before: make (which honours $EFABUILD_BLAKE3_LIB) then fetching from S3 (which
    must load the installed helper alone) got the environment's library a second time."""
    import shutil

    if not os.path.exists(blake3tree.DEFAULT_LIBRARY):
        pytest.skip("the BLAKE3 helper is not built")
    directory = tmp_path / "lib"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    chosen = directory / "libchosen.so"  # the environment's: a copy of the helper
    shutil.copy(blake3tree.DEFAULT_LIBRARY, chosen)
    chosen.chmod(0o755)
    monkeypatch.setenv(blake3tree.LIBRARY_ENV, str(chosen))
    monkeypatch.setattr(blake3tree, "DEFAULT_LIBRARY", str(tmp_path / "lib" / "missing.so"))
    blake3tree.native.cache_clear()
    blake3tree.installed.cache_clear()
    try:
        assert blake3tree.native() is not None
        _other_library(directory).rename(directory / "missing.so")  # then installed: one without the functions
        assert blake3tree.installed() is None  # not the environment's again
    finally:
        monkeypatch.undo()
        blake3tree.native.cache_clear()
        blake3tree.installed.cache_clear()


EDGES = [0, 1, 96, 1023, 1024, MiB - 1, MiB, MiB + 1, 2 * MiB, 3 * MiB - 1]


@pytest.mark.slow  # 0.4 s each
@pytest.mark.parametrize("size", [0, 1, 1023, 1024, MiB - 1, MiB, MiB + 1, 2 * MiB, 3 * MiB - 1])
@pytest.mark.parametrize("source_size", [MiB - 1, 2 * MiB, 3 * MiB + 1])
def test_a_splice_at_every_edge_and_a_source_shorter_than_it_give_the_bindings_digest(tmp_path, native, size,
                                                                                      source_size):
    rng = random.Random(size * 7 + source_size)
    source = rng.randbytes(source_size)
    (tmp_path / "source").write_bytes(source)
    tree = blake3tree.file_tree(tmp_path / "source")
    for lo in [e for e in EDGES if e <= size]:
        for hi in [e for e in EDGES + [size] if lo <= e <= size]:
            own = bytearray(rng.randbytes(size))
            reach = min(hi, source_size)  # past the source's end the bytes are the child's own
            own[lo:max(lo, reach)] = source[lo:max(lo, reach)]
            (tmp_path / "child").write_bytes(own)
            assert blake3tree.spliced_digest(tmp_path / "child", lo, hi, tree) == file_digest(tmp_path / "child"), \
                (lo, hi)


def test_a_fetch_loads_the_installed_helper_whatever_the_environment_names(tmp_path, monkeypatch, native):
    """A fetch from S3 runs in the Pyxis importer, whose environment the job's user sets: the
    library $EFABUILD_BLAKE3_LIB names is never loaded by it, the installed one is."""
    marker = tmp_path / "ran"
    library = _planted_library(tmp_path, marker)
    monkeypatch.setenv(blake3tree.LIBRARY_ENV, str(library))
    blake3tree.installed.cache_clear()
    try:
        lib = blake3tree.installed()
        assert not marker.exists()
        path = tmp_path / "f"
        path.write_bytes(random.Random(3).randbytes(3 * MiB + 5))
        with open(path, "rb") as handle:
            lent = blake3tree.unit_values(lib, handle.fileno(), [0, 2])
            assert blake3tree.digest_with(lib, handle.fileno(), lent) == file_digest(path)
            assert blake3tree.unit_values(lib, handle.fileno(), [3]) is None  # not a whole unit of it
    finally:
        monkeypatch.undo()
        blake3tree.installed.cache_clear()
