"""Long-running process bodies: the projector loop and the API server, with signal handling."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from types import FrameType
from typing import Any

import nats.errors
import uvicorn
import uvloop
from nats.aio.client import Client as NatsClient

from services.api.app import build_app
from services.api.http_head import head_bounded_protocol
from services.api.keyring import KeyRing
from services.bootstrap import open_container, settle_heap
from services.brokers import broker_connection
from services.commands_nats.app import serving_commands
from services.connection_loss import nats_node
from services.ops.entry import sighup_before_serving
from services.settings import Settings, UnusableResource

log = logging.getLogger("chronicle")


def serve(main: Coroutine[Any, Any, None]) -> None:
    """Run a long-lived service on uvloop (the API gets it from uvicorn): less CPU per event."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


class NatsClosed(nats.errors.Error):
    """The process's NATS connection is closed for good: nats-py gives up, without reconnecting,
    after most protocol errors the server answers by closing it (a message over its
    ``max_payload``, say). The process cannot recover by itself: it stops, and a supervisor starts
    it again (``chronicle up`` stops the stack with it)."""

    def __str__(self) -> str:
        return f"the connection was closed for good ({self.args[0]}): the process stopped; start it again"


class StoppedAfterFailure(NatsClosed):
    """The process stopped for a failure (its NATS connection closed for good), and its closing
    was cut short: still that failure, whatever cancelled the close (never a stop's exit 0)."""


NATS_CLOSED_POLL_S = 1.0
"""How often a process looks whether its NATS connection is closed for good."""


@contextlib.asynccontextmanager
async def stopped_if_nats_closes(
    connections: Callable[[], Iterable[NatsClient | None]], stop: Callable[[], None]
) -> AsyncIterator[None]:
    """Run the body; when one of the ``connections`` (asked at each look: a broker's exists once
    it started) is closed for good meanwhile, call ``stop`` (the body ends as on a signal) and
    raise :class:`NatsClosed` after it: one line and a non-zero exit, instead of a process that
    stays up answering every request with the same failure."""
    gone: list[NatsClient] = []

    async def watch() -> None:
        while not gone:
            gone.extend(nc for nc in connections() if nc is not None and nc.is_closed)
            if not gone:
                await asyncio.sleep(NATS_CLOSED_POLL_S)
        log.error("NATS connection closed for good (%r): stopping", gone[0].last_error)
        stop()

    task = asyncio.create_task(watch(), name="nats-closed-watch")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if gone:
        raise NatsClosed(repr(gone[0].last_error) if gone[0].last_error is not None else "no error given")


STOP_LIMIT_S = 20.0
"""How long a process may take to stop after SIGINT/SIGTERM before whatever it still waits on is
cancelled: more than the projector's batch in flight is given to commit (``stop_grace_s``, 15 s)."""
EXIT_LIMIT_S = 25.0
"""How long after SIGINT/SIGTERM a process exits at the latest (status 0), whatever is left: a task
that ignores its cancellation, a thread in a call that does not return (the interpreter would
wait for both before it exits)."""


FORCED_AFTER_FAILURE_EXIT = 1
"""The status of a process forced out while it closed after a failure (not a stop asked for)."""


def _exit_after(seconds: float, status: int = 0) -> None:
    """:func:`_exit_now` in ``seconds``, from a thread of its own: the event loop may be what hangs."""
    last = threading.Timer(seconds, _exit_now, args=(status,))
    last.daemon = True
    last.start()


EXIT_LINE_WAIT_S = 1.0
"""How long the last-resort exit waits for its line to be written before it exits without it."""


def _exit_now(status: int = 0) -> None:
    """The process did not end within :data:`EXIT_LIMIT_S` of its stop: one line, and out. The line
    is written to stderr's file descriptor, never through logging, whose handler's lock a stuck
    thread may hold, and from a thread of its own waited on :data:`EXIT_LINE_WAIT_S` at most: a full
    stderr (or stdout) pipe, whose reader is stuck, blocks any write, and must not keep this exit
    from happening."""
    line = f"did not end within {EXIT_LIMIT_S:.0f} s of its stop; exiting without waiting for what is left\n"
    writer = threading.Thread(target=_last_words, args=(line.encode(),), daemon=True)
    writer.start()
    writer.join(EXIT_LINE_WAIT_S)
    os._exit(status)


def _last_words(line: bytes) -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        os.write(2, line)


