"""``chronicle bench {ingest,api,history,search,rebuild,context,compaction,peers,api-replicas,all}``.

Benchmarks against a same-run baseline. Each benchmark starts its own infrastructure (see
:mod:`services.bench_support`), prints a table, writes JSON (default
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

from services.bench_compaction import compaction
from services.bench_context import context
from services.bench_http import api
from services.bench_ingest import ingest, rebuild
from services.bench_peers import peers
from services.bench_query import history, search
from services.bench_replicas import api_replicas
from services.bench_support import BenchOptions, Infra, PeersOptions, Report, infrastructure
from services.settings import Settings

Bench = Callable[[Settings, Infra, BenchOptions], Awaitable[Report]]
BENCHMARKS: dict[str, Bench] = {
    "ingest": ingest,
    "api": api,
    "history": history,
    "search": search,
    "rebuild": rebuild,
    "context": context,
    "compaction": compaction,
    "peers": peers,
    "api-replicas": api_replicas,
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


def _names(value: str | None, *, upper: bool = False) -> tuple[str, ...] | None:
    if not value:
        return None
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(n.upper() for n in names) if upper else tuple(n.lower() for n in names)
