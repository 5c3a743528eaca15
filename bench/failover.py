"""``chronicle failover``: the event log on a three-node NATS cluster loses a node under load.

A private stack (see :mod:`bench.chaos_stack`) with three nats-servers clustered on loopback,
the stream and the blob bucket at R3, one projector, one compactor and two API processes serving
the same tenant (each projector/compactor/API connected to another node first). The chaos suite's
writers (:class:`bench.chaos.Writers`, half on each API) keep appending, writing a budgeted
block and compacting. Then:

1. ``kill -9`` of the node that leads the stream. Writes pause until the remaining two elect a
   leader and the clients on the dead node reconnect to another; the pause is measured as the
   longest time without an acknowledged append. Recovery is a new write answered, read back
   through the read model, and a compactor pulling from the work queue, with nothing restarted but
   the node.
2. The node is started again (same store, same routes) and catches up: the time until every copy
   of the stream is current is measured.
3. The same with a node that does not lead the stream.

At the end, the chaos suite's checks: every acknowledged append in the log exactly once at the
sequence it was answered with, histories exact, no block over budget, and the read models equal
a rebuild (``chronicle verify``); and the projector, the compactor and both APIs are the same
processes that started (none was restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats.errors
from nats.js.api import StreamInfo

from bench.chaos import ChaosReport, Ledger, Writers, check, private_stack, wait_recovered
from bench.chaos_stack import ChaosStack
from events.credentials import nkey_public_key
from projections.migrate import migrate
from services.bootstrap import connect_nats
from services.ops.localstack import free_port, rotated, start_cluster_node
from services.ops.natsconf import ClusterNode, NatsAccess
from services.ops.replicas import copies_current
from services.settings import Settings, new_api_key

CHRONICLE = ("projector", "compactor", "api", "api-2")


@dataclass(frozen=True)
class FailoverOptions:
    nodes: int = 3
    writers: int = 6
    settle_s: float = 3.0  # load before the first kill, and between the steps
    down_s: float = 2.0  # how long a killed node stays down
    recover_timeout_s: float = 90.0
    keep: Path | None = None


@dataclass
class NodeLoss:
    """One killed node: what it led, how long writes paused, when things recovered."""

    node: str
    led_stream: bool
    new_leader: str | None = None
    pause_s: float | None = None  # longest time without an acknowledged append, around the kill
    recovered_s: float | None = None  # kill -> a write answered, read back, and a compactor pulling
    stages_s: tuple[float, ...] = ()  # kill -> that write answered, read back, a compactor pulling
    caught_up_s: float | None = None  # restart -> every copy of the stream current
    retries: int = 0  # requests the writers repeated meanwhile

    def line(self) -> str:
        role = "stream leader" if self.led_stream else "follower"
        stages = "/".join(f"{s:.1f}" for s in self.stages_s) or "-"
        return (
            f"  {self.node} ({role}): writes paused {_secs(self.pause_s)}, recovered {_secs(self.recovered_s)} "
            f"after the kill (a new write answered/read back/a compactor pulling at {stages}s; new leader "
            f"{self.new_leader}), caught up {_secs(self.caught_up_s)} after its restart, {self.retries} retries"
        )


@dataclass
class FailoverReport:
    chaos: ChaosReport
    losses: list[NodeLoss] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)  # Chronicle processes that exited meanwhile
    replicas: int = 0

    @property
    def ok(self) -> bool:
        return (
            self.chaos.ok
            and not self.restarted
            and len(self.losses) == 2
            and all(n.recovered_s is not None and n.caught_up_s is not None for n in self.losses)
        )

    def lines(self) -> list[str]:
        appends = sum(len(v) for v in self.chaos.ledger.appends.values())
        out = [f"stream replicas: {self.replicas}; appends acknowledged: {appends}", "nodes lost:"]
        out += [n.line() for n in self.losses]
        out.append("Chronicle processes restarted: " + (", ".join(self.restarted) or "none"))
        return out + self.chaos.lines()


def _secs(value: float | None) -> str:
    return f"{value:.1f}s" if value is not None else "NEVER"


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest time within ``[start, end]`` without one of ``times`` (sorted)."""
    inside = [t for t in times if start <= t <= end]
    edges = [start, *inside, end]
    return max(b - a for a, b in itertools.pairwise(edges))


@dataclass
class ClusterStack(ChaosStack):
    """The chaos stack with a cluster of nats-servers, each killable by its name (``nats-n2``)."""

    nodes: list[tuple[int, ClusterNode]] = field(default_factory=list)
    route_password: str = ""

    def start_nats(self) -> None:
        for i in range(len(self.nodes)):
            self.start_node(i)

    def start_node(self, i: int) -> None:
        node = self.nodes[i][1]
        self.procs[f"nats-{node.name}"] = start_cluster_node(self.nodes, i, self.tmp, self.access, self.route_password)

    def start(self, name: str) -> None:
        names = [f"nats-{n.name}" for _, n in self.nodes]
        if name in names:
            self.start_node(names.index(name))
        else:
            super().start(name)


async def stream_info(settings: Settings) -> StreamInfo:
    """The stream's state, asked afresh (any node answers; the leader's view is returned)."""
    nc = await connect_nats(settings)
    try:
        return await nc.jetstream().stream_info(settings.stream)
    finally:
        await nc.close()


