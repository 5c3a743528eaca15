"""The audit commands of the CLI: replay, history (time travel), rebuild, verify."""

from __future__ import annotations

import argparse
import asyncio
import sys
from contextlib import aclosing
from pathlib import Path

from events.sealing import KeyDestroyed
from events.stream import PartitionMismatch, ReplicasUnavailable, TooFewReplicas
from projections import queries
from services.audit import archive, archive_accept, restore
from services.audit import readers as audit
from services.audit.archive import ArchiveBusy
from services.audit.archive_segments import ArchiveError, lost_line, parse_anchor, span
from services.audit.restore import RestoreRefused, RestoreStopped
from services.audit.strays import merged, strays
from services.bootstrap import Container, open_container
from services.context.rules import object_key
from services.errors import AsOfPastLog, ChronicleError, ObjectStorageError
from services.ops.audit_text import rebuild_summary, verify_table
from services.ops.progress import Progress
from services.settings import Settings
from services.storage.s3 import BucketMissing
from services.terminal import clipped, safe_json, safe_json_text


def storage_unusable(settings: Settings, exc: Exception) -> str:
    """A tool's line for object storage that did not answer: the setting that names it, and why."""
    return f"object storage at CHRONICLE_S3_ENDPOINT ({settings.s3_endpoint}) cannot be used: {exc}"


ARCHIVE_CANNOT_RUN = (ObjectStorageError, ArchiveBusy, ArchiveError, ChronicleError, TimeoutError)
"""What stops an archive command before it could decide anything: exit 2, not a finding."""


def cannot_run(settings: Settings, exc: Exception) -> int:
    """Exit status 2 for an archive command that could not run, saying why in one line (object
    storage's failure named as :func:`storage_unusable` names it)."""
    why = storage_unusable(settings, exc) if isinstance(exc, ObjectStorageError) else str(exc)
    print(f"chronicle archive: {why}", file=sys.stderr)
    return 2


async def run_archive(settings: Settings, args: argparse.Namespace) -> int:
    """``chronicle archive`` (0: archived, or the check found nothing wrong; 1: the check found
    problems, or a run found a segment missing that the stream no longer holds; 2: it could not
    run: another run holds the lock, the bucket holds another stream's archive, object storage or
    the stream did not answer)."""
    if args.drill and not args.restore:
        print("chronicle archive: --drill goes with --restore", file=sys.stderr)
        return 2
    anchor = None
    if args.anchor is not None:
        anchor = parse_anchor(args.anchor)
        if not args.check or anchor is None:
            print(
                "chronicle archive: --anchor goes with --check and takes SEQ:DIGEST, as `--check` prints it "
                "(a sequence, then the 64 hexadecimal digits of the digest)",
                file=sys.stderr,
            )
            return 2
    if args.accept_lost is not None:
        return await _run_accept_lost(settings, args.accept_lost, args.to_seq)
    if args.reclaim:
        if args.to_seq is not None:
            print("chronicle archive: --reclaim takes no --to-seq", file=sys.stderr)
            return 2
        return await _run_reclaim(settings)
    if args.restore:
        if args.to_seq is not None:
            print("chronicle archive: --restore restores the whole archive (no --to-seq)", file=sys.stderr)
            return 2
        return await _run_restore(settings, drill=args.drill)
    # the log alone: no read model is read, and the stream is never created (it is the source)
    async with open_container(settings, log_check=False, create_stream=False) as c:
        try:
            if args.check:
                checked = await archive.check(c)
                if anchor is not None:
                    checked.problems.extend(anchor_problems(checked, *anchor))
                for note in checked.notes:
                    print(f"note: {note}")
                for problem in checked.problems:
                    print(f"problem: {problem}")
                print(
                    f"checked {checked.segments} segments, {checked.events} events; {checked.compared} equal to the "
                    f"stream's; {len(checked.problems)} problems"
                )
                if checked.reach is not None:
                    print(checked.reach)
                if checked.digests:
                    through = max(checked.digests)
                    print(f"digest through sequence {through}: {through}:{checked.digests[through]}")
                return 0 if checked.ok else 1
            done = await archive.archive(c, segment_events=args.segment_events, to_seq=args.to_seq)
        except ARCHIVE_CANNOT_RUN as exc:  # could not run: not a finding
            return cannot_run(settings, exc)
        for segment in done.adopted:
            said = span(segment.first, segment.last)
            print(f"listed again segment {segment.key} ({said}): its events are the stream's")
        for key, why in done.kept:
            print(f"kept segment object {key}, which the manifest does not list: {why}")
        for segment in done.repaired:
            print(f"wrote again missing segment {segment.key} ({span(segment.first, segment.last)}) from the stream")
        if done.nothing:
            print(
                f"nothing to archive: stream {settings.stream!r} has never held an event; no archive made in bucket "
                f"{settings.archive_bucket!r}"
            )
        else:
            print(
                f"archived {done.events} events in {done.segments} segments to bucket {settings.archive_bucket!r}; "
                f"the archive now ends at sequence {done.last_seq}"
            )
        if done.lost or done.lost_holes:
            print(f"chronicle archive: {lost_line(done.lost, done.stream_first, done.lost_holes)}", file=sys.stderr)
            return 1
        return 0


