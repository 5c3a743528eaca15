"""The composition root: real adapters wired from settings, opened and closed in one place."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import ssl
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats
import nats.errors
import psycopg
from faststream.nats.security import NatsCredentials, NatsNKey, NatsSecurity
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import APIError
from psycopg_pool import AsyncConnectionPool

from events.admission import MAX_EVENT_BYTES
from events.blobs import BlobStore, RoutedBlobStores
from events.catalog import CompactionRequested
from events.objectstore import JetStreamBlobStore
from events.publisher import Publisher
from events.stream import ReplicasUnavailable, StreamMissing, ensure_stream, require_stream
from events.subjects import SubjectLayout, partition_of
from projections import queries, search_languages
from projections.context import ContextProjection
from projections.history import HistoryProjection
from projections.keystore import PgKeyStore
from projections.logbinding import check_log, refuse_absent_log
from projections.migrate import check_schema, migrate, migration_files
from projections.overlays import OverlayProjection
from projections.runner import Projection, ProjectorRunner, partition_checkpoint, read_checkpoint
from services import natsclient
from services.compaction.exhausted import Recorder
from services.compaction.lease import Leases
from services.compaction.queue import Requests, consumer_config, request, subscribe
from services.compaction.requester import Requester
from services.compaction.service import CompactionService, Series
from services.compaction.state import CompactorState, pending, series, still_due
from services.compaction.summarizers import OfflineSummarizer, OpenAISummarizer, Summarizer
from services.compaction.worker import Compactor
from services.connection_loss import ReconnectNoise, close_nats, nats_node
from services.context.search_gate import SearchGate, search_slots
from services.context.service import ContextService
from services.context.tenant_space import TenantSpace
from services.dbpool import Pool
from services.settings import Settings, UnusableSetting, shown_nats_url
from services.slots import AsOfGate
from services.storage.blobs import CLAIM_CHECK_S3, S3BlobStore
from services.storage.s3 import SkillStore
from services.tokens import TokenCounter
from services.writes.commands import Commands
from services.writes.erasure import Eraser
from services.writes.waiting import AppliedWaiter

nats_log = logging.getLogger("chronicle.nats")
log = logging.getLogger("chronicle")
JETSTREAM_READY_S = 60.0  # how long a process waits at its start for JetStream to answer
# ... and for a cluster that answers to know enough peers to place the stream's replicas (seen: a
# 3-node cluster refusing 3 replicas for a moment after electing its meta leader)
PLACEMENT_WAIT_S = 15.0


@dataclass
class Container:
    settings: Settings
    layout: SubjectLayout
    nc: NatsClient
    js: JetStreamContext
    pool: Pool
    publisher: Publisher
    blobs: RoutedBlobStores
    waiter: AppliedWaiter
    originals: BlobStore
    commands: Commands
    context: ContextService
    compaction: CompactionService
    as_of_gate: AsOfGate = field(default_factory=lambda: AsOfGate(4, 2))  # the settings' (bootstrap)

    @property
    def keys(self) -> PgKeyStore:
        """The data keys (the publisher's: it seals with them; readers open with them)."""
        keys = self.publisher.keys
        assert isinstance(keys, PgKeyStore)
        return keys

    @property
    def eraser(self) -> Eraser:
        stores = [*self.blobs.members, self.originals]
        skills = self.context.skills
        space = (
            None
            if skills is None
            else TenantSpace(skills, self.pool, self.context.reserved_buckets, self.settings.originals_bucket)
        )
        return Eraser(self.keys, self.publisher, self.pool, stores, space)

    def projections(self) -> list[Projection]:
        """The read models: what a rebuild replays and ``verify`` compares (the projector also
        keeps the compaction state after them: :meth:`_runner`)."""
        return [HistoryProjection(self.blobs, self.keys), ContextProjection(), OverlayProjection()]

    def compactor(self) -> Compactor:
        """A compactor process's work-queue subscriber; the requests come from the projector."""
        s = self.settings
        broker = work_broker(s)
        consumer = consumer_config(self.layout, s.compaction_queue, s.compaction_attempts, s.compaction_backoff_s)

        async def due(req: CompactionRequested) -> bool:
            async with self.pool.connection() as conn:
                return await still_due(conn, s.projector_name, req.tenant, req.session, req.seq)

        async def series_of(req: CompactionRequested) -> Series:
            async with self.pool.connection() as conn:
                return await series(conn, s.projector_name, req.tenant, req.session)

        async def pending_of(tenant: str, session: str) -> CompactionRequested | None:
            async with self.pool.connection() as conn:
                found = await pending(conn, s.projector_name, tenant, session, attempts=s.compaction_attempts)
            return None if found is None else request(tenant, session, found.leaf, found.estimate, found.seq)

        work = subscribe(
            broker,
            self.layout,
            self.compaction,
            durable=s.compaction_queue,
            concurrency=s.compactor_concurrency,
            attempts=s.compaction_attempts,
            backoff_s=s.compaction_backoff_s,
            still_due=due,
            series_of=series_of,
            pending_of=pending_of,
        )
        retired = "chronicle-" + s.compactor_name.replace(".", "-")  # its consumer of the log, before
        recorder = Recorder(self.compaction, series_of, s.compaction_attempts, still_due=due)
        return Compactor(self.nc, self.js, self.layout, broker, work, consumer, retired, s.database_url, recorder)

    def projector(self) -> ProjectorRunner:
        """The projector of ``projector_partitions`` (None: every partition, one checkpoint):
        one durable consumer over those partitions and one checkpoint per partition."""
        s = self.settings
        base, partitions = s.projector_name, s.partitions
        if s.projector_partitions is None:

            async def from_partitions(conn: psycopg.AsyncConnection[Any]) -> int | None:
                """After partitioned projectors (their rows newer than this one's): the lowest of
                their checkpoints, when every partition has one; their rows go either way."""
                cur = await conn.execute(
                    "WITH gone AS (DELETE FROM checkpoints WHERE starts_with(name, %s) RETURNING seq, updated_at) "
                    "SELECT min(seq), count(*), max(updated_at) > coalesce("
                    "(SELECT updated_at FROM checkpoints WHERE name = %s), '-infinity') FROM gone",
                    (base + ".p", base),
                )
                row = await cur.fetchone()
                return int(row[0]) if row and row[1] == partitions and row[2] else None

            every = [base] + [partition_checkpoint(base, p) for p in range(partitions)]
            return self._runner(base, seed=from_partitions, locks=every)
        parts = sorted(set(s.projector_partitions))
        if not parts or parts[0] < 0 or parts[-1] >= s.partitions:
            raise ValueError(f"projector_partitions must name partitions 0..{s.partitions - 1}")
        names = [partition_checkpoint(base, p) for p in parts]

        async def from_unpartitioned(conn: psycopg.AsyncConnection[Any]) -> int | None:
            """Before this layout's first run: the unpartitioned projector's checkpoint."""
            cur = await conn.execute("SELECT count(*) FROM checkpoints WHERE name = ANY(%s)", (names,))
            row = await cur.fetchone()
            return (await read_checkpoint(conn, base) or None) if row and row[0] == 0 else None

        filters = [self.layout.partition_filter(p) for p in parts]
        mine = set(parts)

        def owns(tenant: str, session: str) -> bool:
            return partition_of(tenant, session, s.partitions) in mine

        if len(parts) == 1:
            return self._runner(names[0], owns, filter_subject=filters[0], seed=from_unpartitioned)
        return self._runner(
            f"{names[0]}-{parts[-1]:03d}x{len(parts)}",
            owns,
            filter_subjects=filters,
            checkpoints=names,
            seed=from_unpartitioned,
        )

    def _runner(self, name: str, owns: Callable[[str, str], bool] | None = None, **kwargs: Any) -> ProjectorRunner:
        """A projector: the read models, then the compaction state in the same transaction
        (rows keyed by the projector's base name, each partition worker writing its own
        sessions'); after its commits, the due sessions go to the work queue."""
        s = self.settings
        state = CompactorState(s.projector_name, self.context.counter.count, self.blobs, owns)
        state.keys = self.keys
        runner = ProjectorRunner(
            js=self.js,
            pool=self.pool,
            conninfo=s.database_url,
            layout=self.layout,
            projections=[*self.projections(), state],
            name=name,
            batch_size=s.projector_batch,
            replicas=s.consumer_replicas,
            keys=self.keys,
            log_owner=s.projector_name,
            **kwargs,
        )
        requester = Requester(
            state, Requests(self.js, self.layout), self.pool, lambda: runner.stats.pending <= runner.batch_size
        )
        runner.on_batch = requester.after_batch
        runner.sidecars = [requester.run]
        return runner


def worker_partitions(partitions: int, workers: int, worker: int) -> list[int]:
    """The partitions of projector worker ``worker`` of ``workers`` (round robin)."""
    return [p for p in range(partitions) if p % workers == worker]


NATS_PING_INTERVAL_S = 3
NATS_MAX_OUTSTANDING_PINGS = 2
NATS_STALE_AFTER_S = NATS_PING_INTERVAL_S * (NATS_MAX_OUTSTANDING_PINGS + 1)
"""How long a connection stays on a server that stops answering while its socket stays open (a
hung machine, a node stopped with SIGSTOP) before it is taken for stale and the client reconnects
to another node: each client pings every :data:`NATS_PING_INTERVAL_S` and gives up at the ping
after :data:`NATS_MAX_OUTSTANDING_PINGS` unanswered. nats-py's defaults (a ping every 120 s, two
unanswered allowed) kept every publish, fetch and request through such a node timing out for
minutes (tests/integration/test_hung_nats_node.py)."""


STALE_DETECTION: dict[str, Any] = {
    "ping_interval": NATS_PING_INTERVAL_S,
    "max_outstanding_pings": NATS_MAX_OUTSTANDING_PINGS,
}
"""The connection options of :data:`NATS_STALE_AFTER_S`, for every client and broker Chronicle makes."""


def nats_options(settings: Settings) -> dict[str, Any]:
    """Connection options beyond the URL: the operator NKey or a credentials file, TLS (CA, client
    certificate), and :data:`STALE_DETECTION`."""
    options: dict[str, Any] = {**STALE_DETECTION}
    if settings.nats_nkey_seed is not None:
        options["nkeys_seed_str"] = settings.nats_nkey_seed.get_secret_value()
    elif settings.nats_creds_file:
        options["user_credentials"] = settings.nats_creds_file
    tls = tls_context(settings)
    if tls is not None:
        options["tls"] = tls
    return options


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS of the NATS connections (CA, client certificate), when the settings ask for it."""
    if not (settings.nats_tls_ca_file or settings.nats_tls_cert_file):
        return None
    tls = ssl.create_default_context(cafile=settings.nats_tls_ca_file)
    if settings.nats_tls_cert_file:
        tls.load_cert_chain(settings.nats_tls_cert_file, settings.nats_tls_key_file)
    return tls


def nats_security(settings: Settings) -> NatsSecurity | None:
    """:func:`nats_options`'s identity and TLS, as FastStream takes them."""
    tls = tls_context(settings)
    if settings.nats_nkey_seed is not None:
        return NatsNKey.from_seed(settings.nats_nkey_seed.get_secret_value(), ssl_context=tls)
    if settings.nats_creds_file:
        return NatsCredentials.from_file(settings.nats_creds_file, ssl_context=tls)
    return NatsSecurity(ssl_context=tls) if tls is not None else None


def work_broker(settings: Settings) -> natsclient.Broker:
    """A FastStream broker for the compaction work queue, connected as :func:`connect_nats` is
    (started and stopped by its :class:`Compactor`)."""
    return natsclient.Broker(
        settings.nats_servers(),
        name="chronicle-compactor",
        max_reconnect_attempts=-1,
        **STALE_DETECTION,
        dont_randomize=True,
        security=nats_security(settings),
        graceful_timeout=1.0,  # a summary cut short at shutdown is redelivered: nothing is lost
        logger=logging.getLogger("chronicle.compactor.queue"),
        log_level=logging.DEBUG,
    )


NATS_CONNECT_ATTEMPTS = 10
"""Tries per server of the first connect, half a second apart, before it fails with
:class:`nats.errors.NoServersError` (a tool pointed at a NATS server that is not there exits 4
instead of trying forever). Once connected, a client reconnects for as long as it runs."""


@dataclass(slots=True)
class _Starting:
    """A connection's permissions violations while its process starts (``connect_nats(starting=True)``):
    kept, not logged, until :func:`when_jetstream_ready` raises them as one line or, once JetStream
    answered, logs them."""

    violations: list[str]
    ready: bool = False


_STARTING: weakref.WeakKeyDictionary[NatsClient, _Starting] = weakref.WeakKeyDictionary()


class JetStreamDenied(nats.errors.Error):
    """The NATS server does not let this identity use the JetStream API (a permissions violation
    on ``$JS.API.…``): a tenant's identity, say, where Chronicle's operator identity is needed.
    No retry is going to be let in."""

    def __init__(self, violation: str) -> None:
        super().__init__(violation)
        self.violation = violation

    def __str__(self) -> str:
        return f"{self.violation}: this identity may not use the JetStream API"


class IdentityRefused(nats.errors.AuthorizationError):
    """The NATS server refused the identity while connecting (the error it sent, in the message):
    one line where it is caught, not a log line before it as well."""

    def __init__(self, refusal: str) -> None:
        super().__init__(refusal)
        self.refusal = refusal

    def __str__(self) -> str:
        return f"nats: authorization failed: the server does not admit this identity ({self.refusal})"


class NatsUnreachable(nats.errors.Error):
    """The first connect found no NATS server that answers (:data:`NATS_CONNECT_ATTEMPTS`)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def __str__(self) -> str:
        return self.detail


def jetstream_denied(nc: NatsClient) -> str | None:
    """The permissions violation on the JetStream API that the server reported for ``nc`` while
    its process started, if any."""
    start = _STARTING.get(nc)
    found = [v for v in start.violations if '"$js.api.' in v.lower()] if start is not None else []
    return found[0] if found else None


def _started(nc: NatsClient) -> None:
    """JetStream answered ``nc``: log the violations kept while starting; log later ones at once."""
    start = _STARTING.get(nc)
    if start is not None and not start.ready:
        start.ready = True
        for violation in start.violations:
            nats_log.error("nats: %s", violation)


async def connect_nats(settings: Settings, *, starting: bool = False) -> NatsClient:
    """A client that keeps reconnecting once connected (the event log may restart under a running
    service); the first connect is bounded (:data:`NATS_CONNECT_ATTEMPTS`). With
    several URLs (a cluster's nodes) it connects to the first that answers, in the order given
    (so processes can be spread over the nodes), and on losing its node reconnects to another:
    the stream and its consumers are served by whichever node leads them.

    A server that refuses the identity while connecting is not waited out: no retry is going to
    be let in, so :class:`IdentityRefused` (an AuthorizationError) is raised (a tool given the wrong seed
    said nothing and tried forever).

    ``starting`` (a process that waits for JetStream with :func:`when_jetstream_ready` before it
    does anything): the server's permissions violations are kept until JetStream answers, so
    that an identity denied the JetStream API fails as one line, at once."""
    refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    connected: list[NatsClient] = []
    failed: list[Exception] = []
    start = _Starting([])
    noise = ReconnectNoise()

    async def on_error(exc: Exception) -> None:
        text = str(exc)
        if not refused.done() and "authorization violation" in text.lower():
            refused.set_result(text)
        elif not connected:
            failed.append(exc)  # the first connect's tries: its error names the last one
        elif starting and not start.ready and "permissions violation" in text.lower():
            start.violations.append(text)  # raised by when_jetstream_ready as one line, or logged then
        elif connected[0].is_reconnecting:  # a failed attempt: two a second, bounded to a line now and then
            if (line := noise.attempt_failed(time.monotonic(), exc)) is not None:
                nats_log.error("%s", line)
        elif connected[0].is_closed:  # an attempt cut short by the process closing it: not news
            nats_log.debug("nats: %r while closing", exc)
        else:
            nats_log.error("nats: %r", exc)  # a line each: reconnecting is routine, its traceback noise

    async def on_reconnected() -> None:
        if connected and (line := noise.reconnected(time.monotonic(), nats_node(connected[0]))) is not None:
            nats_log.warning("%s", line)

    connecting = asyncio.ensure_future(
        natsclient.connect(
            settings.nats_servers(),
            name="chronicle",
            max_reconnect_attempts=NATS_CONNECT_ATTEMPTS,
            reconnect_time_wait=0.5,
            dont_randomize=True,
            error_cb=on_error,
            reconnected_cb=on_reconnected,
            **nats_options(settings),
        )
    )
    either: list[asyncio.Future[Any]] = [connecting, refused]
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the process stopped while it connects: no attempt goes on
        connecting.cancel()
        raise
    if connecting.done() and isinstance(connecting.exception(), nats.errors.NoServersError):
        refused.cancel()
        last = f": {failed[-1]!r}" if failed else ""
        raise NatsUnreachable(f"no server answered in {NATS_CONNECT_ATTEMPTS} tries each{last}")
    if connecting.done():
        if not refused.done():
            refused.cancel()  # a refusal later (a reload of the server's users) is logged, retried
        nc = connecting.result()
        if nc.max_payload < MAX_EVENT_BYTES:  # its events would be refused, or close the connection
            await nc.close()
            raise UnusableSetting(
                f"the NATS server at {shown_nats_url(settings.nats_url)} takes messages of at most "
                f"{nc.max_payload} bytes "
                f"(max_payload): Chronicle's events may have {MAX_EVENT_BYTES}; set max_payload to at least 1MB"
            )
        nc.options["max_reconnect_attempts"] = -1  # connected: from now on, reconnect for good
        connected.append(nc)
        if starting:
            _STARTING[nc] = start
        return nc
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await connecting
    raise IdentityRefused(refused.result())


JETSTREAM_UNAVAILABLE: tuple[type[BaseException], ...] = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
)


async def when_jetstream_ready(
    step: Callable[[], Awaitable[None]],
    *,
    timeout_s: float = JETSTREAM_READY_S,
    placement_s: float = PLACEMENT_WAIT_S,
    pause_s: float = 0.25,
    nc: NatsClient | None = None,
) -> None:
    """``step``, repeated while JetStream cannot answer yet (a cluster electing its meta leader
    answers 503; a server still starting does not answer): a cluster's nodes may be up before it
    can create a stream. A cluster that answers but cannot place the replicas yet (its leader has
    not heard from enough peers) is waited for ``placement_s``. Any other error, or still
    unavailable after its wait, is raised; and :class:`JetStreamDenied` as soon as a step went
    unanswered because the server denied ``nc`` the JetStream API (waiting would not change it)."""
    denied = False
    try:
        await _until_ready(step, timeout_s, placement_s, pause_s, nc)
    except JetStreamDenied:
        denied = True  # the violation is its message
        raise
    finally:
        if nc is not None and not denied:
            _started(nc)  # the violations kept while starting: logged now


async def _until_ready(
    step: Callable[[], Awaitable[None]], timeout_s: float, placement_s: float, pause_s: float, nc: NatsClient | None
) -> None:
    start = time.monotonic()
    while True:
        try:
            await step()
            return
        except APIError as exc:
            if exc.code != 503 or time.monotonic() > start + timeout_s:
                raise
        except JETSTREAM_UNAVAILABLE:
            denied = jetstream_denied(nc) if nc is not None else None
            if denied is not None:
                raise JetStreamDenied(denied) from None
            if time.monotonic() > start + timeout_s:
                raise
        except ReplicasUnavailable as exc:
            if not exc.pending or time.monotonic() > start + placement_s:
                raise
        await asyncio.sleep(pause_s)


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


@dataclass(frozen=True, slots=True)
class PreparedDatabase:
    """What :func:`prepare_database` did."""

    applied: list[str]  # the migrations applied
    # ``tenant (language, was language)`` of each tenant whose search language the setting changed
    # in a database made earlier: its messages and search entries were re-indexed
    reindexed: list[str]


async def prepare_database(settings: Settings, *, set_languages: bool = False) -> PreparedDatabase:
    """Apply pending migrations. The tenants' search languages are the setting's after
    ``set_languages`` (``chronicle migrate``) or a new database's first migration; otherwise (a
    service starting) the database's stay in force, and a setting that differs is logged, one
    line, and changes nothing."""
    applied = await migrate(settings.database_url)
    created = bool(applied) and applied[0] == migration_files()[0][1]
    reindexed: list[str] = []
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as conn:
        if set_languages or created:
            kept = await search_languages.stored(conn)
            changed = await search_languages.apply(conn, settings.search_languages)
            if not created:  # a new database held nothing to re-index
                reindexed = search_languages.changes(changed, settings.search_languages, kept)
        elif drift := search_languages.drift(settings.search_languages, await search_languages.stored(conn)):
            log.warning(
                "CHRONICLE_SEARCH_LANGUAGES differs from the search languages the database keeps (%s): the stored "
                "ones stay in force; `chronicle migrate` with this setting changes them",
                "; ".join(drift),
            )
    return PreparedDatabase(applied, reindexed)


async def check_log_binding(
    settings: Settings, pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]], js: JetStreamContext
) -> None:
    """Raise :class:`projections.logbinding.LogMismatch` unless the read models belong to the
    stream (recording the binding when there is none yet)."""
    async with pool.connection() as conn, conn.transaction():
        await check_log(conn, js, settings.stream, settings.projector_name)


async def refuse_absent(settings: Settings, pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]]) -> None:
    """The stream is missing: raise :class:`projections.logbinding.LogAbsent` when the database's
    read models were made from a log (this NATS server is not the stack's). A database not
    migrated yet (``auto_migrate`` off) has made nothing: it passes."""
    async with pool.connection() as conn:
        try:
            await refuse_absent_log(conn, settings.stream, settings.projector_name)
        except psycopg.errors.UndefinedTable:
            return


def settle_heap() -> None:
    """For a long-running process that has loaded what it keeps (the token encoding, the app,
    the adapters): collect, then move what is left out of the collector's generations
    (``gc.freeze``), so that later full collections walk only what requests allocate. Without it
    a full collection walked the whole start-up heap: a pause of 120-165 ms in the API every few
    thousand appends (issue #13's W1; gone with the collector off in the servers)."""
    gc.collect()
    gc.freeze()


def configured_connection(*, warm_reads: bool) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """What each new pool connection runs first: JIT compilation off (Chronicle's statements run
    in milliseconds; the planner's estimate of one, the append's walk under a re-used id with
    statistics that find the id common, can pass ``jit_above_cost`` and make each run compile for
    ~230 ms), as a ``SET`` (a startup ``options`` parameter is refused by PgBouncer and managed
    poolers); with ``warm_reads`` (the API) the hot reads once (:func:`projections.queries.warm_reads`)."""

    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute("SET jit = off")
        if warm_reads:
            await queries.warm_reads(conn)

    return configure


@contextlib.asynccontextmanager
async def open_container(
    settings: Settings,
    *,
    log_check: bool = True,
    create_stream: bool = True,
    warm_reads: bool = False,
    absent_stream: bool = False,
) -> AsyncIterator[Container]:
    """Open every adapter (migrating the database first when ``auto_migrate``), close on exit.

    Unless ``log_check`` is off (tools that repair the binding: ``rebuild``, ``log rebind``), the
    read models must belong to the stream: :class:`projections.logbinding.LogMismatch` otherwise.

    ``create_stream`` off (every command but the services, which set the stack up: the tools that
    read the log, ``replay``, ``verify``, ``archive``, ..., and those that write to it, ``skills``,
    ``erase``): the stream must exist and neither it nor the work queue is created (on a NATS
    server that is not the stack's, a tool made both). Missing, it is
    :class:`projections.logbinding.LogAbsent` when the database's read models were made from a
    log, :class:`events.stream.StreamMissing` otherwise. With ``absent_stream`` too (``archive
    --restore``, which creates it with :func:`events.stream.ensure_stream` once it has read the
    archive) a missing stream is no error, and nothing is created.

    ``warm_reads`` (the API): each new Postgres connection runs the hot reads once before it is
    handed out (:func:`projections.queries.warm_reads`)."""
    if settings.auto_migrate:
        await prepare_database(settings)
    layout = settings.layout()
    nc = await connect_nats(settings, starting=True)
    pool = Pool(
        settings.database_url,
        min_size=min(settings.db_pool_min, settings.db_pool_max),
        max_size=settings.db_pool_max,
        open=False,
        kwargs={"autocommit": True},
        configure=configured_connection(warm_reads=warm_reads),
    )
    waiter = AppliedWaiter(
        pool, settings.database_url, settings.read_wait_timeout_s, settings.projector_name, settings.partitions
    )
    try:
        # inside: a start cut short here (the process stopped, Postgres not answering) closes the
        # pool's connecting workers and the NATS connection too, or they would keep the process up
        await pool.open(wait=True, timeout=15)
        js = nc.jetstream()
        if create_stream:
            await when_jetstream_ready(lambda: ensure_stream(js, layout, replicas=settings.stream_replicas), nc=nc)
        else:
            try:
                await when_jetstream_ready(lambda: require_stream(js, layout), nc=nc)
            except StreamMissing:
                if not absent_stream:
                    await refuse_absent(settings, pool)
                    raise
        async with pool.connection() as conn:
            await check_schema(conn)
        if log_check:
            await check_log_binding(settings, pool, js)
        wrapper = settings.sealing_key_wrapper()
        keys = PgKeyStore(pool, wrapper, seal=settings.encryption, cache_sessions=settings.key_cache_sessions)
        publisher = Publisher(js, layout, keys=keys)
        nats_blobs = JetStreamBlobStore(js, settings.blob_bucket, replicas=settings.stream_replicas)
        await waiter.start()
        skills = SkillStore(
            settings.s3_endpoint,
            settings.s3_access_key,
            settings.s3_secret_key,
            secure=settings.s3_secure,
            region=settings.s3_region,
        )
        originals = S3BlobStore(skills, settings.originals_bucket)
        s3_blobs = S3BlobStore(skills, settings.claim_check_bucket, kind=CLAIM_CHECK_S3)
        # new claim checks go to the configured store; a reference reads from the store it names
        blobs = (
            RoutedBlobStores(s3_blobs, nats_blobs)
            if settings.claim_check_store == "s3"
            else RoutedBlobStores(nats_blobs, s3_blobs)
        )
        commands = Commands(
            publisher,
            pool,
            waiter,
            blobs,
            payload_limit_bytes=settings.payload_limit_bytes,
            max_message_bytes=settings.max_message_bytes,
            attempts=settings.command_attempts,
            turn_timeout_s=settings.read_wait_timeout_s,
            originals=originals,
            row_cap_bytes=settings.row_cap_bytes,
        )
        counter = TokenCounter(settings.tiktoken_encoding)
        context = ContextService(commands.optimistic, publisher, pool, counter, skills)
        context.reserved_buckets = frozenset(
            {settings.originals_bucket, settings.claim_check_bucket, settings.archive_bucket}
        )
        context.search_timeout_s = settings.search_timeout_s
        context.max_skill_bytes = settings.max_skill_bytes
        context.search_gate = SearchGate(
            *search_slots(settings.db_pool_max, settings.search_slots, settings.search_slots_per_tenant)
        )
        leases = Leases(settings.database_url, settings.compactor_concurrency)
        compaction = CompactionService(
            pool, publisher, commands.optimistic, context, counter, summarizer_of(settings), leases
        )
        yield Container(
            settings,
            layout,
            nc,
            js,
            pool,
            publisher,
            blobs,
            waiter,
            originals,
            commands,
            context,
            compaction,
            AsOfGate(settings.as_of_slots, settings.as_of_slots_per_tenant),
        )
    finally:
        await waiter.stop()
        await pool.close()
        if nc.is_connected:  # closed for good by a protocol error, or its server gone: nothing to flush
            await nc.flush()
        await close_nats(nc)