class Stopping:
    """SIGINT/SIGTERM for a long-running process (:func:`stoppable`). The first signal sets
    ``event``: a process that is serving (:meth:`serving` called) ends on it by itself, its work in
    flight finished (the projector's batch commits or rolls back). One still starting (connecting
    to NATS, waiting for Postgres or for JetStream, which never watch ``event``) is cancelled at
    once instead, closing what it opened. Either way a process that has not ended
    :data:`STOP_LIMIT_S` after the signal is cancelled wherever it waits (a close on a server that
    no longer answers, a reconnect loop), and so is one given a second signal: a supervisor's
    SIGTERM is never left waiting for SIGKILL (a projector whose nats-server was gone, or whose
    Postgres did not answer, ignored it: its start waited up to a minute for JetStream, or for
    ever for the database). Should anything still keep it (a task that ignores its cancellation, a
    thread the interpreter would wait for), it exits 0 :data:`EXIT_LIMIT_S` after the signal."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.event = asyncio.Event()
        self.cancelled = False  # the main task was cancelled here (its CancelledError is the stop)
        self.failed = False  # stopping for a failure, not a signal (:meth:`closing`)
        self._task = task
        self._serving = False
        self._limit: asyncio.TimerHandle | None = None

    def serving(self, *, signals: bool = True) -> None:
        """From here the process ends on ``event`` by itself; without ``signals`` the signals are
        no longer taken here at all (uvicorn takes them: the API)."""
        self._serving = True
        if not signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def closing(self, limit_s: float, *, failed: bool = False) -> None:
        """The process has stopped serving (by its own stop, the API's uvicorn having taken the
        signal; ``failed``: for a failure, no signal): what it still does (closing) is cancelled
        after ``limit_s``. A process stopping for a failure keeps a failure's exit status whatever
        ends it (a supervisor restarting on failure must see one): the cancellation is then an
        error, and the last-resort exit status :data:`FORCED_AFTER_FAILURE_EXIT`."""
        self.close()
        self._serving = True
        self.failed = failed
        self._limit = asyncio.get_running_loop().call_later(limit_s, self._cancel)
        _exit_after(limit_s + EXIT_LIMIT_S - STOP_LIMIT_S, FORCED_AFTER_FAILURE_EXIT if failed else 0)

    def signalled(self) -> None:
        if not self.event.is_set():
            _exit_after(EXIT_LIMIT_S)
        if self.event.is_set() or not self._serving:
            self.close()
            self._cancel()  # a second signal, or a start that watches nothing
        else:
            self._limit = asyncio.get_running_loop().call_later(STOP_LIMIT_S, self._cancel)
        self.event.set()

    def _cancel(self) -> None:
        """Cancel the main task, and again every second until it ends: a ``finally`` that waits
        (a close, a task given time to end after its cancellation) is cut short too."""
        if self._task.done():
            return
        if not self.cancelled:
            said = "while starting" if not self._serving else "now: cancelling what it still waits on"
            log.warning("stopping %s", said)
        self.cancelled = True
        self._task.cancel()
        self._limit = asyncio.get_running_loop().call_later(1.0, self._cancel)

    def close(self) -> None:
        if self._limit is not None:
            self._limit.cancel()


@contextlib.asynccontextmanager
async def stoppable() -> AsyncIterator[Stopping]:
    """SIGINT/SIGTERM handled as :class:`Stopping` says while the body runs; the cancellation it
    makes ends the body quietly (the process exits 0, as after any stop)."""
    task = asyncio.current_task()
    assert task is not None
    stopping = Stopping(task)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.signalled)
    try:
        yield stopping
    except asyncio.CancelledError:
        if not stopping.cancelled:
            raise
        task.uncancel()
        if stopping.failed:  # its closing after a failure was cut short: still a failure
            raise StoppedAfterFailure("its close after that did not end in time: cancelled") from None
    finally:
        stopping.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def run_projector(settings: Settings) -> None:
    """Apply events until SIGINT/SIGTERM; the batch in flight commits (or rolls back) first."""
    async with stoppable() as stopping:
        stop = stopping.event
        async with open_container(settings) as c, stopped_if_nats_closes(lambda: [c.nc], stop.set):
            runner = c.projector()
            settle_heap()
            log.info(
                "projector %s consuming %s via NATS %s",
                runner.name,
                runner.filter_subject or c.layout.wildcard,
                nats_node(c.nc),
            )
            stopping.serving()
            await runner.run(stop)
        st = runner.stats
        log.info("projector stopped: %d events applied in %d batches", st.applied, st.batches)


async def run_compactor(settings: Settings) -> None:
    """Take compaction requests (the projector publishes them) and summarise until SIGINT/SIGTERM."""
    async with stoppable() as stopping:
        stop = stopping.event
        async with open_container(settings) as c:
            compactor = c.compactor()  # its work queue on a connection of its own
            settle_heap()
            log.info(
                "compactor taking %s with the %s summarizer via NATS %s",
                settings.compaction_queue,
                settings.summarizer,
                nats_node(c.nc),
            )
            async with stopped_if_nats_closes(lambda: [c.nc, broker_connection(compactor.broker)], stop.set):
                stopping.serving()
                await compactor.run(stop)
        log.info("compactor stopped")


async def run_commands(settings: Settings) -> None:
    """Answer commands over NATS request/reply until SIGINT/SIGTERM (requests in flight finish)."""
    async with stoppable() as stopping:
        stop = stopping.event
        async with (
            open_container(settings) as c,
            serving_commands(settings, c) as broker,  # the requests come on its own connection
            stopped_if_nats_closes(lambda: [c.nc, broker_connection(broker)], stop.set),
        ):
            settle_heap()
            log.info("commands answered on %s.<tenant>.<command> via NATS %s", c.layout.commands, nats_node(c.nc))
            stopping.serving()
            await stop.wait()
        log.info("commands stopped")


def listening_socket(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    """A bound TCP socket for uvicorn; with ``reuse_port`` other processes may bind the same port
    (Linux spreads incoming connections over them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


API_GRACEFUL_S = 10
"""How long the API's stop waits for the requests in flight (uvicorn's graceful shutdown)."""
NATS_LOST_GRACE_S = 1
"""How long the API's stop waits for the requests in flight when its NATS connection is down
(instead of its graceful 10 s): a request waiting on the event log cannot end sooner than the
server is back; each is answered ``503 unavailable`` (services/api/problems.py, ``CrashGuard``)."""


class ApiServer(uvicorn.Server):
    """uvicorn's server that, as it begins to stop, tells the answers that would stay open
    (followed events) to end: they end within a second, cleanly, instead of being cut after the
    graceful timeout. With ``nats_connected`` saying the event log is gone (nats-server killed,
    the stack stopping because of it), the requests in flight are given :data:`NATS_LOST_GRACE_S`,
    not the graceful timeout (the stop took 11 s, then answered them a plain 500)."""

    def __init__(
        self, config: uvicorn.Config, stopping: asyncio.Event, nats_connected: Callable[[], bool] | None = None
    ) -> None:
        super().__init__(config)
        self._stopping = stopping
        self._nats_connected = nats_connected
        self.signalled = False  # stopped by a signal (else: by a failure, ``should_exit`` set)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signalled = True
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._stopping.set()
        if self._nats_connected is not None and not self._nats_connected():
            graceful = self.config.timeout_graceful_shutdown
            self.config.timeout_graceful_shutdown = min(graceful or NATS_LOST_GRACE_S, NATS_LOST_GRACE_S)
        await super().shutdown(sockets)


def api_http_protocol(settings: Settings) -> type[asyncio.Protocol] | str:
    """The HTTP protocol the API is served with: uvicorn's httptools one with bounds on a
    request's head (``api_max_header_bytes``, ``api_header_timeout_s``) and on the rest of a body
    answered unread (``api_body_timeout_s``; services/api/http_head.py); the plain one, with a
    warning, where uvicorn's no longer has the shape those are written for."""
    protocol = head_bounded_protocol(
        settings.api_max_header_bytes, settings.api_header_timeout_s, settings.api_body_timeout_s
    )
    if protocol is None:
        log.warning(
            "uvicorn %s's httptools protocol is not the one services/api/http_head.py extends: request heads "
            "are served without a size bound or a timeout (pin uvicorn to a version it supports)",
            uvicorn.__version__,
        )
        return "httptools"
    return protocol


def api_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for serving the API (``options``: its others): the HTTP protocol of
    :func:`api_http_protocol`, and no WebSocket protocol (``ws="none"``), so that no request is
    ever upgraded: the API speaks HTTP/1.1 only, and the plain protocol served where uvicorn's is
    not the shape the bounds are written for would otherwise hand one asking to a WebSocket
    library a dependency installed (uvicorn's ``ws="auto"``)."""
    return uvicorn.Config(app, http=api_http_protocol(settings), ws="none", **options)


def run_api(settings: Settings) -> None:
    """Serve the API until SIGINT/SIGTERM (SIGHUP reloads its keys); with ``api_reuse_port`` on a
    socket shared with the other API processes on the same port. The adapters open before the
    server starts, as in every other process: what stops it from starting (a setting, NATS or
    Postgres, another log's read models) reaches ``cli.main`` as it is, one line and its exit
    status, not a server traceback."""
    serve(_serve_api(settings))


async def _serve_api(settings: Settings) -> None:
    # the port first: one another process holds stops the API in one line, before anything opens
    sock = api_socket(settings)
    # SIGHUP reloads the keys (services/api/keyring.py), from now on: uvicorn takes SIGINT and
    # SIGTERM only (with signal.signal), so this handler of the loop's is left alone by it
    keys = KeyRing(settings.grants_by_key_hash())
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, keys.reload, settings)
    if sighup_before_serving():  # recorded by the entry point while this process started
        keys.reload(settings)
    try:
        async with stoppable() as stopping:  # uvicorn takes the signals once it serves
            await _serve_api_on(settings, sock, keys, stopping)
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
        sock.close()


def api_socket(settings: Settings) -> socket.socket:
    """The API's bound socket (shared with the other API processes with ``api_reuse_port``); a
    port that cannot be bound (another process listens there, an address not this machine's) is
    an :class:`UnusableResource` naming the settings."""
    try:
        return listening_socket(settings.api_host, settings.api_port, reuse_port=settings.api_reuse_port)
    except OSError as exc:
        raise _port_unusable(settings, exc) from None


def listen_on(sock: socket.socket, settings: Settings) -> None:
    """Start listening on the API's bound socket once the API can serve (uvicorn listens again, which
    only sets the backlog). Two processes started together on one port both bind it (neither listens
    yet); the later to listen is refused here: an :class:`UnusableResource`, as for a port taken
    before binding, not a failure inside uvicorn."""
    try:
        sock.listen(API_BACKLOG)
    except OSError as exc:
        raise _port_unusable(settings, exc) from None


API_BACKLOG = 2048
"""uvicorn's default backlog, so that listening here first changes nothing of what it sets."""


def _port_unusable(settings: Settings, exc: OSError) -> UnusableResource:
    return UnusableResource(
        f"CHRONICLE_API_PORT {settings.api_port} on CHRONICLE_API_HOST {settings.api_host} cannot be listened on: "
        f"{exc.strerror or exc} (another process there? stop it, or set CHRONICLE_API_PORT)"
    )


async def _serve_api_on(settings: Settings, sock: socket.socket, keys: KeyRing, stopping: Stopping) -> None:
    async with open_container(settings, warm_reads=True) as c:
        app = build_app(settings, c, keys)
        settle_heap()
        config = api_config(
            app,
            settings,
            host=settings.api_host,
            port=settings.api_port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=API_GRACEFUL_S,
        )
        server = ApiServer(config, app.state.stopping, lambda: c.nc.is_connected)
        stopped_by_the_server = functools.partial(_stopped_by_the_server, server)
        # uvicorn stops on SIGINT/SIGTERM and raises the signal again once it has stopped: with the
        # default handlers that would end the process before the adapters close (and SIGINT would
        # be a KeyboardInterrupt traceback); with these it exits 0 after them, as the other processes do
        stopping.serving(signals=False)  # until now a signal stopped its start
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stopped_by_the_server)
        async with stopped_if_nats_closes(lambda: [c.nc], lambda: setattr(server, "should_exit", True)):
            # once nothing stops it from serving (a refusal before it is one line alone)
            log.info(
                "api keys: %d in force (keys file: %s), keys fingerprint %s",
                len(keys.grants),
                settings.api_keys_file or "none",
                keys.fingerprint,
            )
            listen_on(sock, settings)  # not at bind: a TCP probe would take the API as up before it had opened NATS
            await server.serve(sockets=[sock])
            stopping.closing(STOP_LIMIT_S - API_GRACEFUL_S, failed=not server.signalled)


def _stopped_by_the_server(server: ApiServer, signum: int, frame: FrameType | None) -> None:
    """A signal uvicorn has acted on already (it stopped the server), raised again: nothing more;
    or one come before uvicorn took the signals (it would have been lost: the API served on), which
    stops the server as uvicorn would."""
    server.signalled = True
    server.should_exit = True
