"""A tenant's key space in object storage: ``tenants/<tenant>/`` in every bucket Chronicle can
reach (its skill documents, indexed or not, and the read-only sources it uploaded), which a
tenant's erasure deletes whole."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from services.context.rules import object_key
from services.storage.s3 import SkillStore


class TenantSpace:
    """``tenants/<tenant>/`` in each bucket the credentials list and each bucket the tenant's
    skills index names, Chronicle's own buckets (``reserved``: blobs and archives, no tenant
    prefix) aside. A tenant's block may name any bucket, and a document uploaded but never
    recorded (a put that stopped between the upload and its event, a file copied in and never
    synced) is in no index: so every bucket is looked at."""

    def __init__(
        self,
        store: SkillStore,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
        reserved: frozenset[str],
    ) -> None:
        self._store = store
        self._pool = pool
        self._reserved = reserved

    async def _buckets(self, tenant: str) -> list[str]:
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT DISTINCT bucket FROM skills_index WHERE tenant = %s", (tenant,))
            indexed = {str(row[0]) for row in await cur.fetchall()}
        return sorted((indexed | set(await self._store.buckets())) - self._reserved)

    async def held(self, tenant: str) -> bool:
        """Whether any bucket holds an object under the tenant's prefix."""
        for bucket in await self._buckets(tenant):
            if await self._store.any_under(bucket, object_key(tenant, "")):
                return True
        return False

    async def delete(self, tenant: str) -> int:
        """Delete every object under the tenant's prefix; how many (a rerun finishes what a failed
        one left, and counts only that)."""
        return sum([await self._store.delete_under(b, object_key(tenant, "")) for b in await self._buckets(tenant)])
