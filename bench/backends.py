"""The systems ``chronicle bench peers`` compares, each called as its users call it.

* ``chronicle``: the stack ``chronicle up`` runs (API, projector and compactor as child processes,
  nats-server, Postgres), through the Python SDK: ``Session.append_message`` (no ``parent_id``:
  the latest leaf, as the reference's ``appendMessage``) and ``Session.get_history``.
* ``agents``: the OpenAI Agents SDK's ``SQLAlchemySession`` on asyncpg, one engine shared by the
  sessions: ``add_items([item])`` per message, ``get_items()``.
* ``langgraph``: a LangGraph graph whose state is ``MessagesState`` (``add_messages``), with one
  node that answers nothing, checkpointed by ``AsyncPostgresSaver`` on a psycopg pool: one
  ``ainvoke`` per message, the history read with ``aget_state``.

The peers come from the optional ``bench`` extra; the product does not depend on them. Each system
writes its own scratch database on the same Postgres server.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from bench.http_api import running_api
from bench.support import BENCH_KEY, Infra, bench_settings
from bench.workloads import MemoryBackend
from chronicle_sdk import ChronicleClient, Session
from projections.migrate import migrate
from services.bootstrap import connect_nats
from services.ops.localstack import free_port
from services.settings import Settings

SETTLE_TIMEOUT_S = 600.0
T = TypeVar("T")


def _role(index: int) -> str:
    return "user" if index % 2 == 0 else "assistant"


@dataclass(frozen=True)
class System:
    """A system the benchmark can run: how to open it, and what it needs installed."""

    name: str
    label: str
    modules: tuple[str, ...]  # importable modules it needs
    distributions: tuple[str, ...]  # their packages, for the report
    open: Callable[[Settings, Infra, str, int], AbstractAsyncContextManager[MemoryBackend]]
    # longest session it is run with, and why (None: any)
    max_appends: int | None = None
    why_max: str = ""

    def missing(self) -> list[str]:
        """The modules it needs that are not installed."""
        out: list[str] = []
        for module in self.modules:
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                out.append(module)
        return out

    def versions(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for dist in self.distributions:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                out[dist] = importlib.metadata.version(dist)
        return out


class PerSession(Generic[T]):
    """One client-side session object per session id, made on first use (as an agent keeps one)."""

    def __init__(self, make: Callable[[str], T]) -> None:
        self._make = make
        self._made: dict[str, T] = {}

    def __call__(self, sid: str) -> T:
        if sid not in self._made:
            self._made[sid] = self._make(sid)
        return self._made[sid]


# -- Chronicle ---------------------------------------------------------------------------------


class ChronicleBackend:
    name = "chronicle"

    def __init__(self, client: ChronicleClient, database: str, processes: Mapping[str, int], js: Any, stream: str):
        self.client = client
        self.database = database
        self.processes = processes
        self._js = js
        self._stream = stream
        self._session: PerSession[Session] = PerSession(client.session)

    async def append(self, session: str, index: int, text: str) -> None:
        message = {"id": f"m{index:06d}", "role": _role(index), "parts": [{"type": "text", "text": text}]}
        await self._session(session).append_message(message)

    async def history(self, session: str) -> int:
        return len(await self._session(session).get_history())

    async def settle(self) -> None:
        """Wait until every durable consumer of the stream (the projector's) has acked all."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            infos = await self._js.consumers_info(self._stream)
            if all(not i.num_pending and not i.num_ack_pending for i in infos):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"chronicle did not catch up in {SETTLE_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.02)

    async def log_bytes(self) -> int:
        return int((await self._js.stream_info(self._stream)).state.bytes)


@contextlib.asynccontextmanager
async def open_chronicle(settings: Settings, infra: Infra, db: str, concurrency: int) -> AsyncIterator[MemoryBackend]:
    cfg = bench_settings(settings, infra, db, api_port=free_port())
    await migrate(db)
    async with running_api(cfg, infra, projector=True, compactor=True) as running:
        nc = await connect_nats(cfg)
        try:
            base = f"http://{cfg.api_host}:{cfg.api_port}"
            async with ChronicleClient(base, BENCH_KEY) as client:
                processes = {**{k: v for k, v in infra.pids.items() if k == "nats-server"}, **running.pids}
                yield ChronicleBackend(client, db, processes, nc.jetstream(), cfg.stream)
        finally:
            await nc.close()


# -- OpenAI Agents SDK: SQLAlchemySession ------------------------------------------------------


def asyncpg_url(db: str) -> str:
    """The SQLAlchemy asyncpg URL of a ``postgresql://`` URL."""
    scheme, rest = db.split("://", 1)
    if scheme not in {"postgresql", "postgres"}:
        raise ValueError(f"not a postgresql:// URL: {scheme}://…")
    return "postgresql+asyncpg://" + rest


class AgentsBackend:
    name = "agents"
    processes: Mapping[str, int] = {}

    def __init__(self, engine: Any, database: str) -> None:
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        self.database = database
        self._session: PerSession[Any] = PerSession(
            lambda sid: SQLAlchemySession(sid, engine=engine, create_tables=True)
        )

    async def append(self, session: str, index: int, text: str) -> None:
        await self._session(session).add_items([{"role": _role(index), "content": text}])

    async def history(self, session: str) -> int:
        return len(await self._session(session).get_items())

    async def settle(self) -> None:
        return None

    async def log_bytes(self) -> int:
        return 0


@contextlib.asynccontextmanager
async def open_agents(settings: Settings, infra: Infra, db: str, concurrency: int) -> AsyncIterator[MemoryBackend]:
    from sqlalchemy.ext.asyncio import create_async_engine

    # the default pool (5 + 10 overflow) serves a concurrency of 10; size it for larger ones
    engine = create_async_engine(asyncpg_url(db), pool_size=max(5, concurrency))
    try:
        yield AgentsBackend(engine, db)
    finally:
        await engine.dispose()


# -- LangGraph: AsyncPostgresSaver + add_messages ----------------------------------------------


class LangGraphBackend:
    name = "langgraph"
    processes: Mapping[str, int] = {}

    def __init__(self, graph: Any, database: str) -> None:
        from langchain_core.messages import AIMessage, HumanMessage

        self._graph = graph
        self._kinds = (HumanMessage, AIMessage)
        self.database = database

    @staticmethod
    def _config(session: str) -> dict[str, Any]:
        return {"configurable": {"thread_id": session}}

    async def append(self, session: str, index: int, text: str) -> None:
        message = self._kinds[index % 2](content=text)
        await self._graph.ainvoke({"messages": [message]}, self._config(session))

    async def history(self, session: str) -> int:
        state = await self._graph.aget_state(self._config(session))
        return len(state.values.get("messages", []))

    async def settle(self) -> None:
        return None

    async def log_bytes(self) -> int:
        return 0


async def _no_reply(state: Any) -> dict[str, Any]:
    """The graph's one node: it adds nothing (the benchmark appends every message as input)."""
    return {}


@contextlib.asynccontextmanager
async def open_langgraph(settings: Settings, infra: Infra, db: str, concurrency: int) -> AsyncIterator[MemoryBackend]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    # as LangGraph's docs set up a pool for the saver
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(db, min_size=1, max_size=max(1, concurrency), kwargs=kwargs, open=False) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        builder = StateGraph(MessagesState)
        builder.add_node("agent", _no_reply)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        yield LangGraphBackend(builder.compile(checkpointer=saver), db)


SYSTEMS: dict[str, System] = {
    "chronicle": System("chronicle", "Chronicle (SDK)", (), ("chronicle",), open_chronicle),
    "agents": System(
        "agents",
        "Agents SDK SQLAlchemySession",
        ("agents", "sqlalchemy", "asyncpg"),
        ("openai-agents", "sqlalchemy", "asyncpg"),
        open_agents,
    ),
    "langgraph": System(
        "langgraph",
        "LangGraph AsyncPostgresSaver",
        ("langgraph", "langgraph.checkpoint.postgres", "langchain_core"),
        ("langgraph", "langgraph-checkpoint-postgres", "langchain-core"),
        open_langgraph,
        max_appends=2_000,
        why_max="each checkpoint stores the whole message list again: storage and time per append grow with the "
        "session (~90 KB per message at 1,000 messages, so ~9 GB and hours at 10,000)",
    ),
}
