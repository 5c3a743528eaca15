"""A tenant's key space in object storage: ``tenants/<tenant>/`` in the buckets Chronicle knows
can hold its objects, which a tenant's erasure deletes whole.

Those buckets are the ones its skills index names and the ones its sessions' configs read from
(skills blocks, read-only sources), and any an operator names on top. Never every bucket the
credentials list: in an account shared with another deployment (staging beside production) or
another application with a ``tenants/<id>/`` layout, those objects are not this tenant's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from projections import context_queries
from services.context.rules import named_buckets, object_key
from services.errors import ObjectStorageError
from services.storage.s3 import PrefixSurvey, SkillStore


class TenantSpace:
    """``tenants/<tenant>/`` in each bucket known to hold the tenant's objects, Chronicle's own
    buckets (``reserved``: blobs and archives, no tenant prefix) aside."""

    def __init__(
        self,
        store: SkillStore,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
        reserved: frozenset[str],
    ) -> None:
        self._store = store
        self._pool = pool
        self._reserved = reserved

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
        return sorted((found | set(extra)) - self._reserved)

    async def survey(self, tenant: str, extra: Sequence[str] = ()) -> list[PrefixSurvey]:
        """What each known bucket holds under the tenant's prefix (a bucket that does not exist
        left out); one cheap look at each, so that an object store the erasure could not use
        fails it before anything is destroyed (:class:`ObjectStorageError` naming the bucket).
        No bucket known: no object-storage call at all."""
        out: list[PrefixSurvey] = []
        for bucket in await self.buckets(tenant, extra):
            try:
                found = await self._store.survey(bucket, object_key(tenant, ""))
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
        """Whether a known bucket holds an object under the tenant's prefix."""
        return any(s.objects for s in await self.survey(tenant, extra))

    async def delete(self, tenant: str, surveyed: Sequence[PrefixSurvey]) -> int:
        """Delete every object under the tenant's prefix in the ``surveyed`` buckets (each version
        in a versioned one); how many keys went (a rerun finishes what a failed one left, and
        counts only that)."""
        prefix = object_key(tenant, "")
        return sum([await self._store.delete_under(s.bucket, prefix, versioned=s.versioned) for s in surveyed])
