"""``chronicle``: one entry point for every process and tool."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import nats.errors
import nkeys
import psycopg
import psycopg.conninfo
import pydantic
import pydantic_settings

from events.context import is_bucket_name
from events.credentials import tenant_nkey_seed
from events.ids import InvalidId, check_session, check_tenant
from events.log import ReadIncomplete
from services import logs
from services.ops.argparsing import OneLineParser
from services.ops.natsconf import ClusterNode, MissingOperator, NatsAccess, cluster_extra, server_config, write_config
from services.ops.up_help import UP_DESCRIPTION, up_epilog
from services.settings import (
    STACK_RECORD,
    Settings,
    UnusableResource,
    UnusableSetting,
    api_key_entry,
    database_address,
    load_settings,
    new_api_key,
    new_operator_seed,
    shown_nats_url,
)

SERVICES = frozenset({"up", "api", "projector", "compactor", "commands"})
"""The commands that run a service (their log is where a retry is worth a warning); the others are tools."""
KEY_USERS = frozenset({"up", "api", "nats-config", "erase"})
"""The commands that use the tenant keys (``CHRONICLE_API_KEYS_FILE`` read, and refused, at their start)."""

DRILLS = {
    "bench": "benchmarks on private infrastructure, against a same-run baseline (source checkout only)",
    "chaos": "kill -9 and restart every component under load; check nothing is lost (source checkout only)",
    "failover": "a three-node NATS cluster under load: kill the leader, then a follower (source checkout only)",
}


NATS_CONFIG_HOST = "127.0.0.1"
"""Where ``chronicle nats-config``'s server listens unless ``--host`` says otherwise: loopback, as
``chronicle up``'s (a server reachable from elsewhere is a choice made by naming its address)."""


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least} (given {value})")
    return value


def at_least_one(text: str) -> int:
    """An argument that counts something to print, or a stream sequence: a whole number of 1 or
    more (argparse's type)."""
    return _whole(text, 1)


def none_or_more(text: str) -> int:
    """A count that may be 0 (argparse's type)."""
    return _whole(text, 0)


def as_of_sequence(text: str) -> int:
    """A stream sequence to read a state as of: 0 (before the first event) or more, as
    ``as_of_seq`` over HTTP (argparse's type)."""
    return _whole(text, 0)


def tenant_id(text: str) -> str:
    """A ``--tenant`` argument: a tenant id as the API takes it (argparse's type)."""
    return _id(check_tenant, text)


def session_id(text: str) -> str:
    """A ``--session`` argument: a session id as the API takes it (argparse's type)."""
    return _id(check_session, text)


def s3_bucket(text: str) -> str:
    """A ``--bucket`` argument: an S3 bucket name (argparse's type), as a session config's takes it."""
    if not is_bucket_name(text):
        raise argparse.ArgumentTypeError(f"{text[:100]!r} is not an S3 bucket name")
    return text


