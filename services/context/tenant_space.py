"""A tenant's key space in object storage: ``tenants/<tenant>/`` in the buckets Chronicle knows
can hold its objects, which a tenant's erasure deletes whole.

Those buckets are the ones its skills index names and the ones its sessions' configs read from
(skills blocks, read-only sources), and any an operator names on top. Never every bucket the
credentials list: in an account shared with another deployment (staging beside production) or
another application with a ``tenants/<id>/`` layout, those objects are not this tenant's.

A tenant chooses the buckets its index and configs name (a config or a skill event published
straight to JetStream included), so none of them may stop its erasure: a name that is no bucket
name holds nothing and is left out, and a bucket the store refuses
(:class:`~services.errors.BucketUnusable`: ``AccessDenied``, a key it would not delete) is named in
the answer while the others are cleaned. Object storage that cannot be used at all (not there,
credentials refused) still fails the survey before anything is destroyed."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from events.context import is_bucket_name
from projections import context_queries
from services.context.rules import named_buckets, object_key
from services.errors import BucketUnusable, ObjectStorageError
from services.storage.s3 import NotCleaned, PrefixSurvey, SkillStore

log = logging.getLogger("chronicle.erasure")


class TenantSpace:
    """``tenants/<tenant>/`` in each bucket known to hold the tenant's objects, Chronicle's own
    buckets (``reserved``: blobs and archives, no tenant prefix) aside."""

    def __init__(
        self,
        store: SkillStore,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
        reserved: frozenset[str],
        own: str | None = None,
    ) -> None:
        self._store = store
        self._pool = pool
        self._reserved = reserved
        self._own = own  # one of Chronicle's own buckets: whether the store can be used at all

    async def buckets(self, tenant: str, extra: Iterable[str] = ()) -> list[str]:
        """The buckets the tenant's skills index and session configs name, those an erasure of it
        noted (:meth:`note`), with ``extra`` (read from Postgres alone: no object-storage call)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT DISTINCT bucket FROM skills_index WHERE tenant = %s", (tenant,))
            found = {str(row[0]) for row in await cur.fetchall()}
            cur = await conn.execute("SELECT bucket FROM tenant_erasure_buckets WHERE tenant = %s", (tenant,))
            found |= {str(row[0]) for row in await cur.fetchall()}
            for config in await context_queries.tenant_configs(conn, tenant):
                found |= named_buckets(config)
        found |= set(extra)
        names = {b for b in found if is_bucket_name(b)}
        if found - names:  # stored before the contract refused them: no object can be in one
            shown = ", ".join(repr(b[:100]) for b in sorted(found - names))
            log.warning("tenant %r: left out what is no S3 bucket name (it holds nothing): %s", tenant, shown)
        return sorted(names - self._reserved)

    async def survey(self, tenant: str, extra: Sequence[str] = ()) -> list[PrefixSurvey]:
        """What each known bucket holds under the tenant's prefix (a bucket that does not exist
        left out); one cheap look at each, so that an object store the erasure could not use
        fails it before anything is destroyed (:class:`ObjectStorageError` naming the bucket).
        A bucket the store refuses (:class:`BucketUnusable`) is in the answer with its
        ``refused`` reason, and fails nothing: the tenant named it. No bucket known: no
        object-storage call at all."""
        out: list[PrefixSurvey] = []
        buckets = await self.buckets(tenant, extra)
        if buckets and self._own is not None:
            try:
                await self._store.check_usable(self._own)
            except ObjectStorageError as exc:
                raise ObjectStorageError(f"bucket {self._own!r}: {exc.detail}") from exc
        for bucket in buckets:
            try:
                found = await self._store.survey(bucket, object_key(tenant, ""))
            except BucketUnusable as exc:
                out.append(PrefixSurvey(bucket, versioned=False, objects=0, refused=exc.detail))
                continue
            except ObjectStorageError as exc:
                raise ObjectStorageError(f"bucket {bucket!r}: {exc.detail}") from exc
            if found is not None:
                out.append(found)
        return out

    async def note(self, tenant: str, surveyed: Sequence[PrefixSurvey]) -> None:
        """Keep the ``surveyed`` buckets for the tenant's erasure, before its first session is:
        erasing a session drops its config, and a rerun must still find the buckets it named."""
        if not surveyed:
            return
        async with self._pool.connection() as conn:
            await conn.cursor().executemany(
                "INSERT INTO tenant_erasure_buckets (tenant, bucket) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                [(tenant, s.bucket) for s in surveyed],
            )

    async def held(self, tenant: str, extra: Sequence[str] = ()) -> bool:
        """Whether a known bucket holds an object under the tenant's prefix;
        :class:`BucketUnusable` naming a bucket that could not be looked at when none does (it
        may)."""
        surveyed = await self.survey(tenant, extra)
        if any(s.objects for s in surveyed):
            return True
        refused = next((s for s in surveyed if s.refused is not None), None)
        if refused is not None:
            raise BucketUnusable(f"bucket {refused.bucket!r}: {refused.refused}")
        return False

    async def delete(self, tenant: str, surveyed: Sequence[PrefixSurvey]) -> tuple[int, list[NotCleaned]]:
        """Delete every object under the tenant's prefix in the ``surveyed`` buckets (each version
        in a versioned one); how many keys went (a rerun finishes what a failed one left, and
        counts only that), and the buckets left as they were, or part-way: those the survey could
        not look at, and those the store refused a request of (:class:`BucketUnusable`, the others
        are cleaned all the same). An object store that fails otherwise fails it
        (:class:`ObjectStorageError`)."""
        prefix = object_key(tenant, "")
        deleted, left = 0, []
        for s in surveyed:
            if s.refused is not None:
                left.append(NotCleaned(s.bucket, s.refused))
                continue
            try:
                deleted += await self._store.delete_under(s.bucket, prefix, versioned=s.versioned)
            except BucketUnusable as exc:
                left.append(NotCleaned(s.bucket, exc.detail))
        return deleted, left