async def _run_accept_lost(settings: Settings, given: str, to_seq: int | None) -> int:
    """``chronicle archive --accept-lost FIRST-LAST`` (0: accepted, or already; 2: refused, nothing
    changed, or it could not run)."""
    first, sep, last = given.partition("-")
    if to_seq is not None or not (first.isdigit() and (not sep or last.isdigit())):
        print("chronicle archive: --accept-lost takes FIRST-LAST (or one sequence), and no --to-seq", file=sys.stderr)
        return 2
    low, high = int(first), int(last if sep else first)
    if not 1 <= low <= high:
        print(f"chronicle archive: --accept-lost {given}: not a range of sequences from 1", file=sys.stderr)
        return 2
    async with open_container(settings, log_check=False, create_stream=False) as c:
        try:
            loss = await archive_accept.accept_lost(c, low, high)
        except ARCHIVE_CANNOT_RUN as exc:
            return cannot_run(settings, exc)
    if loss is None:
        print(f"{span(low, high)}: already accepted as lost; nothing changed")
    else:
        print(
            f"{span(low, high)}: accepted as lost (recorded in the manifest); runs no longer fail on them and "
            "`chronicle archive --check` says them as a note"
        )
    return 0


DIFFERENCE_CHARS = 1_000  # of each row `verify` prints: enough to tell it, never a whole body
STREAM_REFUSALS = (PartitionMismatch, ReplicasUnavailable, TooFewReplicas)
"""What the stream's creation (or the empty stream found) may refuse: said in one line."""


async def _run_reclaim(settings: Settings) -> int:
    """``chronicle archive --reclaim`` (0: the archive is this stream's again; 2: refused, nothing
    changed, or it could not run)."""
    async with open_container(settings, log_check=False, create_stream=False) as c:
        try:
            taken = await restore.reclaim(c)
        except ARCHIVE_CANNOT_RUN as exc:
            return cannot_run(settings, exc)
    print(
        f"the archive in bucket {settings.archive_bucket!r} is this stream's again (created "
        f"{taken.restored_from.isoformat()}); the restoration of {taken.restored_at.isoformat()} into the stream "
        f"created {taken.stream_created.isoformat()} is dropped from its manifest, and that stream is no longer "
        "archived there. Run `chronicle archive --check`, then `chronicle archive` as before"
    )
    return 0