def _id(check: Callable[[str], str], text: str) -> str:
    try:
        return check(text)
    except InvalidId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port_number(text: str) -> int:
    """A port option's argument (argparse's type): a number from 1 to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a port (a number from 1 to 65535)")
    return port


def run_drill(argv: list[str]) -> int:
    """``chronicle bench|chaos|failover …``: handed to ``python -m bench`` of a source checkout.

    The benchmarks and fault drills are not part of the installed product (the wheel ships
    ``events``, ``projections``, ``services`` and the SDK); the import is by name so that the
    product's import graph never reaches them.
    """
    try:
        drills = importlib.import_module("bench.cli")
    except ModuleNotFoundError:
        print(
            f"chronicle {argv[0]}: the benchmarks ship with the source checkout: run `python -m bench`", file=sys.stderr
        )
        return 2
    status: int = drills.main(argv, prog="chronicle")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="chronicle", description="Event-sourced memory for AI agents")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser(
        "up",
        help="run the whole stack on this machine (no Docker)",
        description=UP_DESCRIPTION,
        epilog=up_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p_up.add_argument("--nats-port", type=int, default=4250, help="port of the nats-server it starts")
    p_up.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        choices=range(1, 6),
        metavar="N",
        help="start N nats-servers clustered on loopback (ports --nats-port..+N-1, routes 1000 above) and keep "
        "the stream at N replicas; 3 survives the loss of any one node",
    )
    p_up.add_argument(
        "--api-processes",
        type=int,
        default=None,
        metavar="N",
        help="N `chronicle api` processes sharing the API port (SO_REUSEPORT); default CHRONICLE_API_PROCESSES or 1",
    )
    p_up.add_argument(
        "--s3-port",
        type=port_number,
        default=None,
        metavar="N",
        help="the port of the local S3 (default 9000): used when something answers at 127.0.0.1:N, else moto's "
        "in-memory S3 server started there; every process of the stack uses it. Only without "
        "CHRONICLE_S3_ENDPOINT (a set endpoint is an S3 that must answer)",
    )
    sub.add_parser("api", help="run the HTTP API")
    sub.add_parser("projector", help="run the projector (event log -> Postgres read models)")
    sub.add_parser("compactor", help="run the compaction worker (summary overlays)")
    sub.add_parser("commands", help="answer commands over NATS request/reply (the HTTP API's writes)")
    sub.add_parser("migrate", help="apply database migrations")
    p_replay = sub.add_parser("replay", help="print a session's events exactly as stored, in order")
    p_replay.add_argument("--session", type=session_id, required=True)
    p_replay.add_argument("--tenant", type=tenant_id, default="default")
    p_replay.add_argument("--from-seq", type=at_least_one, default=1)
    p_replay.add_argument("--to-seq", type=at_least_one, default=None)
    p_replay.add_argument("--format", choices=["jsonl", "table"], default="jsonl")
    p_hist = sub.add_parser(
        "history",
        help="a path's messages as stored (no overlays, no unload markers), optionally as of a stream sequence",
    )
    p_hist.add_argument("--session", type=session_id, required=True)
    p_hist.add_argument("--tenant", type=tenant_id, default="default")
    p_hist.add_argument("--leaf-id", default=None)
    p_hist.add_argument("--as-of-seq", type=as_of_sequence, default=None)
    p_rebuild = sub.add_parser("rebuild", help="rebuild read models from sequence 1, then swap atomically")
    p_rebuild.add_argument("--projection", choices=["all", "history", "context", "overlays"], default="all")
    p_rebuild.add_argument("--keep-old", action="store_true", help="keep the replaced tables in a schema")
    p_log = sub.add_parser("log", help="which event log the read models are bound to (docs/architecture.md)")
    log_sub = p_log.add_subparsers(dest="log_command", required=True)
    log_sub.add_parser("show", help="print the binding, the stream's identity and the furthest checkpoint")
    p_rebind = log_sub.add_parser(
        "rebind", help="bind the read models to the stream as it is now (after a deliberate restore from a backup)"
    )
    p_rebind.add_argument(
        "--yes", action="store_true", help="rewrite the binding (without it: print both, change nothing)"
    )
    p_verify = sub.add_parser("verify", help="rebuild into a shadow schema and compare with the live read models")
    p_verify.add_argument("--limit", type=none_or_more, default=5, help="differences to print per table")
    p_archive = sub.add_parser(
        "archive", help="copy the log to object storage for auditors (CHRONICLE_ARCHIVE_BUCKET), or check that copy"
    )
    archive_mode = p_archive.add_mutually_exclusive_group()
    archive_mode.add_argument(
        "--restore",
        action="store_true",
        help="make the stream again from the archive (after its NATS data was lost): into a stream that does not "
        "exist or is empty, every archived event in sequence order; the archive then continues on the restored stream",
    )
    archive_mode.add_argument(
        "--check",
        action="store_true",
        help="prove the archive whole and equal to the stream up to where it reaches: segments contiguous from "
        "sequence 1, each as its manifest says, every stream event of their ranges archived once and equal; "
        "prints the archive's digest through its last sequence (SEQ:DIGEST), for an auditor to keep",
    )
    archive_mode.add_argument(
        "--reclaim",
        action="store_true",
        help="give the archive back to this stream after a restore on another NATS server (a drill made without "
        "--drill) took it over: only when that restore was made from this stream's archive and has archived nothing "
        "of its own into it since",
    )
    archive_mode.add_argument(
        "--accept-lost",
        metavar="FIRST-LAST",
        default=None,
        help="accept a hole the stream no longer holds (a range every run reports lost) as lost: recorded in the "
        "manifest, runs stop failing on it and --check says it as a note",
    )
    p_archive.add_argument(
        "--drill",
        action="store_true",
        help="with --restore: a restore drill (or a copy for an auditor) on another NATS server while the archived "
        "stream lives on: the archive's manifest is left as it is, so the archive stays that stream's",
    )
    p_archive.add_argument("--to-seq", type=at_least_one, default=None, help="archive up to this stream sequence")
    p_archive.add_argument(
        "--anchor",
        default=None,
        metavar="SEQ:DIGEST",
        help="with --check: a digest an earlier --check printed (kept by an auditor): the archive through SEQ must "
        "be what it was then, else a problem (exit 1)",
    )
    p_archive.add_argument(
        "--segment-events", type=at_least_one, default=10_000, help="events per segment (default 10,000)"
    )
    p_skills = sub.add_parser("skills", help="skill documents in object storage")
    skills_sub = p_skills.add_subparsers(dest="skills_command", required=True)
    p_put = skills_sub.add_parser("put", help="upload a skill document and record it in the skills index")
    p_put.add_argument("file")
    p_put.add_argument("--bucket", type=s3_bucket, required=True)
    p_put.add_argument("--key", required=True, help="object key (include the block's prefix, e.g. skills/tax)")
    p_put.add_argument("--description", default=None)
    p_put.add_argument("--tenant", type=tenant_id, default="default")
    p_put.add_argument(
        "--create-bucket",
        action="store_true",
        help="make the bucket when it does not exist, after every other check (without it a missing bucket is "
        "refused; one of Chronicle's own always is)",
    )
    p_sync = skills_sub.add_parser("sync", help="index objects uploaded out of band")
    p_sync.add_argument("--bucket", type=s3_bucket, required=True)
    p_sync.add_argument("--prefix", default="")
    p_sync.add_argument("--tenant", type=tenant_id, default="default")
    for name, what in DRILLS.items():
        # the benchmarks and drills live in the source checkout's bench/ package (not in the wheel):
        # their own parser reads the rest of the command line
        drill = sub.add_parser(name, help=what, add_help=False)
        drill.add_argument("rest", nargs=argparse.REMAINDER)
    p_key = sub.add_parser(
        "keygen", help="make a tenant's API key (and NATS identity), or the operator's NATS identity"
    )
    who = p_key.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", help="a tenant: prints its API key, NATS seed and `api_keys` entry")
    who.add_argument("--operator", action="store_true", help="Chronicle's own NATS identity (an NKey seed)")
    p_key.add_argument(
        "--read-only",
        action="store_true",
        help="with --tenant: a key that only reads (an auditor's): every write and `GET …/data-key` is 403 "
        "read_only_key, and it has no NATS identity",
    )
    p_conf = sub.add_parser("nats-config", help="write the nats-server configuration for these settings")
    p_conf.add_argument("--out", type=Path, default=None, help="file to write (default: print)")
    p_conf.add_argument(
        "--host",
        default=None,
        help=f"address the server's client port listens on (default {NATS_CONFIG_HOST}, as `chronicle up`'s: "
        "give 0.0.0.0 or an interface's address for clients on other machines or containers); a cluster's route "
        "port listens there too (default: each node's host name)",
    )
    p_conf.add_argument("--port", type=int, default=4222)
    p_conf.add_argument("--store-dir", default="/data")
    p_conf.add_argument(
        "--cluster-nodes",
        default="",
        help="a cluster: its nodes' host names, comma-separated; --out is then a directory that gets one "
        "<name>.conf per node (routes between them on --cluster-port, CHRONICLE_NATS_ROUTE_PASSWORD)",
    )
    p_conf.add_argument("--cluster-port", type=int, default=6222, help="a cluster's route port")
    p_repl = sub.add_parser(
        "stream-replicas", help="move the event stream (and the blob bucket) to N replicas on the NATS cluster"
    )
    p_repl.add_argument("replicas", type=int, choices=range(1, 6), metavar="N")
    p_repl.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the new copies to catch up")
    p_quar = sub.add_parser("quarantine", help="events the projectors refused (quarantined)")
    quar_sub = p_quar.add_subparsers(dest="quarantine_command", required=True)
    p_qlist = quar_sub.add_parser("list", help="quarantined events, newest first")
    p_qlist.add_argument("--tenant", type=tenant_id, default=None)
    p_qlist.add_argument("--limit", type=at_least_one, default=50, help="entries to print (at least 1)")
    p_qshow = quar_sub.add_parser("show", help="one quarantined event, with its raw bytes")
    p_qshow.add_argument("seq", type=int)
    p_erase = sub.add_parser(
        "erase", help="erase a session, or a whole tenant, for good (destroy the data keys; docs/security.md)"
    )
    p_erase.add_argument("--tenant", type=tenant_id, required=True)
    p_erase.add_argument(
        "--session", type=session_id, default=None, help="one session (default: every session of the tenant)"
    )
    p_erase.add_argument(
        "--yes", action="store_true", help="erase the whole tenant (without it: print what would go, erase nothing)"
    )
    p_erase.add_argument(
        "--bucket",
        action="append",
        default=[],
        metavar="BUCKET",
        help="with a whole tenant: also delete everything under tenants/<T>/ in BUCKET (repeatable), beside the "
        "buckets its skills index and session configs name",
    )
    p_erase.add_argument(
        "--reason",
        default=None,
        help="why (at most 500 characters, no NUL), recorded with the erasure for auditors (GET /v1/erasures) "
        "and kept after it: no personal data",
    )
    p_keys = sub.add_parser("keys", help="key-encryption keys of the data keys")
    keys_sub = p_keys.add_subparsers(dest="keys_command", required=True)
    keys_sub.add_parser("new-kek", help="print a new key-encryption key (put it first in CHRONICLE_KEK)")
    keys_sub.add_parser("rewrap", help="wrap every data key under the current (first) key-encryption key")
    argv = sys.argv[1:] if argv is None else argv
    # a drill's own parser reads the rest, --help included (argparse's remainder would not take an
    # option as its first word: `chronicle bench --help` was refused)
    runs_drill = bool(argv) and argv[0] in DRILLS
    args = argparse.Namespace(command=argv[0], rest=argv[1:]) if runs_drill else parser.parse_args(argv)
    if args.command == "replay" and args.to_seq is not None and args.to_seq < args.from_seq:
        # an empty range printed nothing and exited 0, as a session without events there would
        p_replay.error(f"argument --to-seq: must be at least --from-seq {args.from_seq} (given {args.to_seq})")
    if args.command == "keygen":  # no setting used: it makes the entry a bad CHRONICLE_API_KEYS lacks
        return keygen(args)

    try:
        settings = load_settings()
    except (pydantic.ValidationError, pydantic_settings.SettingsError) as exc:  # say which, in a line each
        for line in setting_errors(exc):
            print(f"chronicle {args.command}: {line}", file=sys.stderr, flush=True)
        return SETTINGS_EXIT
    if args.command in KEY_USERS:  # the others never read the keys file: a typo there stops no projector
        try:
            settings.api_key_entries()
        except UnusableSetting as exc:
            print(f"chronicle {args.command}: setting CHRONICLE_API_KEYS_FILE: {exc}", file=sys.stderr, flush=True)
            return SETTINGS_EXIT
    logs.configure(settings.log_level, settings.log_format)
    if args.command not in SERVICES:  # a tool says in one line what failed: each retry it made is noise
        logging.getLogger("urllib3").setLevel(logging.ERROR)
    from events.sealing import KeyUnavailable
    from events.stream import PartitionMismatch, ReplicasUnavailable, StreamMissing, TooFewReplicas
    from projections.logbinding import LogAbsent, LogMismatch
    from projections.migrate import DatabaseNotUtf8, SchemaTooNew
    from services.errors import ChronicleError, ObjectStorageError, ProjectionTimeout

    given_url, given_database = settings.nats_url, settings.database_url
    name_connections(args.command, os.environ)
    try:
        if args.command not in OWN_NATS:
            settings = settings.with_local_stack()
        status = _dispatch(settings, args)
        sys.stdout.flush()  # a reader that closed is met here, not by the interpreter's flush at exit
        return status
    except BrokenPipeError:  # `chronicle quarantine list | head`: the reader has what it wanted
        return _stdout_closed()
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (a rebuild or verify dropped its shadow schema)
        lead = "\n" if sys.stderr.isatty() else ""  # past a progress bar's line
        print(f"{lead}chronicle {args.command}: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    except (LogMismatch, SchemaTooNew, DatabaseNotUtf8) as exc:
        print(f"chronicle {args.command}: refusing to start: {exc}", file=sys.stderr, flush=True)
        return LOG_MISMATCH_EXIT
    except LogAbsent as exc:  # a tool pointed at a NATS server without the log its database was made from
        print(
            f"chronicle {args.command}: the NATS server at {shown_nats_url(settings.nats_url)} does not hold the "
            "log this "
            f"database's read models were built from ({exc}): set CHRONICLE_NATS_URL (and CHRONICLE_NATS_NKEY_SEED) "
            "to the stack's (`make up` listens on 4250; a command run with `chronicle up`'s CHRONICLE_DATA_DIR "
            "finds them there; see README)",
            file=sys.stderr,
            flush=True,
        )
        return SETTINGS_EXIT
    except ReadIncomplete as exc:  # a delivery lost while reading the log: nothing was swapped or written past it
        print(f"chronicle {args.command}: {exc}", file=sys.stderr, flush=True)
        return UNREACHABLE_EXIT
    except StreamMissing as exc:  # a tool that reads the log, pointed at a NATS server without it
        print(
            f"chronicle {args.command}: no stream {exc.stream} on {shown_nats_url(settings.nats_url)}: is "
            "CHRONICLE_NATS_URL the "
            "stack's? (`make up` listens on 4250; see README)",
            file=sys.stderr,
            flush=True,
        )
        return UNREACHABLE_EXIT
    except (UnusableSetting, TooFewReplicas, ReplicasUnavailable, PartitionMismatch) as exc:
        # (the replica and partition counts: a setting the stream or the cluster cannot hold)
        print(f"chronicle {args.command}: {exc}", file=sys.stderr, flush=True)
        return SETTINGS_EXIT
    except KeyUnavailable as exc:  # sealed events, and no (or not the right) key-encryption key
        print(
            f"chronicle {args.command}: {exc}: this stack seals events; set CHRONICLE_KEK_FILE (or CHRONICLE_KEK) to "
            "its key-encryption key (`make up`'s is .chronicle/kek)",
            file=sys.stderr,
            flush=True,
        )
        return SETTINGS_EXIT
    except nkeys.NkeysError as exc:
        print(
            f"chronicle {args.command}: CHRONICLE_NATS_NKEY_SEED is not an NKey seed ({type(exc).__name__}): set it "
            "to Chronicle's operator seed (for the stack `make up` runs, $(cat .chronicle/nats-operator.nk); "
            "`chronicle keygen --operator` makes a new one)",
            file=sys.stderr,
            flush=True,
        )
        return SETTINGS_EXIT
    except UnusableResource as exc:  # the API's port taken
        print(f"chronicle {args.command}: {exc}", file=sys.stderr, flush=True)
        return UNREACHABLE_EXIT
    except psycopg.OperationalError as exc:  # Postgres not there, refusing, or no such database
        address = database_address(settings.database_url)
        where = f"the database of CHRONICLE_DATABASE_URL ({address})"
        if settings.database_url != given_database:
            where = (
                f"the database `chronicle up` recorded in {Path(settings.data_dir) / STACK_RECORD} "
                f"({address}; is that stack running? Set CHRONICLE_DATABASE_URL for another)"
            )
        print(f"chronicle {args.command}: {where} cannot be used: {_first_line(exc)}", file=sys.stderr, flush=True)
        return UNREACHABLE_EXIT
    except ObjectStorageError as exc:  # skills, erase, history as of a sequence (claim-checked bodies)
        from services.ops.audit_cli import storage_unusable

        print(f"chronicle {args.command}: {storage_unusable(settings, exc)}", file=sys.stderr, flush=True)
        return UNREACHABLE_EXIT
    except ChronicleError as exc:  # what the API answers as a problem: one line here, not a traceback
        hint = " (is a projector running? `chronicle up` runs one)" if isinstance(exc, ProjectionTimeout) else ""
        print(f"chronicle {args.command}: {exc.detail} ({exc.code}){hint}", file=sys.stderr, flush=True)
        return UNREACHABLE_EXIT if exc.status >= 500 else SETTINGS_EXIT
    except nats.errors.Error as exc:  # one line that says what to fix, not a traceback
        from services.bootstrap import JetStreamDenied
        from services.ops.processes import NatsClosed

        hint = ""
        if isinstance(exc, NatsClosed):
            pass  # it was reached: nothing about the address to say
        elif "authorization" in str(exc).lower() or isinstance(exc, JetStreamDenied):
            hint = (
                " (this NATS server needs Chronicle's operator identity: CHRONICLE_NATS_NKEY_SEED, or for the stack "
                "`make up` runs, $(cat .chronicle/nats-operator.nk))"
            )
        elif settings.nats_url != given_url:
            hint = (
                f" (the address `chronicle up` recorded in {Path(settings.data_dir) / STACK_RECORD}: is that stack "
                "running? Set CHRONICLE_NATS_URL for another)"
            )
        print(
            f"chronicle {args.command}: NATS at {shown_nats_url(settings.nats_url)}: {exc}{hint}",
            file=sys.stderr,
            flush=True,
        )
        return UNREACHABLE_EXIT


def setting_errors(exc: pydantic.ValidationError | pydantic_settings.SettingsError) -> list[str]:
    """One line per setting ``exc`` refused: its variable, what is wrong and the value given (a
    secret's value is not shown: its variable names it). A structured setting (JSON) that does not
    parse is named with the parser's complaint, never its value."""
    if isinstance(exc, pydantic_settings.SettingsError):
        found = re.search(r'field "([a-z0-9_]+)"', str(exc))
        name = f"CHRONICLE_{found.group(1).upper()}" if found else "a setting"
        cause = _first_line(exc.__cause__) if exc.__cause__ is not None else _first_line(exc)
        return [f"setting {name}: not a value it takes ({cause})"]
    out: list[str] = []
    for error in exc.errors(include_url=False):
        loc = [str(p) for p in error["loc"]]
        if not loc:  # a rule between settings (its message names them)
            out.append(f"settings: {error['msg']}")
            continue
        field = loc[0]
        name = f"CHRONICLE_{field.upper()}"
        name += f" (at {'.'.join(loc[1:])})" if len(loc) > 1 else ""
        given = error.get("input")
        shown = "" if _secret(field) or isinstance(given, dict) else f" (given: {str(given)[:80]!r})"
        out.append(f"setting {name}: {error['msg']}{shown}")
    return out


def _secret(field: str) -> bool:
    # a URL or an endpoint may hold credentials (user:password@): its validator says what is wrong
    words = ("key", "seed", "secret", "kek", "password", "url", "endpoint", "token")
    return any(word in field for word in words)


def _stdout_closed() -> int:
    """Exit quietly on a stdout closed by its reader (a pager or ``head`` that had enough): what
    is still buffered goes nowhere instead of raising again when the interpreter flushes it at
    exit. Exit 0: nothing failed here (a pipeline with ``pipefail`` is not failed by it)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 0


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n")[:1]).strip()
    return text or type(exc).__name__


SETTINGS_EXIT = 2
"""The exit status of a command that cannot run with these settings or arguments (a file that is
not there, a malformed key or seed, no key-encryption key for sealed events, an invalid id, a
replica or partition count the stream or the NATS servers cannot hold, a NATS server without the
log the database's read models were made from)."""
LOG_MISMATCH_EXIT = 3
"""The exit status of a process that refused to start: its read models belong to another log."""
UNREACHABLE_EXIT = 4
"""The exit status of a command that could not use NATS (refused, unreachable, not allowed, or
without the event stream a tool that only reads the log needs), or its database (Postgres
refusing, not answering, or without that database)."""


INTERRUPTED_EXIT = 130
"""The exit status of a command stopped by Ctrl-C (SIGINT; 128 + 2, as a shell reports it)."""


APP_NAME_PREFIX = "chronicle-"


def name_connections(command: str, environ: dict[str, str] | os._Environ[str]) -> None:
    """Name this process's Postgres connections ``chronicle-<command>`` (``chronicle-api``,
    ``chronicle-projector``, ...) in ``pg_stat_activity``, through libpq's ``PGAPPNAME``: every
    connection (the pool's, the LISTEN one, the leases') gets it. An ``application_name`` in
    ``CHRONICLE_DATABASE_URL`` wins, and so does a ``PGAPPNAME`` the operator set; one inherited from a
    Chronicle parent (``chronicle up`` starting its services) is replaced."""
    given = environ.get("PGAPPNAME")
    if given is None or given.startswith(APP_NAME_PREFIX):
        environ["PGAPPNAME"] = APP_NAME_PREFIX + command


OWN_NATS = frozenset({"up", "nats-config", "migrate", *DRILLS})
"""The commands that do not reach the stack ``chronicle up`` recorded in the data dir
(:meth:`Settings.with_local_stack`): ``up`` starts it, ``nats-config`` writes a server's
configuration from the settings alone, ``migrate`` uses the database only, the drills start
their own (``keygen`` reads no setting at all)."""


def _dispatch(settings: Settings, args: argparse.Namespace) -> int:
    match args.command:
        case "up":
            from services.ops.localstack import up

            if args.api_processes is not None:
                settings = settings.model_copy(update={"api_processes": max(1, args.api_processes)})
            if args.s3_port is not None and "s3_endpoint" in settings.model_fields_set:
                print(
                    f"chronicle up: --s3-port {args.s3_port} is for the local S3 (moto) only, and "
                    f"CHRONICLE_S3_ENDPOINT is set ({settings.s3_endpoint}: an S3 that must answer): unset it, "
                    "or leave out --s3-port",
                    file=sys.stderr,
                )
                return SETTINGS_EXIT
            return up(settings, args.nats_port, args.nats_cluster, s3_port=args.s3_port)
        case "api":
            from services.ops.processes import run_api

            run_api(settings)
        case "projector":
            from services.ops.processes import run_projector, serve

            serve(run_projector(settings))
        case "commands":
            from services.ops.processes import run_commands, serve

            serve(run_commands(settings))
        case "compactor":
            from services.ops.processes import run_compactor, serve

            serve(run_compactor(settings))
        case "migrate":
            from services.bootstrap import prepare_database

            done = asyncio.run(prepare_database(settings, set_languages=True))
            print("applied: " + (", ".join(done.applied) if done.applied else "nothing (up to date)"))
            if done.reindexed:
                print(
                    "re-indexed the messages and search entries of " + ", ".join(done.reindexed) + ": "
                    "CHRONICLE_SEARCH_LANGUAGES changed their search language"
                )
        case "archive":
            from services.ops.audit_cli import run_archive

            return asyncio.run(run_archive(settings, args))
        case "skills":
            from services.ops.audit_cli import run_skills

            return asyncio.run(run_skills(settings, args))
        case "log":
            from services.ops.log_cli import run_log

            return asyncio.run(run_log(settings, args))
        case "replay" | "history" | "rebuild" | "verify":
            from services.ops.audit_cli import run_audit

            return asyncio.run(run_audit(settings, args))
        case "bench" | "chaos" | "failover":
            return run_drill([args.command, *args.rest])
        case "nats-config":
            return nats_config(settings, args)
        case "stream-replicas":
            from services.ops.replicas import run_stream_replicas

            return asyncio.run(run_stream_replicas(settings, args.replicas, args.timeout))
        case "quarantine":
            from services.audit.quarantine import run_quarantine

            return asyncio.run(run_quarantine(settings, args))
        case "erase" | "keys":
            from services.ops.erase_cli import run_erase, run_keys

            return asyncio.run(run_erase(settings, args) if args.command == "erase" else run_keys(settings, args))
    return 0


def keygen(args: argparse.Namespace) -> int:
    if args.operator and args.read_only:
        print("chronicle keygen: --read-only is for a tenant's key (--tenant T)", file=sys.stderr)
        return 2
    if args.operator:
        print(f"CHRONICLE_NATS_NKEY_SEED={new_operator_seed()}")
        return 0
    try:
        check_tenant(args.tenant)
    except InvalidId as exc:  # one line, as the CLI's other errors (it was a traceback)
        print(f"chronicle keygen: --tenant {args.tenant[:80]!r}: {exc}", file=sys.stderr)
        return SETTINGS_EXIT
    key = new_api_key()
    entry = api_key_entry(args.tenant, key, read_only=args.read_only)
    if args.read_only:
        print(f"API key (read-only: no writes, no data keys, no NATS identity): {key}")
    else:
        print(
            f"API key: {key}\n"
            f"NATS seed (derived from the key; for clients other than chronicle_sdk): {tenant_nkey_seed(key)}"
        )
    print(keygen_entry_lines(entry))
    return 0


def keygen_entry_lines(entry: str) -> str:
    """How ``chronicle keygen`` shows a key's ``api_keys`` entry: the bare entry, to be added to
    the list in force (an assignment pasted for a second key would replace the first's), then a
    whole assignment for a first key only."""
    return (
        f"CHRONICLE_API_KEYS entry (add it to the existing list, keeping the entries there): {entry}\n"
        f"a first key only (no CHRONICLE_API_KEYS set yet): CHRONICLE_API_KEYS='[\"{entry}\"]'"
    )


def nats_config(settings: Settings, args: argparse.Namespace) -> int:
    try:
        access = NatsAccess.of(settings)
    except MissingOperator as exc:
        print(f"chronicle nats-config: {exc}", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.cluster_nodes.split(",") if n.strip()]
    if names:
        return nats_cluster_config(settings, access, args, names)
    config = server_config(
        access,
        host=args.host or NATS_CONFIG_HOST,
        port=args.port,
        store_dir=args.store_dir,
        sync_interval=settings.nats_sync_interval,
    )
    if args.out is None:
        print(json.dumps(config, indent=2))
    else:
        write_config(args.out, config)
        print(f"wrote {args.out} ({len(access.users())} users)")
    return 0


def nats_cluster_config(settings: Settings, access: NatsAccess, args: argparse.Namespace, names: list[str]) -> int:
    """One configuration per node of a cluster, ``<out>/<name>.conf``: routes to the other nodes
    by host name on ``--cluster-port``, authenticated with the route password."""
    if settings.nats_route_password is None or args.out is None:
        print("chronicle nats-config: a cluster needs CHRONICLE_NATS_ROUTE_PASSWORD and --out DIR", file=sys.stderr)
        return 2
    nodes = [ClusterNode(name, name, args.cluster_port) for name in names]
    password = settings.nats_route_password.get_secret_value()
    for node in nodes:
        extra = cluster_extra(node, nodes, password, listen=args.host)
        host = args.host or NATS_CONFIG_HOST
        config = server_config(
            access,
            host=host,
            port=args.port,
            store_dir=args.store_dir,
            sync_interval=settings.nats_sync_interval,
            extra=extra,
        )
        write_config(args.out / f"{node.name}.conf", config)
    print(f"wrote {len(nodes)} node configurations in {args.out} ({len(access.users())} users)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
