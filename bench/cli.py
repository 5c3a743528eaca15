"""``chronicle bench <name>``: ingest, api, commands, history, search, rebuild, context, compaction, peers,
api-replicas, encryption, all.

Benchmarks against a same-run baseline. Each benchmark starts its own infrastructure (see
:mod:`bench.support`), prints a table, writes JSON (default
``bench-results/<name>.json``) and reports its ratio to a baseline measured in the same run on the
same machine, because absolute numbers on small machines drift. ``--smoke`` runs tiny sizes in
seconds, so the benchmarks are exercised by the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop

from bench.commands import commands
from bench.compaction import compaction
from bench.context import context
from bench.http_api import api
from bench.ingest import ingest, rebuild
from bench.peers import peers
from bench.query import history, search
from bench.replicas import api_replicas
from bench.sealing import encryption
from bench.support import BenchOptions, Infra, PeersOptions, Report, infrastructure
from services import logs
from services.ops.argparsing import OneLineParser
from services.settings import Settings, load_settings

Bench = Callable[[Settings, Infra, BenchOptions], Awaitable[Report]]
BENCHMARKS: dict[str, Bench] = {
    "ingest": ingest,
    "api": api,
    "commands": commands,
    "history": history,
    "search": search,
    "rebuild": rebuild,
    "context": context,
    "compaction": compaction,
    "peers": peers,
    "api-replicas": api_replicas,
    "encryption": encryption,
}
RESULTS_DIR = Path("bench-results")


async def run_benchmarks(settings: Settings, names: list[str], options: BenchOptions) -> dict[str, Report]:
    """Run ``names`` in order on one private infrastructure; write each report's JSON.

    ``options.out`` is the JSON file for a single benchmark, or a directory for several.
    """
    reports: dict[str, Report] = {}
    with tempfile.TemporaryDirectory(prefix="chronicle-bench-") as tmp:
        async with infrastructure(settings, options, Path(tmp)) as infra:
            for name in names:
                load_before = f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "?"
                report = await BENCHMARKS[name](settings, infra, options)
                report.params["smoke"] = options.smoke
                report.where = {**infra.described, "loadavg_1m_at_start": load_before}
                if options.out is not None and len(names) == 1:
                    path = options.out
                else:
                    path = (options.out or RESULTS_DIR) / f"{name}.json"
                report.write(path)
                reports[name] = report
                print(report.table() + f"\nresults: {path}\n", flush=True)
    return reports


async def run_one(settings: Settings, name: str, options: BenchOptions) -> Report:
    """One benchmark, in-process (the tests call this)."""
    return (await run_benchmarks(settings, [name], options))[name]


def run_bench(settings: Settings, args: argparse.Namespace) -> int:
    """The ``chronicle bench`` command; exit status 0 when every benchmark ran (targets may miss)."""
    names = [n for n in BENCHMARKS if n != "api-replicas"] if args.which == "all" else [args.which]
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    options = BenchOptions(
        smoke=args.smoke,
        out=Path(args.out) if args.out else None,
        messages=args.messages,
        sessions=args.sessions,
        requests=args.requests,
        nats_url=args.nats_url,
        projector_workers=args.projector_workers,
        repeats=args.repeats,
        peers=PeersOptions(
            appends=args.appends,
            concurrency=args.concurrency,
            w2_appends=args.w2_appends,
            w3_appends=args.w3_appends,
            reads=args.reads,
            scale=args.scale,
            systems=_names(args.systems),
            workloads=_names(args.workloads, upper=True),
            analyze=not args.no_analyze,
        ),
    )
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # the services' loop, for the clients too
        reports = runner.run(run_benchmarks(settings, names, options))
    missed = [f"{n}: {t.name}" for n, r in reports.items() for t in r.targets if not t.met]
    if missed:
        print("targets missed:\n  " + "\n  ".join(missed), file=sys.stderr)
    return 0


def parser(prog: str = "python -m bench") -> argparse.ArgumentParser:
    """``python -m bench {bench,chaos,failover} …`` (also reached as ``chronicle bench|chaos|failover``)."""
    top = OneLineParser(prog=prog, description="Chronicle's benchmarks and fault drills")
    sub = top.add_subparsers(dest="command", required=True)
    p_bench = sub.add_parser("bench", help="benchmarks on private infrastructure, against a same-run baseline")
    p_bench.add_argument(
        "which",
        choices=[*BENCHMARKS, "all"],
    )
    p_bench.add_argument("--smoke", action="store_true", help="tiny sizes (seconds), as the tests run them")
    p_bench.add_argument("--out", default=None, help="JSON file (a directory with 'all'); default bench-results/")
    p_bench.add_argument("--messages", type=int, default=None, help="messages to ingest/rebuild/load")
    p_bench.add_argument(
        "--sessions", type=int, default=None, help="sessions the messages are spread over (peers: W1's, default 10)"
    )
    p_bench.add_argument("--requests", type=int, default=None, help="timed requests per measurement")
    p_bench.add_argument(
        "--projector-workers",
        type=int,
        default=2,
        help="ingest: projector processes, one per partition (CHRONICLE_PARTITIONS = this); default 2, one per core",
    )
    p_bench.add_argument("--nats-url", default=None, help="use this NATS server instead of starting one")
    peers = p_bench.add_argument_group("peers", "chronicle bench peers: W1, W2, W3 on Chronicle and its peers")
    peers.add_argument("--repeats", type=int, default=None, help="runs of each system; medians (default 3)")
    peers.add_argument("--scale", type=float, default=1.0, help="multiply every default append count (0.1: quick)")
    peers.add_argument("--appends", type=int, default=None, help="W1 appends per session (default 200)")
    peers.add_argument("--concurrency", type=int, default=None, help="W1 sessions at a time (default 10)")
    peers.add_argument("--w2-appends", type=int, default=None, help="W2 appends, one session (default 1,000)")
    peers.add_argument("--w3-appends", type=int, default=None, help="W3 appends, one session (default 10,000)")
    peers.add_argument("--reads", type=int, default=None, help="timed history reads per workload (default 20)")
    peers.add_argument(
        "--systems", default=None, help="comma-separated: chronicle,agents,langgraph (default: all installed)"
    )
    peers.add_argument("--workloads", default=None, help="comma-separated: W1,W2,W3 (default: all)")
    peers.add_argument("--no-analyze", action="store_true", help="do not rerun W3 on Chronicle after ANALYZE")
    p_chaos = sub.add_parser("chaos", help="kill -9 and restart every component under load; check nothing is lost")
    p_chaos.add_argument("--short", action="store_true", help="the short form the test suite runs (about a minute)")
    p_chaos.add_argument("--writers", type=int, default=None, help="concurrent HTTP writers (default 8)")
    p_chaos.add_argument("--rounds", type=int, default=None, help="times each fault is injected (default 1)")
    p_chaos.add_argument("--down", type=float, default=None, help="seconds a killed component stays down")
    p_chaos.add_argument("--between", type=float, default=None, help="seconds of load between faults")
    p_chaos.add_argument("--keep", type=Path, default=None, help="keep logs and data in this directory")
    p_fail = sub.add_parser(
        "failover", help="a three-node NATS cluster under load: kill -9 the stream's leader, then a follower"
    )
    p_fail.add_argument("--writers", type=int, default=6, help="concurrent HTTP writers over two API processes")
    p_fail.add_argument("--keep", type=Path, default=None, help="keep logs and data in this directory")
    return top


def main(argv: list[str] | None = None, *, prog: str = "python -m bench") -> int:
    """``python -m bench …``; ``chronicle bench|chaos|failover …`` hands its arguments here with
    ``prog="chronicle"``, so that the usage and the refusals name the command that was run."""
    args = parser(prog).parse_args(argv)
    settings = load_settings()
    logs.configure(settings.log_level, settings.log_format)
    match args.command:
        case "bench":
            return run_bench(settings, args)
        case "chaos":
            from bench.chaos import main as chaos
            from bench.chaos import options_from

            return chaos(settings, options_from(args))
        case _:
            from bench.failover import FailoverOptions
            from bench.failover import main as failover

            return failover(settings, FailoverOptions(writers=args.writers, keep=args.keep))


def _names(value: str | None, *, upper: bool = False) -> tuple[str, ...] | None:
    if not value:
        return None
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(n.upper() for n in names) if upper else tuple(n.lower() for n in names)