async def _run_restore(settings: Settings, *, drill: bool = False) -> int:
    """``chronicle archive --restore`` (0: restored whole; 2: refused, nothing published, or it could
    not run; 1: not whole: it stopped partway, the stream holding part of the archive, or every
    event was restored but objects they reference are missing, one line per store on stderr, each
    ``restored, but not whole``: the stream is kept; a stop is ``restore stopped at``: delete it).
    ``drill``: the archive's manifest is left as it is."""
    # a missing stream is what a restore is for: it creates it (as the services do) once it has
    # found the archive whole, so a refusal leaves the NATS server as it was
    async with open_container(settings, log_check=False, create_stream=False, absent_stream=True) as c:
        bar = Progress("restore")
        try:
            done = await restore.restore(c, progress=bar, drill=drill)
        except RestoreStopped as exc:
            bar.close()
            print(f"chronicle archive: {exc}", file=sys.stderr)
            return 1
        except (*ARCHIVE_CANNOT_RUN, RestoreRefused, *STREAM_REFUSALS) as exc:
            bar.close()
            return cannot_run(settings, exc)
        bar.close()
        print(
            f"restored {done.events} events from {done.segments} segments of bucket {settings.archive_bucket!r} into "
            f"stream {settings.stream!r} (created {done.stream_created.isoformat()}), sequences 1..{done.last_seq}; "
            + (
                f"a drill: the archive is left as it was, the archive of the stream created "
                f"{done.restored_from.isoformat()} (this stream is not archived into bucket "
                f"{settings.archive_bucket!r}: give it another CHRONICLE_ARCHIVE_BUCKET)"
                if done.drill
                else f"the archive continues on it (it was the archive of the stream created "
                f"{done.restored_from.isoformat()})"
            )
        )
        print(
            "stored times: the restored events carry the restore's time; the archive keeps the original ones"
            + ("" if done.drill else " (`chronicle archive --check` compares the restored sequences without them)")
        )
        for line in done.advice:
            print(line)
        for missing in done.missing:
            print(f"chronicle archive: restored, but not whole: {missing.line()}", file=sys.stderr)
        return 1 if done.missing else 0


async def _history_gone(c: Container, tenant: str, session: str) -> str | None:
    """Why a session has no history to show at all (erased, or never in the log), as one line;
    None when it has one (possibly empty as of a sequence). Never an empty success for those."""
    async with c.pool.connection() as conn:
        erased = await queries.erased_at(conn, tenant, session)
    if erased is not None:
        return (
            f"session {session!r} of tenant {tenant!r} was erased at {erased.isoformat()}: no history, now or as "
            "of any sequence (`chronicle replay` shows its events as tombstones)"
        )
    if await c.publisher.last_subject_seq(tenant, session) == 0:
        return f"no event of session {session!r} of tenant {tenant!r} in the log: no history"
    return None


def _no_leaf(args: argparse.Namespace, when: str) -> str:
    """The refusal of a ``--leaf-id`` the session does not hold (never an empty success)."""
    return (
        f"chronicle history: no message {args.leaf_id!r} in session {args.session!r} of tenant {args.tenant!r}"
        f"{when}: no path to show"
    )


