"""The composition root: real adapters wired from settings, opened and closed in one place."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import nats
import psycopg
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from psycopg_pool import AsyncConnectionPool

from events.blobs import BlobStore
from events.objectstore import JetStreamBlobStore
from events.publisher import Publisher
from events.stream import ensure_stream
from events.subjects import SubjectLayout
from projections.context import ContextProjection
from projections.history import HistoryProjection
from projections.migrate import migrate
from projections.overlays import OverlayProjection
from projections.runner import Projection, ProjectorRunner
from services.commands import Commands
from services.compactor import CompactionService, Compactor
from services.compactor_state import CompactorState
from services.context import ContextService
from services.s3_blobs import S3BlobStore
from services.settings import Settings
from services.skills_store import SkillStore
from services.summarizers import OfflineSummarizer, OpenAISummarizer, Summarizer
from services.tokens import TokenCounter
from services.waiting import AppliedWaiter


@dataclass
class Container:
    settings: Settings
    layout: SubjectLayout
    nc: NatsClient
    js: JetStreamContext
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]]
    publisher: Publisher
    blobs: BlobStore
    waiter: AppliedWaiter
    originals: BlobStore
    commands: Commands
    context: ContextService
    compaction: CompactionService

    def projections(self) -> list[Projection]:
        return [HistoryProjection(self.blobs), ContextProjection(), OverlayProjection()]

    def compactor(self) -> Compactor:
        s = self.settings
        state = CompactorState(s.compactor_name, self.context.counter.count, self.blobs)
        runner = ProjectorRunner(
            js=self.js,
            pool=self.pool,
            conninfo=s.database_url,
            layout=self.layout,
            projections=[state],
            name=s.compactor_name,
            batch_size=s.projector_batch,
        )
        return Compactor(runner, state, self.compaction)

    def projector(self) -> ProjectorRunner:
        s = self.settings
        filt = None
        name = s.projector_name
        if s.projector_partitions is not None:
            parts = sorted(set(s.projector_partitions))
            if len(parts) != 1:
                raise ValueError("a partitioned projector consumes exactly one partition")
            filt = self.layout.partition_filter(parts[0])
            name = f"{name}.p{parts[0]:03d}"
        return ProjectorRunner(
            js=self.js,
            pool=self.pool,
            conninfo=self.settings.database_url,
            layout=self.layout,
            projections=self.projections(),
            name=name,
            filter_subject=filt,
            batch_size=s.projector_batch,
        )


async def connect_nats(url: str) -> NatsClient:
    return await nats.connect(url, name="chronicle", max_reconnect_attempts=-1, reconnect_time_wait=0.5)


def summarizer_of(settings: Settings) -> Summarizer:
    if settings.summarizer == "openai":
        return OpenAISummarizer(
            base_url=settings.summarizer_base_url,
            model=settings.summarizer_model,
            api_key=settings.summarizer_api_key,
            timeout_s=settings.summarizer_timeout_s,
            attempts=settings.summarizer_attempts,
        )
    return OfflineSummarizer()


@contextlib.asynccontextmanager
async def open_container(settings: Settings) -> AsyncIterator[Container]:
    """Open every adapter (migrating the database first when ``auto_migrate``), close on exit."""
    if settings.auto_migrate:
        await migrate(settings.database_url)
    layout = settings.layout()
    nc = await connect_nats(settings.nats_url)
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
        settings.database_url, min_size=2, max_size=20, open=False, kwargs={"autocommit": True}
    )
    await pool.open(wait=True, timeout=15)
    waiter = AppliedWaiter(
        pool, settings.database_url, settings.read_wait_timeout_s, settings.projector_name, settings.partitions
    )
    try:
        js = nc.jetstream()
        await ensure_stream(js, layout)
        publisher = Publisher(js, layout)
        blobs = JetStreamBlobStore(js, settings.blob_bucket)
        await waiter.start()
        skills = SkillStore(
            settings.s3_endpoint,
            settings.s3_access_key,
            settings.s3_secret_key,
            secure=settings.s3_secure,
            region=settings.s3_region,
        )
        originals = S3BlobStore(skills, settings.originals_bucket)
        commands = Commands(
            publisher,
            pool,
            waiter,
            blobs,
            payload_limit_bytes=settings.payload_limit_bytes,
            max_message_bytes=settings.max_message_bytes,
            attempts=settings.command_attempts,
            originals=originals,
            row_cap_bytes=settings.row_cap_bytes,
        )
        counter = TokenCounter(settings.tiktoken_encoding)
        context = ContextService(commands.conditional, publisher, pool, counter, skills)
        context.reserved_buckets = frozenset({settings.originals_bucket})
        compaction = CompactionService(pool, publisher, commands.conditional, context, counter, summarizer_of(settings))
        yield Container(
            settings, layout, nc, js, pool, publisher, blobs, waiter, originals, commands, context, compaction
        )
    finally:
        await waiter.stop()
        await pool.close()
        await nc.flush()
        await nc.close()