async def _until_current(settings: Settings, replicas: int, timeout_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        with contextlib.suppress(Exception):  # a node still starting, an election: ask again
            if copies_current(await stream_info(settings), replicas).current >= replicas:
                return time.monotonic() - start
        await asyncio.sleep(0.2)
    return None


async def lose_node(
    stack: ClusterStack,
    client: httpx.AsyncClient,
    ledger: Ledger,
    options: FailoverOptions,
    *,
    leader: bool,
    say: Callable[[str], None],
    spare: Collection[str] = (),
) -> NodeLoss:
    """Kill the stream's leader (or a follower, not one of ``spare`` when another will do) under
    load, start it again, measure."""
    settings = stack.settings
    info = await stream_info(settings)
    if info.cluster is None or not info.cluster.leader:
        raise RuntimeError(f"stream {settings.stream} has no leader")
    followers = [p.name for p in info.cluster.replicas or [] if p.name]
    followers.sort(key=lambda f: f in spare)
    name = info.cluster.leader if leader else followers[0]
    loss = NodeLoss(name, leader)
    retries = ledger.retries
    say(f"failover: kill -9 nats-{name} ({'leader' if leader else 'follower'})")
    killed = time.monotonic()
    await asyncio.to_thread(stack.kill, f"nats-{name}")
    marks: list[float] = []
    recovered = await wait_recovered(client, settings, "probe", options.recover_timeout_s, marks)
    loss.recovered_s = time.monotonic() - killed if recovered else None
    loss.stages_s = tuple(m - killed for m in marks)
    loss.pause_s = longest_gap(sorted(ledger.acked_at), killed, time.monotonic())
    with contextlib.suppress(Exception):
        after = await stream_info(settings)
        loss.new_leader = after.cluster.leader if after.cluster else None
    await asyncio.sleep(max(0.0, options.down_s - (time.monotonic() - killed)))
    await asyncio.to_thread(stack.restart, f"nats-{name}")
    loss.caught_up_s = await _until_current(settings, options.nodes, options.recover_timeout_s)
    loss.retries = ledger.retries - retries
    say(f"failover: {loss.line().strip()}")
    return loss


async def checked(stack: ChaosStack, ledger: Ledger, say: Callable[[str], None], attempts: int = 3) -> ChaosReport:
    """The chaos suite's end-of-run checks. A JetStream request that times out (a node just
    restarted may take seconds to answer a consumer's creation on a loaded machine) repeats the
    whole read, into a fresh report: reading the log again changes nothing."""
    for attempt in range(1, attempts + 1):
        # the projector's own advisory lock and every partition's
        report = ChaosReport(ledger, [], locks_expected=1 + stack.settings.partitions)
        try:
            await check(stack, report)
            return report
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            if attempt == attempts:
                raise
            say(f"failover: the check's read timed out ({exc!r}); reading again")
    raise AssertionError("unreachable")


async def run_failover(base: Settings, options: FailoverOptions, say: Callable[[str], None] = print) -> FailoverReport:
    """Start a private clustered stack, lose the leader then a follower under load, check."""
    started = time.monotonic()
    with contextlib.ExitStack() as exits:
        tmp = options.keep or Path(exits.enter_context(tempfile.TemporaryDirectory(prefix="chronicle-failover-")))
        tmp.mkdir(parents=True, exist_ok=True)
        nodes = [(free_port(), ClusterNode(f"n{i + 1}", "127.0.0.1", free_port())) for i in range(options.nodes)]
        servers = [f"nats://127.0.0.1:{port}" for port, _ in nodes]
        pg, settings, seed, key = await private_stack(base, tmp, nats_url=",".join(servers))
        settings = settings.model_copy(update={"stream_replicas": options.nodes})
        access = NatsAccess((nkey_public_key(seed),), settings.layout())
        stack = ClusterStack(tmp, settings, access, nodes[0][0], pg, nodes=nodes, route_password=new_api_key())
        api2_port = free_port()
        for i, name in enumerate(CHRONICLE):  # each process prefers another node
            stack.overrides[name] = {"nats_url": ",".join(rotated(servers, i))}
        stack.overrides["api-2"]["api_port"] = api2_port
        exits.callback(stack.close)
        await migrate(settings.database_url)
        say(f"failover: {options.nodes} nats-servers clustered on loopback, stream at R{options.nodes}, under {tmp}")
        await asyncio.to_thread(stack.start_nats)
        for name in CHRONICLE:
            await asyncio.to_thread(stack.start, name)
        pids = {name: stack.procs[name].pid for name in CHRONICLE}
        ledger = Ledger()
        report = FailoverReport(ChaosReport(ledger, []), replicas=options.nodes)
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            httpx.AsyncClient(base_url=stack.api_url, headers=headers, timeout=30) as client,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{api2_port}", headers=headers, timeout=30) as client2,
        ):
            probe = await client.post("/v1/sessions", json={"id": "probe", "name": "probe"}, timeout=30)
            probe.raise_for_status()
            half = max(1, options.writers // 2)
            groups = [Writers(client, ledger, half), Writers(client2, ledger, options.writers - half)]
            tasks = [asyncio.create_task(groups[w % 2].run(w)) for w in range(options.writers)]
            try:
                await asyncio.sleep(options.settle_s)
                for leader in (True, False):
                    killed = [n.node for n in report.losses]
                    loss = await lose_node(stack, client, ledger, options, leader=leader, say=say, spare=killed)
                    report.losses.append(loss)
                    await asyncio.sleep(options.settle_s)
            finally:
                for group in groups:
                    group.stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
        report.restarted = [n for n in CHRONICLE if stack.procs[n].poll() is not None or stack.procs[n].pid != pids[n]]
        say("failover: load stopped; checking the log, the histories and the read models")
        report.chaos = await checked(stack, ledger, say)
        for name in ("api", "api-2", "compactor", "projector"):
            report.chaos.sigterm_s[name] = await asyncio.to_thread(stack.terminate, name)
    report.chaos.duration_s = time.monotonic() - started
    return report


def main(settings: Settings, options: FailoverOptions) -> int:
    report = asyncio.run(run_failover(settings, options, lambda line: print(line, flush=True)))
    print()
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1