async def run_audit(settings: Settings, args: argparse.Namespace) -> int:
    # the log's tools read the stream itself; a rebuild repairs a database bound to another log.
    # None of them writes to the log: a missing stream is an error, never created (a rebuild from
    # a new, empty stream would replace the read models with nothing)
    if args.command == "history" and args.as_of_seq is None and settings.kek is None and not settings.kek_file:
        # the history of now is the read models' plaintext: no key-encryption key needed, on a
        # sealing stack too (nothing is opened, and nothing written with this container)
        settings = settings.model_copy(update={"encryption": False})
    async with open_container(settings, log_check=args.command == "history", create_stream=False) as c:
        match args.command:
            case "replay":
                bar = Progress("replay")
                end = await c.publisher.last_subject_seq(args.tenant, args.session)
                # its events quarantined after arriving on another subject (a wrong partition token)
                others = await strays(c, args.tenant, args.session, args.from_seq, args.to_seq)
                end = max(end, others[-1].seq if others else 0)
                if end == 0:  # as `chronicle erase` of such a session: not found, never an empty success
                    print(
                        f"chronicle replay: no event of session {args.session!r} of tenant {args.tenant!r} in the "
                        "log: nothing to replay",
                        file=sys.stderr,
                    )
                    return 1
                if args.to_seq is not None:
                    end = min(end, args.to_seq)
                # both closed here, while the connection is open (a reader that closes the pipe
                # ends the loop with an error: left to the collector, the stream's subscription
                # would be closed after the connection, a traceback on the way out)
                async with (
                    aclosing(audit.session_events(c, args.tenant, args.session, args.from_seq, args.to_seq)) as own,
                    aclosing(merged(own, others)) as events,
                ):
                    async for stored in events:
                        if args.format == "jsonl":
                            sys.stdout.write(safe_json(audit.replay_record(stored, c.layout, c.keys)) + "\n")
                        else:
                            sys.stdout.write(audit.format_table_row(stored, c.layout, c.keys) + "\n")
                        bar(stored.seq, end)
                bar.close()
            case "history":
                if (gone := await _history_gone(c, args.tenant, args.session)) is not None:
                    print(f"chronicle history: {gone}", file=sys.stderr)
                    return 1
                if args.as_of_seq is not None:
                    try:
                        state = await audit.session_as_of(c, args.tenant, args.session, args.as_of_seq)
                    except AsOfPastLog as exc:  # as `as_of_seq` over HTTP (422)
                        print(
                            f"chronicle history: --as-of-seq {exc.seq} is past the log's last sequence ({exc.last}): "
                            "no history as of it yet",
                            file=sys.stderr,
                        )
                        return 2
                    leaf = args.leaf_id or state.latest_leaf()
                    path = state.path(leaf)
                    if args.leaf_id is not None and not path:
                        print(_no_leaf(args, f" as of sequence {args.as_of_seq}"), file=sys.stderr)
                        return 1
                    for content in path:
                        sys.stdout.write(safe_json_text(content) + "\n")
                else:
                    async with c.pool.connection() as conn:
                        listed = await queries.get_session(conn, args.tenant, args.session)
                    if listed is not None and listed.deleted_at is not None:  # its rows are gone, its log is not
                        print(
                            f"chronicle history: session {args.session!r} of tenant {args.tenant!r} was deleted at "
                            f"{listed.deleted_at.isoformat()}: no history now; `--as-of-seq N`, N a sequence before "
                            "its deletion, shows it as it was then (`chronicle replay` shows its events)",
                            file=sys.stderr,
                        )
                        return 1
                    async with c.pool.connection() as conn:
                        leaf = args.leaf_id
                        if leaf is None:
                            row = await queries.latest_leaf(conn, args.tenant, args.session)
                            leaf = row.id if row else None
                        rows = await queries.history(conn, args.tenant, args.session, leaf) if leaf else []
                    if args.leaf_id is not None and not rows:
                        print(_no_leaf(args, ""), file=sys.stderr)
                        return 1
                    for r in rows:
                        sys.stdout.write(safe_json_text(r.content) + "\n")
            case "rebuild":
                bar = Progress("rebuild")
                report = await audit.rebuild_and_swap(c, args.projection, keep_old=args.keep_old, progress=bar)
                bar.close()
                print(rebuild_summary(args.projection, report))
                if report.first:
                    print(
                        f"the database held no read models: built, bound to stream {settings.stream}, and the "
                        f"checkpoints of {settings.projector_name} start at sequence {report.swapped_at_seq}"
                    )
                if report.rebound:
                    print(
                        "the read models belonged to another log: replaced, and the checkpoints of "
                        f"{settings.projector_name} start at sequence {report.swapped_at_seq} "
                        f"of stream {settings.stream}"
                    )
            case "verify":
                bar = Progress("verify")
                result = await audit.verify(c, limit=args.limit, progress=bar)
                bar.close()
                for line in verify_table(result):
                    print(line)
                for table, diffs in result.differences.items():
                    print(f"first differences in {table}:")
                    for line in diffs:
                        print("  " + clipped(line, DIFFERENCE_CHARS))  # rows of read models: tenants' text
                print(f"verified at sequence {result.at_seq}: " + ("identical" if result.ok else "DIFFERENT"))
                return 0 if result.ok else 1
    return 0


