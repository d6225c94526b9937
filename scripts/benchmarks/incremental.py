"""incremental: the export of an artifact layer after a one-file change in the user layer, written
from its ancestor's `.sqsh` (export/incremental.py) against a full export of the same image, and
against copying the ancestor's file alone (`copy_file_range`, the floor of any write that reuses
its blocks); where the layer diffs come from (the engine's overlay2 directories) against `docker
export` of the whole image; and "image to mounted" end to end: export, sign, publish to the chunked
S3 tier, fetch onto a node holding the previous version, squashfuse-mount, read the changed file,
against the guide's way (full export, whole copy to the shared filesystem, `unsquashfs -d`).

Images: the export scenario's image (busybox, small files, large libraries) as the ancestor
artifact, and two versions of a user layer on it (COPY of 8 files of 256 KiB, one changed).
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from statistics import median

from benchmarks import fixtures
from benchmarks.chunked import USER_FILE_BYTES, USER_FILES
from benchmarks.common import Check, Context, Result, Timing, human_bytes, run, settled, warm
from benchmarks.loopfs import loop_xfs
from benchmarks.s3 import S3Server

KEY_LABEL = "org.efabuild.key"
CHANGED = "workspace/app/part0.bin"
EPOCH = 315532800  # make's SOURCE_DATE_EPOCH


def _labelled(image: str, key: str, context: Path | None = None) -> str:
    """`image` (with the user layer COPYd from `context`, if given) tagged and labelled for `key`."""
    tag = f"{fixtures.IMAGE_REPO}/incremental:{key[:12]}"
    dockerfile = f"FROM {image}\n" + ("COPY app/ /workspace/app/\n" if context else "")
    with tempfile.TemporaryDirectory() as empty:
        # dated as make dates its builds: the image's time clamp stays its base's, as the ancestor's
        run(["docker", "build", "-q", "--build-arg", f"SOURCE_DATE_EPOCH={EPOCH}", "--label", f"{KEY_LABEL}={key}",
             "-t", tag, "-f", "-", str(context or empty)], input=dockerfile.encode())
    return tag


def _user_context(root: Path, version: int) -> Path:
    import random

    rng = random.Random(1000)
    for i in range(USER_FILES):
        data = bytearray(rng.randbytes(USER_FILE_BYTES))
        if i == 0:
            data[:16] = f"version {version:08d}".encode()  # the one file that changes
        path = root / "app" / f"part{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(data))
    return root


def settle() -> None:
    """Write back every dirty page, so that the next timed step pays for its own writes only."""
    os.sync()


def _copy_alone(src: Path, dest: Path) -> None:
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        left = os.fstat(fin.fileno()).st_size
        while left:
            done = os.copy_file_range(fin.fileno(), fout.fileno(), left)
            if not done:
                break
            left -= done
        os.fsync(fout.fileno())


def _diff_source(engine, child: str, ancestor: str, repeats: int) -> tuple[Timing, Timing, int]:  # noqa: ANN001
    """(the layer tars above the ancestor from overlay2, docker export of the whole image, bytes of the former)."""
    from efabuild.engine.images import layer_facts
    from efabuild.export.layerdiff import layer_tar, overlay_dirs

    (driver, layers), (_, below) = layer_facts(engine, child), layer_facts(engine, ancestor)
    dirs = overlay_dirs(driver, len(layers) - len(below))
    ours, theirs, written = [], [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        with open(os.devnull, "wb") as sink:
            written = sum(layer_tar(d, sink) for d in dirs)
        ours.append(time.perf_counter() - started)
        name = f"efabuild-bench-incr-{secrets.token_hex(4)}"
        run(["docker", "create", "--name", name, child])
        try:
            started = time.perf_counter()
            run(["bash", "-c", f"docker export {name} > /dev/null"])
            theirs.append(time.perf_counter() - started)
        finally:
            run(["docker", "rm", "-f", name])
    return (Timing("layer diffs from overlay2 (tar)", tuple(ours)),
            Timing("docker export of the whole image", tuple(theirs)), written)


def _as_make_holds_it(ancestor, index=None):  # noqa: ANN001, ANN202 - an export.incremental.Ancestor
    """The ancestor as make's check leaves it (transfer.open_checked_stamped, as make/ancestry.py
    calls it): its stat stamp from before the check, the chaining values of its 1 MiB subtrees
    (from the check's hash, or the tree an earlier check of the unchanged file remembered: the
    child's digest is assembled from them) and its kept chunk index, if any."""
    import attrs

    from efabuild.store.record import ArtifactRecord
    from efabuild.store.transfer import open_checked_stamped

    record = ArtifactRecord.for_file(ancestor.key, "bench:efa", ancestor.sqsh, ancestor.digest)
    checked = open_checked_stamped("bench", ancestor.sqsh, record, with_tree=True)
    os.close(checked.fd)
    return attrs.evolve(ancestor, stamp=checked.stamp, index=index, tree=checked.tree)


def _timed_check(path: Path, repeats: int) -> Timing:
    """make's check of the ancestor's copy before an incremental export (its digest and subtrees,
    in one read of its cached pages): not part of the export rows, reported beside them."""
    from efabuild.host.blake3tree import file_tree

    seconds = []
    for _ in range(repeats):
        warm(path)
        started = time.perf_counter()
        file_tree(path)
        seconds.append(time.perf_counter() - started)
    return Timing("the ancestor's check before it (make)", tuple(seconds))


def _chunk_share(child: Path, ancestor: Path) -> float:
    """Share of the child's bytes in chunks the ancestor's file already has (the chunked tier's)."""
    from efabuild.chunks.cdc import chunk_file

    known = set(chunk_file(ancestor).unique())
    index = chunk_file(child)
    return sum(length for cid, length in index.chunks if cid in known) / index.size


def scenario(ctx: Context) -> Result:
    import attrs

    from efabuild.engine.client import connect
    from efabuild.engine.images import layer_facts
    from efabuild.export.artifact import export_record
    from efabuild.export.incremental import Ancestor, layers_digest
    from efabuild.export.squash import export_image
    from efabuild.settings import BuilderSettings, ExportSettings

    sizes, scratch, engine, options = ctx.sizes, ctx.scratch("incremental"), connect(BuilderSettings()), ExportSettings()
    # what make's checks remember (an ancestor's kept index found true) goes to a cache of its own
    from efabuild.signing import verifycache

    (scratch / "verified").mkdir(mode=0o700, exist_ok=True)  # root never creates the variable's directory
    os.environ[verifycache.CACHE_ENV] = str(scratch / "verified")
    base, _ = fixtures.export_image(sizes.export_small_files, sizes.export_large_files, sizes.export_large_bytes)
    keys = {name: secrets.token_hex(32) for name in ("efa", "user1", "user2")}
    ctx.log("incremental: building the ancestor and two versions of the user layer on it")
    tags = {"efa": _labelled(base, keys["efa"])}
    for version in (1, 2):
        context = _user_context(scratch / f"context{version}", version)
        tags[f"user{version}"] = _labelled(tags["efa"], keys[f"user{version}"], context)
    try:
        efa = export_image(tags["efa"], scratch / "efa.sqsh", options=options, engine=engine)
        # recorded as make records it: the child is written only on the very build the copy was exported from
        efa = attrs.evolve(efa, image_layers=layers_digest(layer_facts(engine, tags["efa"])[1]))
        ancestor = _as_make_holds_it(Ancestor(keys["efa"], tags["efa"], efa.path, efa.digest,
                                              export_record(efa, options, 0)))
        check = _timed_check(efa.path, ctx.repeats)
        ctx.log("incremental: timing the layer diffs against docker export")
        diff_ours, diff_theirs, diff_bytes = _diff_source(engine, tags["user2"], tags["efa"], ctx.repeats)
        ctx.log("incremental: timing the incremental export, the full export and the copy alone")
        times, made, full = _timed_exports(engine, tags["user2"], ancestor, efa, options, scratch, ctx.repeats,
                                           copy_alone=True)
        written = made if not isinstance(made, str) else None
        child = written.path if written else full.path
        share = _chunk_share(child, efa.path)
        xfs = _on_xfs(ctx, scratch, engine, tags, keys, options, efa)
        pipeline = _pipelines(ctx, scratch, engine, tags, keys, options, efa, ancestor)
        pipeline["build"] = _timed_build(ctx, scratch, tags)
    finally:
        run(["docker", "image", "rm", "-f", *tags.values()])
    return _result(ctx, times, written, made, full, efa, share, (diff_ours, diff_theirs, diff_bytes), pipeline, xfs,
                   check)


def _timed_exports(engine, tag: str, ancestor, efa, options, directory: Path, repeats: int, *,  # noqa: ANN001
                   copy_alone: bool = False) -> tuple[dict[str, list[float]], object, object]:
    """Seconds of each repeat of the incremental export of `tag` from `ancestor`, of its full
    export and (`copy_alone`) of copying the ancestor's file, all written in `directory`; the
    last incremental result (or its reason) and full export. Each starts with nothing of the one
    before left to write back (`settle`): an fsync otherwise waits for the previous step's
    gigabyte (ext4's ordered journal commits it too), which no step of its own caused."""
    from efabuild.export.artifact import export_record
    from efabuild.export.incremental import EngineLayers, export_incremental
    from efabuild.export.squash import export_image

    times: dict[str, list[float]] = {"incremental": [], "full": [], "copy": []}
    made = full = None
    for _ in range(repeats):
        for path in directory.glob("out-*"):
            path.unlink()
        warm(ancestor.sqsh)
        settle()
        started = time.perf_counter()
        made = export_incremental(EngineLayers(engine, tag), ancestor, directory / "out-incr.sqsh",
                                  options=options, epoch=0, recorded=export_record(efa, options, 0), sha256=False)
        times["incremental"].append(time.perf_counter() - started)
        settle()
        started = time.perf_counter()
        full = export_image(tag, directory / "out-full.sqsh", options=options, engine=engine, sha256=False)
        times["full"].append(time.perf_counter() - started)
        if copy_alone:
            settle()
            started = time.perf_counter()
            _copy_alone(ancestor.sqsh, directory / "out-copy.sqsh")
            times["copy"].append(time.perf_counter() - started)
    return times, made, full


def _on_xfs(ctx: Context, scratch: Path, engine, tags: dict, keys: dict, options, efa) -> dict | None:  # noqa: ANN001
    """The incremental and the full export again with the ancestor and both outputs on a
    loop-mounted XFS with reflink, where the ancestor's blocks are cloned, not copied, and image to
    mounted with both stores, the node and the shared filesystem there: {"times": seconds of each
    repeat, "pipeline": as _image_to_mounted}, or None where no such filesystem can be made here."""
    import attrs

    from efabuild.export.artifact import export_record
    from efabuild.export.incremental import Ancestor

    # the ancestor, two exports, then the pipeline's stores (builder, node, shared) and an unpack
    with loop_xfs(scratch, 12 * efa.size + (1 << 30), ctx.log) as xfs:
        if xfs is None:
            return None
        ctx.log("incremental: the same on XFS with reflink")
        copy = xfs / "efa.sqsh"
        shutil.copyfile(efa.path, copy)  # another filesystem: copy_file_range would not cross it
        ancestor = _as_make_holds_it(Ancestor(keys["efa"], tags["efa"], copy, efa.digest,
                                              export_record(efa, options, 0)))
        times, made, _ = _timed_exports(engine, tags["user2"], ancestor, efa, options, xfs, ctx.repeats)
        if isinstance(made, str):
            return None
        for path in xfs.glob("out-*.sqsh"):
            path.unlink()
        pipeline = _pipelines(ctx, xfs, engine, tags, keys, options, attrs.evolve(efa, path=copy), ancestor)
        return {"times": times, "pipeline": pipeline}


def _timed_build(ctx: Context, scratch: Path, tags: dict) -> float:
    """Seconds of the user layer's build after a one-file change (the same COPY on the same efa
    image, one file changed): what "edit to mounted" adds to both ways."""
    context = _user_context(scratch / "context3", 3)
    started = time.perf_counter()
    tag = _labelled(tags["efa"], secrets.token_hex(32), context)
    took = time.perf_counter() - started
    run(["docker", "image", "rm", "-f", tag])
    return took


def _pipelines(ctx: Context, scratch: Path, *args) -> dict:  # noqa: ANN002
    """_image_to_mounted run `ctx.repeats` times, each with stores of its own (removed after it),
    with the median of each step: one run of it varied by a third here (a full export's time, the
    page cache the steps before left)."""
    runs = []
    for n in range(ctx.repeats):
        where = scratch / f"pipe{n}"
        where.mkdir()
        try:
            runs.append(_image_to_mounted(ctx, where, *args))
        finally:
            shutil.rmtree(where, ignore_errors=True)
    combined = dict(runs[-1], runs=len(runs))
    for way in ("ours", "guide"):
        combined[way] = {step: median(run[way][step] for run in runs) for step in runs[0][way]}
    return combined


def _image_to_mounted(ctx: Context, scratch: Path, engine, tags: dict, keys: dict, options, efa, ancestor) -> dict:  # noqa: ANN001
    """Seconds and bytes of both pipelines, from user v2's image to its changed file read on a node."""
    import boto3

    from efabuild.export.artifact import export_record
    from efabuild.export.incremental import EngineLayers, export_incremental
    from efabuild.export.squash import export_image
    from efabuild.host.digest import Sha256Pass, file_digests
    from efabuild.settings import S3Config
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.signing.attest import signed
    from efabuild.signing.keys import PemSigner
    from efabuild.chunks.cdc import chunk_file
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.record import ArtifactRecord
    from efabuild.store.tiered import Store
    from benchmarks.signing import _key

    signer = PemSigner(_key(scratch)[0])

    def record(key: str, path: Path) -> ArtifactRecord:
        return ArtifactRecord.for_file(key, "bench:user", path, file_digests(path)[0])

    with S3Server() as server:
        client = boto3.session.Session().client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        bucket = f"bench-{secrets.token_hex(4)}"
        client.create_bucket(Bucket=bucket)
        settings = S3Config(bucket=bucket, prefix="incr/", endpoint_url=server.endpoint, region="us-east-1")
        builder = Store([FilesystemTier(scratch / "builder", "local")], settings, show_progress=False)
        # the ancestor with the index kept beside it, and the previous version as make left it:
        # written from the same ancestor when it can be, that index lending its chunks
        indexes = {keys["efa"]: chunk_file(efa.path, chunking=builder.s3.chunking)}
        ancestor = _as_make_holds_it(ancestor, indexes[keys["efa"]])
        previous = export_incremental(EngineLayers(engine, tags["user1"]), ancestor, scratch / "user1.sqsh",
                                      options=options, epoch=0, recorded=export_record(efa, options, 0),
                                      chunking=builder.s3.chunking)
        if isinstance(previous, str):
            previous = export_image(tags["user1"], scratch / "user1.sqsh", options=options, engine=engine,
                                    chunking=builder.s3.chunking)
        indexes[keys["user1"]] = previous.index
        for key, path in ((keys["efa"], efa.path), (keys["user1"], previous.path)):
            builder.publish(key, path, record(key, path), index=indexes[key])
        # checked again, as the next make checks it: publishing links the file (its ctime moves)
        ancestor = _as_make_holds_it(ancestor, indexes[keys["efa"]])
        node = Store([FilesystemTier(scratch / "node", "shared")], settings, show_progress=False)
        seed = node.fetch(keys["user1"])  # the node holds the previous version: the seed of the next fetch
        node.fs_tiers[0].names.append("bench:user", keys["user1"])
        settled(seed)
        ctx.log("incremental: image to mounted, efabuild's way")
        steps: dict[str, float] = {}
        settle()  # each way pays for its own writes, not for what was set up before it
        started = time.perf_counter()
        ancestor = _as_make_holds_it(ancestor, ancestor.index)  # make's check, as each make runs it
        out = scratch / "pipe-child.sqsh"
        # as make does it: the sha256 while the ancestor's range is copied (else beside the probe)
        made = export_incremental(EngineLayers(engine, tags["user2"]), ancestor, out, options=options, epoch=0,
                                  recorded=export_record(efa, options, 0), chunking=builder.s3.chunking, sha256=False,
                                  sha256_beside_copy=True)
        why_full = made if isinstance(made, str) else None
        if why_full is not None:  # no incremental writer, or a reason: what make would do then
            made = export_image(tags["user2"], out, options=options, engine=engine, chunking=builder.s3.chunking,
                                sha256=False)
        steps["export"] = time.perf_counter() - started
        started = time.perf_counter()
        builder.send_ahead("bench:user", made.path, made.index)  # as make does, beside what follows
        sha256 = made.sha256_later or ((lambda: made.sha256) if made.sha256
                                       else Sha256Pass(made.path, made.splice).result)
        manifest = describe_sqsh(made.path, key=keys["user2"], name="bench:user", sqsh_digest=made.digest,
                                 sqsh_sha256=sha256, export_options={}, base=None, chain=[], builder={},
                                 times={})
        envelope = signed(manifest, signer)
        steps["describe+sign"] = time.perf_counter() - started
        started = time.perf_counter()
        child_record = ArtifactRecord.for_file(keys["user2"], "bench:user", made.path, made.digest,
                                               sha256=sha256())
        builder.publish(keys["user2"], made.path, child_record, manifest, envelope=envelope, index=made.index)
        uploaded = builder.s3.last_transfer.bytes if builder.s3.last_transfer else made.size
        steps["publish"] = time.perf_counter() - started
        started = time.perf_counter()
        fetched = node.fetch(keys["user2"])
        downloaded = node.s3.last_transfer.bytes if node.s3.last_transfer else made.size
        steps["fetch"] = time.perf_counter() - started
        started = time.perf_counter()
        _mount_and_read(fetched, scratch / "mnt")
        steps["mount+read"] = time.perf_counter() - started
        ctx.log("incremental: image to mounted, the guide's way")
        guide: dict[str, float] = {}
        settle()
        started = time.perf_counter()
        whole = export_image(tags["user2"], scratch / "guide.sqsh", options=options, engine=engine, sha256=False)
        guide["export"] = time.perf_counter() - started
        started = time.perf_counter()
        (scratch / "fsx").mkdir(exist_ok=True)
        shutil.copyfile(whole.path, scratch / "fsx" / "user.sqsh")
        os.sync()
        guide["copy"] = time.perf_counter() - started
        started = time.perf_counter()
        run(["unsquashfs", "-q", "-n", "-d", str(scratch / "unpacked"), str(scratch / "fsx" / "user.sqsh")])
        (scratch / "unpacked" / CHANGED).read_bytes()
        guide["unpack+read"] = time.perf_counter() - started
        shutil.rmtree(scratch / "unpacked", ignore_errors=True)
    return {"ours": steps, "guide": guide, "uploaded": uploaded, "downloaded": downloaded, "size": made.size,
            "incremental": made.incremental or ({"full": why_full} if why_full else None),
            "signed": envelope is not None}


def _mount_and_read(sqsh: Path, mount: Path) -> None:
    mount.mkdir(exist_ok=True)
    run(["squashfuse", str(sqsh), str(mount)])
    try:
        (mount / CHANGED).read_bytes()
    finally:
        subprocess.run(["fusermount", "-u", str(mount)], capture_output=True)


def _result(ctx: Context, times: dict, written, made, full, efa, share: float, diff: tuple,  # noqa: ANN001
            pipeline: dict, xfs: dict | None = None, check: Timing | None = None) -> Result:
    incr, whole, copy = (median(times[k]) for k in ("incremental", "full", "copy"))
    if written is None:
        incr = math.nan  # nothing was written incrementally: no figure, the reason is in the notes
    diff_ours, diff_theirs, diff_bytes = diff
    ours_total, guide_total = sum(pipeline["ours"].values()), sum(pipeline["guide"].values())
    pipeline_way = ("incremental" if "ancestor" in (pipeline["incremental"] or {})
                    else f"full: {(pipeline['incremental'] or {}).get('full', 'no incremental')}")
    notes = [f"layer diffs of the one-file change: {human_bytes(diff_bytes)} of tar in {diff_ours.median:.3f} s "
             f"from overlay2, against {diff_theirs.median:.2f} s for docker export of the whole image",
             f"image to mounted (medians of {pipeline.get('runs', 1)} runs of each step), efabuild "
             f"({pipeline_way} export): "
             + ", ".join(f"{k} {v:.2f} s" for k, v in pipeline["ours"].items())
             + "; the guide's: " + ", ".join(f"{k} {v:.2f} s" for k, v in pipeline["guide"].items()),
             *([f"make's first check of the ancestor's copy before an incremental export: {check.median:.2f} s "
                f"(its blake3 and subtrees, from cached pages), not in the export rows; it remembers the tree, "
                f"and a check of the unchanged copy after it (in image to mounted's export step) reads none"]
               if check else []),
             "the export rows: blake3 in the export, no sha256 on either side (the guide's way has none); "
             "image to mounted as make runs it: the sha256 for cosign and in-toto taken while the ancestor's "
             "range is copied (in its export step), then the manifest's probe and the signature",
             "targets on ext4 (the scratch filesystem here): incremental ≤ 0.2× full, ≤ 1.5× the copy alone; "
             "image to mounted ≤ 0.2× the guide's; on XFS with reflink: incremental ≤ 0.03× full, image to "
             "mounted ≤ 0.1× the guide's"]
    build = pipeline.get("build")
    if build is not None:  # the "edit to mounted": the layer's build on both sides
        notes.append(f"edit to mounted (the user layer's build, {build:.2f} s, included on both sides): "
                     f"{build + ours_total:.2f} s against {build + guide_total:.2f} s "
                     f"({(build + ours_total) / (build + guide_total):.2f}×)")
    xfs_checks: tuple = ()
    if xfs is not None:
        xfs_incr, xfs_full = median(xfs["times"]["incremental"]), median(xfs["times"]["full"])
        xfs_ours, xfs_guide = sum(xfs["pipeline"]["ours"].values()), sum(xfs["pipeline"]["guide"].values())
        xfs_checks = (Check("incremental export vs full export, XFS with reflink", xfs_incr / xfs_full, 0.03,
                            "lower", unit="×", efabuild=f"{xfs_incr:.2f} s", baseline=f"{xfs_full:.2f} s (full export)",
                            full_size_only=True),
                      Check("image to mounted vs the guide's, XFS with reflink", xfs_ours / xfs_guide, 0.1, "lower",
                            unit="×", efabuild=f"{xfs_ours:.2f} s", baseline=f"{xfs_guide:.2f} s", full_size_only=True))
        notes.append("image to mounted on XFS with reflink, efabuild: "
                     + ", ".join(f"{k} {v:.2f} s" for k, v in xfs["pipeline"]["ours"].items())
                     + "; the guide's: " + ", ".join(f"{k} {v:.2f} s" for k, v in xfs["pipeline"]["guide"].items()))
        if build is not None:
            notes.append(f"edit to mounted on XFS: {build + xfs_ours:.2f} s against {build + xfs_guide:.2f} s "
                         f"({(build + xfs_ours) / (build + xfs_guide):.2f}×)")
    else:
        notes.append("no loop-mounted XFS with reflink here: its row is left out")
    if written is None:
        notes.append(f"incremental export not written: {made}")
    return Result(
        id="incremental",
        what=f"one file changed in the user layer, {human_bytes(full.size)} image",
        checks=(
            Check("incremental export vs full export", incr / whole, 0.2, "lower", unit="×",
                  efabuild=f"{incr:.2f} s", baseline=f"{whole:.2f} s (full export)", full_size_only=True),
            Check("incremental export vs copying the ancestor alone", incr / copy, 1.5, "lower", unit="×",
                  efabuild=f"{incr:.2f} s", baseline=f"{copy:.2f} s (copy_file_range)", full_size_only=True),
            Check("image to mounted vs the guide's", ours_total / guide_total, 0.2, "lower", unit="×",
                  efabuild=f"{ours_total:.2f} s, {human_bytes(pipeline['uploaded'])} up, "
                           f"{human_bytes(pipeline['downloaded'])} down",
                  baseline=f"{guide_total:.2f} s, {human_bytes(full.size)} copied", full_size_only=True),
        ) + xfs_checks,
        timings=((Timing("incremental export", tuple(times["incremental"])),) if written else ())
        + (Timing("full export", tuple(times["full"])), Timing("copy_file_range of the ancestor", tuple(times["copy"])),
           diff_ours, diff_theirs) + ((check,) if check else ()),
        figures={"child_bytes": full.size, "ancestor_bytes": efa.size,
                 "dead_bytes": (written.incremental or {}).get("dead_bytes") if written else None,
                 "share_in_ancestor_chunks": round(share, 4), "diff_tar_bytes": diff_bytes,
                 "pipeline": pipeline, "pipeline_xfs": xfs["pipeline"] if xfs else None},
        notes=tuple(notes),
    )
