"""The checks a Store makes of its tiers' copies beyond presence: a filesystem copy's size by a
stat, S3's by store/chunked/health.py; and the repair of S3 chunks found missing or damaged."""

from __future__ import annotations

from efabuild import notices
from efabuild.errors import EfabuildError
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.tiers.base import S3_TIER
from efabuild.store.transfer import DamagedCopy, verified_copy


class Checks:
    """Mixed into Store, whose `s3`, `_tiers`, `local_tier` and `_damaged` they use."""

    _s3_health: dict  # key -> health.S3Health of its last check

    def _sized(self, tier: FilesystemTier, key: str) -> bool:
        """The copy of `key` on `tier` has its record's size (a stat; warned and marked damaged
        when not)."""
        try:
            record, info = tier.record(key), tier.layout.committed(key)
        except EfabuildError as exc:
            return self._mark_damaged(key, tier.name, f"{tier.name} tier: {exc}")
        if record is None or info is None:
            return False
        if info.st_size != record.size:
            return self._mark_damaged(key, tier.name, f"{tier.name} tier: {tier.sqsh_path(key)}: corrupt artifact: "
                                                      f"{info.st_size} bytes, its record says {record.size}")
        return True

    def _s3_sound(self, key: str) -> bool:
        """S3's copy of `key` passes the quick check (warned and marked damaged when not)."""
        found = self.s3_health(key)
        if found is None or found.ok:
            return found is not None
        for problem in found.problems[:-1]:
            notices.warn(problem)
        return self._mark_damaged(key, S3_TIER, found.problems[-1])

    def s3_health(self, key: str, *, deep: bool = False):  # noqa: ANN201 - health.S3Health, None when S3 lacks it
        """How the S3 tier holds `key` (see store/chunked/health.py); remembered for a repair."""
        from efabuild.store.chunked import health

        record = self.s3.record(key)
        if record is None:
            return None
        found = health.check(self.s3, key, record, deep=deep)
        self._s3_health[key] = found
        return found

    def _source_failed(self, key: str, tier: str, problem: Exception) -> None:
        """`complete` found `tier`'s copy of `key` bad as it copied it. A chunk of S3 failing its id
        (or gone) although the quick check passed: every chunk is read (a deep check) so that the
        repair stores again each one that fails, not just the first the fetch met."""
        notices.warn(f"{problem}; not copied from there")
        self._damaged.setdefault(key, set()).add(tier)
        if tier == S3_TIER and self.s3 is not None and not isinstance(problem, DamagedCopy):
            self.s3_health(key, deep=True)

    def withdraw_damaged(self, key: str, tier: FilesystemTier, problem: str) -> str:
        """A check (make's of an ancestor) found `tier`'s copy of `key` other bytes than its record
        names: repaired from another tier's good copy where one is, else withdrawn (deleted under
        the key's lock), so that no later make builds on it and no lookup hands it out; the next
        make exports it again. What was done, for make's line."""
        self._damaged.setdefault(key, set()).add(tier.name)
        try:
            repaired = self.complete(key)
        except EfabuildError:
            repaired = None
        if repaired is not None and repaired.get(tier.name) in ("repaired", "published"):
            notices.warn(f"{problem}; repaired from a good copy")
            return "repaired from another tier"
        with tier.key_lock(key):
            tier.delete(key)
        notices.warn(f"{problem}; no tier holds a good copy: withdrawn, the next make exports it again")
        return "withdrawn"

    def _mark_damaged(self, key: str, tier: str, problem: str) -> bool:
        """Warn of `problem` with `key`'s copy on `tier`, left for `complete` to repair: False."""
        notices.warn(f"{problem}; a make repairs it from a good copy")
        self._damaged.setdefault(key, set()).add(tier)
        return False

    def check_copies(self, key: str, *, remote: bool, deep: bool = False) -> None:
        """One EfabuildError naming every tier whose copy of `key` `verify` finds damaged."""
        damaged = [str(exc) for _, exc in self.verify(key, remote=remote, deep=deep) if exc is not None]
        if damaged:
            raise EfabuildError("; ".join(damaged))

    def check_s3(self, key: str, *, deep: bool = False) -> None:
        """health.S3Damaged (one line naming the artifact and each chunk) unless S3 can deliver
        `key` or does not hold it."""
        from efabuild.store.chunked.health import S3Damaged

        health = self.s3_health(key, deep=deep) if self.s3 is not None else None
        if health is not None and not health.ok:
            raise S3Damaged(health)

    def verify(self, key: str, *, remote: bool = True, deep: bool = False) -> list[tuple[str, DamagedCopy | None]]:
        """Every tier's copy of `key` re-hashed against its record: [(tier, None or what is wrong)].
        An S3 copy by store/chunked/health.py's check: its index and every chunk's presence, and with
        `deep` every chunk's bytes (read, never written to disk)."""
        found = []
        for tier in self._tiers(remote):
            if not tier.has(key):
                continue
            if tier is self.s3:  # the chunks' check: a download would write the whole file
                found += self._s3_verdict(key, deep)
                continue
            try:
                with verified_copy(key, tier, self.local_tier):
                    found.append((tier.name, None))
            except DamagedCopy as exc:
                found.append((tier.name, exc))
        return found

    def _s3_verdict(self, key: str, deep: bool) -> list:
        """verify's [(tier, None or what is wrong)] for S3's copy of `key` ([] when S3 lacks it)."""
        from efabuild.store.chunked.health import S3Damaged

        health = self.s3_health(key, deep=deep)
        return [] if health is None else [(S3_TIER, None if health.ok else S3Damaged(health))]

    def _repaired_chunks(self, copy, target) -> bool:  # noqa: ANN001 - a transfer.Copy, the S3 tier
        """Store again from `copy` the chunks S3's check found missing or damaged, when only they
        are wrong (its index and record stand); False when the artifact must be published anew."""
        from efabuild.store.chunked import health

        found = self._s3_health.get(copy.key)
        if found is None or not found.chunks_only:
            return False
        health.repair(target, copy.key, copy.sqsh, found)
        self._damaged.get(copy.key, set()).discard(target.name)
        del self._s3_health[copy.key]
        return True
