"""Long-running process bodies: the projector loop and the API server, with signal handling."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any

import uvicorn
import uvloop

from services.api import build_app
from services.bootstrap import open_container
from services.settings import Settings

log = logging.getLogger("chronicle")


def serve(main: Coroutine[Any, Any, None]) -> None:
    """Run a long-lived service on uvloop (the API gets it from uvicorn): less CPU per event."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def run_projector(settings: Settings) -> None:
    """Apply events until SIGINT/SIGTERM; the batch in flight commits (or rolls back) first."""
    stop = asyncio.Event()
    _stop_on_signals(stop)
    async with open_container(settings) as c:
        runner = c.projector()
        log.info("projector %s consuming %s", runner.name, runner.filter_subject or c.layout.wildcard)
        await runner.run(stop)
    log.info("projector stopped")


async def run_compactor(settings: Settings) -> None:
    """Watch token estimates and compact sessions over ``compact_after`` until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    _stop_on_signals(stop)
    async with open_container(settings) as c:
        compactor = c.compactor()
        log.info("compactor %s running with the %s summarizer", settings.compactor_name, settings.summarizer)
        await compactor.run(stop)
    log.info("compactor stopped")


def run_api(settings: Settings) -> None:
    config = uvicorn.Config(
        build_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    uvicorn.Server(config).run()