async def run_skills(settings: Settings, args: argparse.Namespace) -> int:
    """``skills put`` uploads and records; ``skills sync`` records what changed in the bucket.
    Neither creates the stream: on a NATS server without it, one that is not the stack's, the
    read models' log is missing (:class:`projections.logbinding.LogAbsent`) or the stream is
    (:class:`events.stream.StreamMissing`, a database that has never seen a log), and nothing is
    made there; the services create it when the stack starts."""
    async with open_container(settings, create_stream=False) as c:
        said = f"chronicle skills {args.skills_command}:"
        if args.bucket in c.context.reserved_buckets:  # as a session config's skills block is refused
            print(f"{said} bucket {args.bucket!r} is reserved for Chronicle's own data", file=sys.stderr)
            return 2
        # as a session config's skills block, neither makes a bucket (its owner does, with its policy)
        # unless told: `put --create-bucket`, after every other check
        if args.skills_command == "put":
            try:
                content = await asyncio.to_thread(Path(args.file).read_text, encoding="utf-8")
            except UnicodeDecodeError as exc:
                print(f"{said} {args.file} is not UTF-8 text (byte {exc.start})", file=sys.stderr)
                return 2
            except OSError as exc:  # no such file, a directory, not readable
                print(f"{said} {args.file}: {exc.strerror or exc}", file=sys.stderr)
                return 2
            try:
                seq = await c.context.put_skill(
                    args.tenant,
                    args.bucket,
                    args.key,
                    content,
                    args.description,
                    bucket_made=(lambda bucket: print(f"made bucket {bucket}")) if args.create_bucket else None,
                )
            except KeyDestroyed:  # refused before anything is uploaded (ContextService.put_skill)
                print(f"{said} tenant {args.tenant!r} is erased: it takes no skill documents", file=sys.stderr)
                return 2
            except BucketMissing as exc:  # the put refused: nothing uploaded, recorded or made
                print(f"{said} {exc}, or pass --create-bucket", file=sys.stderr)
                return 2
            stored = f"{args.bucket}/{object_key(args.tenant, args.key)}"  # the tenant's key space, as stored
            print(f"stored {stored} ({len(content.encode())} bytes); recorded at sequence {seq}")
            return 0
        if c.context.skills is not None and not await c.context.skills.bucket_exists(args.bucket):
            print(f"{said} bucket {args.bucket!r} does not exist: nothing to index", file=sys.stderr)
            return 2
        try:
            report = await audit.sync_skills(c, args.tenant, args.bucket, args.prefix)
        except KeyDestroyed:  # its tenant scope's key is destroyed: no skill.indexed can be sealed
            print(f"{said} tenant {args.tenant!r} is erased: it takes no skill documents", file=sys.stderr)
            return 2
        print(f"indexed {report.indexed}, removed {report.removed}, unchanged {report.unchanged}")
    return 0


def anchor_problems(checked: archive.Checked, seq: int, digest: str) -> list[str]:
    """What an anchor (a digest through ``seq`` an auditor kept) says of the archive now: nothing
    when the archive through ``seq`` is what it was."""
    if seq not in checked.digests:
        ends = sorted(checked.digests)
        return [
            f"anchor {seq}: no segment that could be read ends at sequence {seq}"
            + (
                f" (the readable ones end at {', '.join(map(str, ends[-5:]))}{', …' if len(ends) > 5 else ''})"
                if ends
                else ""
            )
            + ": the archive through it cannot be proved what it was"
        ]
    if checked.digests[seq] != digest:
        return [
            f"anchor {seq}: the archive through sequence {seq} is not what it was when the anchor was taken "
            f"(its digest is {checked.digests[seq]}): a segment was rewritten, added, dropped or reordered"
        ]
    return []
