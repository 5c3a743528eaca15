"""``chronicle archive --restore``: the event log made again from its archive (services/audit/
archive.py), into a stream that does not exist or is empty.

The stream is created as the services create it (events/stream.py's ``ensure_stream``) once the
archive is found whole; then every archived event is published again in sequence order with its
subject, its stored headers
(``Nats-Msg-Id`` and the expectation it was published with, which hold again since the history
before it is the same) and its bytes; each ack must name the archived sequence. The archive is
checked whole first (contiguous from sequence 1, each segment as its manifest says): an archive
with a gap would renumber every later event, and nothing is published from one.

The restored stream has a new creation time, so the manifest records the restoration (the stream
created at T2 holds sequences 1..N of the stream created at T1) and names the new stream: the next
``chronicle archive`` continues after N, and ``--check`` compares sequences 1..N without their
stored times (the stream stored them anew). A drill (``--restore --drill``: a restore on another
NATS server while the archived stream lives on) leaves the manifest as it is; a restore that was
not one took the archive over from a stream that lives on, which :func:`reclaim` undoes
(``--reclaim``). The read models' binding (projections/logbinding.py)
is rewritten only when it names the archived stream and no checkpoint is beyond what was restored;
otherwise the command says what to run. What the archive does not hold is looked for too: every
object the restored events reference (claim-checked bodies in the JetStream object store or in S3,
over-cap originals in S3) must be where its reference says; those missing (but an erased
session's, which its erasure deleted) are :attr:`Restored.missing`, and the command exits 1. The
referencing events are decided as the projector decides them (projections/quarantine.py's
``screen``, with this database's keys and erasures): only an erasure the projector honours (its
key destroyed or its erasure recorded, or its proof holding) makes its session's objects expected
gone, and an object only events the contract refuses name (raw events a tenant published on its
own subjects, quarantined) is said apart and never makes the restore not whole.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from events.blobs import SHA256_HEX, BlobRef, refs_in
from events.catalog import SessionErased
from events.log import StoredEvent
from events.objectstore import JetStreamBlobStore
from events.publisher import HDR_MSG_ID
from events.sealing import kid_in
from events.stream import DUPLICATE_WINDOW_S, ensure_stream
from events.subjects import SubjectLayout
from projections.logbinding import LogIdentity, bind, highest_checkpoint, read_binding, stream_identity
from projections.quarantine import Quarantined, Tombstone, screen
from services.audit.archive import another_stream, locked, read_manifest, save, store_of, taken_over, unlisted
from services.audit.archive_segments import ArchiveError, Manifest, Restoration, decode, manifest_key, span
from services.bootstrap import Container
from services.storage.blobs import CLAIM_CHECK_S3
from services.storage.s3 import SkillStore

WINDOW = 1000
"""Publishes in flight at most; their acks are checked in order before the next window."""
ACK_WAIT_S = 30.0
"""How long a window's acks are awaited (an answer, error or not, settles one at once)."""
RESTORE_DUPLICATE_WINDOW_S = 1.0
"""The stream's duplicate window while an archive holding an id twice is restored (then set back)."""
SCREEN_SLICE = 1000
"""How many referencing events have their sessions' keys loaded at once before they are screened."""


class RestoreRefused(RuntimeError):
    """Nothing was published: the stream holds events, or the archive is not whole."""


class RestoreStopped(RuntimeError):
    """Publishing stopped partway: the stream holds part of the archive (said in the message)."""


@dataclass(frozen=True, slots=True)
class Restored:
    """What a restore published, the stream it made, and what it said about the rest."""

    events: int
    segments: int
    last_seq: int
    stream_created: datetime
    restored_from: datetime
    advice: list[str]
    drill: bool = False
    """The manifest was left as it was: the archive stays the archived stream's."""
    missing: tuple[MissingObjects, ...] = ()
    """Objects the restored events reference that are not where their references say (an erased
    session's apart): one entry per store; empty when the restore is whole."""


NAMED = 3
"""How many of a store's missing objects a report names."""


@dataclass(frozen=True, slots=True)
class MissingObjects:
    """One store's objects that restored events reference and that are not there."""

    what: str
    """The objects and where they are looked for (``claim-checked bodies in S3 bucket 'b'``)."""
    referenced: int
    """How many the restored events reference (an erased session's, expected gone, apart)."""
    missing: tuple[tuple[str, int], ...]
    """(key, sequence of the first restored event referencing it) of each one missing."""
    why: str = ""
    """Set when the store could not be asked at all (then every reference counts as missing)."""

    def line(self) -> str:
        named = ", ".join(f"{key} (sequence {seq})" for key, seq in self.missing[:NAMED])
        more = f" and {len(self.missing) - NAMED} more" if len(self.missing) > NAMED else ""
        cause = f" (it could not be asked: {self.why})" if self.why else ""
        return f"{len(self.missing)} of {self.referenced} {self.what} are missing{cause}: {named}{more}"


async def restore(
    c: Container,
    *,
    window: int = WINDOW,
    progress: Callable[[int, int], None] | None = None,
    drill: bool = False,
) -> Restored:
    """Restore the archive of ``c.layout.stream`` into that stream (which ``c`` found or created
    empty): :class:`RestoreRefused` before anything is published, :class:`RestoreStopped` after.
    ``drill``: the manifest is left as it is (a restore drill, or a copy for an auditor, on another
    NATS server while the archived stream lives on and goes on archiving): the archive stays the
    archived stream's, and the restored stream is not archived into that bucket."""
    store, bucket, stream = store_of(c), c.settings.archive_bucket, c.layout.stream
    async with locked(c, stream):
        manifest = await read_manifest(store, bucket, stream)
        if manifest is None:
            raise RestoreRefused(f"bucket {bucket!r} holds no archive of stream {stream!r}")
        try:
            held = await stream_identity(c.js, stream)
        except NotFoundError:
            held = None
        if held is not None and held.last_seq > 0:
            raise RestoreRefused(
                f"stream {stream!r} is not empty (last sequence {held.last_seq}): a restore only fills a stream "
                "that does not exist or holds nothing"
            )
        if manifest.last_seq == 0:
            raise RestoreRefused(f"the archive of stream {stream!r} holds no events")
        ids: Counter[str] = Counter()
        subjects: set[str] = set()
        problems = await whole(store, bucket, manifest, ids, subjects)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise RestoreRefused(f"the archive is not whole, nothing was restored: {problems[0]}{more}")
        misfit = partitions_misfit(subjects, c.layout)
        if misfit is not None:
            raise RestoreRefused(misfit)
        # an id the log stored twice (published again past the duplicate window, by a client or a
        # tenant): republished seconds apart, the stream would take the second for a duplicate
        repeats = {i for i, n in ids.items() if n > 1 and i}
        await ensure_stream(c.js, c.layout, replicas=c.settings.stream_replicas)  # as the services make it
        if repeats:
            await _duplicate_window(c, RESTORE_DUPLICATE_WINDOW_S)
        try:
            return await _published(c, store, bucket, manifest, repeats, window, progress, drill)
        except (RestoreRefused, RestoreStopped):
            raise
        except Exception as exc:  # a flush that timed out, the stream gone: part may be stored
            reached = await _held(c)
            raise RestoreStopped(_stopped(reached + 1, f"it failed ({exc!r})", reached)) from exc
        finally:
            if repeats:
                await _duplicate_window(c, DUPLICATE_WINDOW_S)


async def _duplicate_window(c: Container, seconds: float) -> None:
    config = (await c.js.stream_info(c.layout.stream)).config
    config.duplicate_window = seconds
    await c.js.update_stream(config)


async def _held(c: Container) -> int:
    """The restored stream's last sequence (0 when it cannot be asked)."""
    try:
        return (await stream_identity(c.js, c.layout.stream)).last_seq
    except Exception:  # reported with the failure that led here
        return 0


async def _published(
    c: Container,
    store: SkillStore,
    bucket: str,
    manifest: Manifest,
    repeats: set[str],
    window: int,
    progress: Callable[[int, int], None] | None,
    drill: bool,
) -> Restored:
    stream = c.layout.stream
    before = await stream_identity(c.js, stream)
    if before.last_seq > 0:  # written to since it was looked at
        raise RestoreRefused(f"stream {stream!r} is not empty (last sequence {before.last_seq})")
    if before.created is None:
        raise RestoreRefused(f"stream {stream!r} has no creation time: the archive could not be bound to it")
    done = 0
    sent: dict[str, float] = {}  # a repeated id: when its last copy was acknowledged
    screened: list[StoredEvent] = []  # the events naming an object, and the erasures: screened once all is restored
    for segment in manifest.segments:
        data = await store.get_bytes(bucket, segment.key)
        if data is None:  # gone since the check: said as the check says it
            raise RestoreStopped(_stopped(segment.first, f"segment {segment.key} is missing", done))
        try:
            events = decode(data, segment)
        except ArchiveError as exc:
            raise RestoreStopped(_stopped(segment.first, str(exc), done)) from None
        screened.extend(e for e in events if _erasure(e) or refs_in(e.data))
        for run in _runs(events, repeats, window):
            again = [sent[_msg_id(e)] for e in run if _msg_id(e) in sent]
            if again:  # the id's first copy must have left the (small) duplicate window
                await asyncio.sleep(max(0.0, max(again) + RESTORE_DUPLICATE_WINDOW_S + 0.5 - time.monotonic()))
            done = await _publish(c, run, done)
            sent.update((_msg_id(e), time.monotonic()) for e in run if _msg_id(e) in repeats)
            if progress is not None:
                progress(done, manifest.last_seq)
    after = await stream_identity(c.js, stream)
    if after.last_seq != manifest.last_seq or after.created != before.created:
        raise RestoreStopped(
            f"restored up to sequence {manifest.last_seq}, but stream {stream!r} now ends at {after.last_seq}"
            + ("" if after.created == before.created else " and was made again meanwhile")
            + ": something else wrote to it during the restore; delete it and restore again"
        )
    original = manifest.stream_created
    if not drill:
        await _record(store, bucket, manifest, before.created)
    advice = [await _rebind(c, after, original)]
    refs, refused, expected = await _referenced(c, screened, advice)
    missing: list[MissingObjects] = []
    for kind, what in _stores(c).items():
        found = await _objects(c, kind, what, [v for (k, _), v in refs.items() if k == kind], expected)
        advice.append(found[0])
        if found[1] is not None:
            missing.append(found[1])
    foreign = [v for (k, _), v in refs.items() if k not in _stores(c)]
    if foreign:
        kinds = ", ".join(sorted({r.store for r, _ in foreign}))
        missing.append(MissingObjects(f"objects of stores not configured here ({kinds})", len(foreign), _keys(foreign)))
    if refused:
        advice.append(await _refused(c, list(refused.values())))
    return Restored(
        done, len(manifest.segments), after.last_seq, before.created, original, advice, drill, tuple(missing)
    )


async def whole(
    store: SkillStore,
    bucket: str,
    manifest: Manifest,
    ids: Counter[str] | None = None,
    subjects: set[str] | None = None,
) -> list[str]:
    """What keeps the archive from being restored as it is, without the stream: segments not
    contiguous from sequence 1, one missing or not what its manifest entry says, an object beside
    them that the manifest does not list (what ``chronicle archive --check`` says of them too).
    ``ids`` counts the events' ``Nats-Msg-Id`` as they are read, ``subjects`` collects their subjects."""
    problems = [f"segment object {key} is not in the manifest" for key in await unlisted(store, bucket, manifest)]
    after = 0
    for segment in manifest.segments:
        if segment.first != after + 1:
            problems.append(
                f"segment {segment.key} starts at {segment.first}, after {after}: sequences {after + 1}.."
                f"{segment.first - 1} are not archived, and every later event would be restored under another sequence"
            )
        after = segment.last
        data = await store.get_bytes(bucket, segment.key)
        if data is None:
            problems.append(f"segment {segment.key} is missing")
            continue
        try:
            events = decode(data, segment)
        except ArchiveError as exc:
            problems.append(str(exc))
            continue
        if ids is not None:
            ids.update(_msg_id(e) for e in events)
        if subjects is not None:
            subjects.update(e.subject for e in events)
    return problems


PARTITION_GUESSES = 1024
"""The partition counts :func:`partitions_misfit` tries when the configured one does not fit."""
GUESS_SAMPLE = 200
"""How many of the archive's session subjects a guess is tried on."""


def partitions_misfit(subjects: set[str], layout: SubjectLayout) -> str | None:
    """Why the archive's events do not belong under ``layout``'s partition count, or None when
    they do. A session subject's partition token is derived from its ids and the count the log
    was written with; restored under another count, the projector would refuse every event filed
    elsewhere (``subject_mismatch``) and new events would go to other subjects than the old ones.
    A subject a tenant filed wrongly itself is possible, so the count misfits when more than half
    of the session subjects are misplaced; the smallest count (up to :data:`PARTITION_GUESSES`)
    that places a sample of them all is named when there is one."""
    sessions = sorted(s for s in subjects if layout.placed(s) is not None)
    wrong = [s for s in sessions if not layout.placed(s)]
    if not wrong or len(wrong) * 2 <= len(sessions):
        return None
    sample = sessions[:: max(1, len(sessions) // GUESS_SAMPLE)][:GUESS_SAMPLE]
    fits = next(
        (n for n in range(1, PARTITION_GUESSES + 1) if all(replace(layout, partitions=n).placed(s) for s in sample)),
        None,
    )
    hint = f" ({fits} partitions place them all)" if fits is not None else ""
    return (
        f"{len(wrong)} of the archive's {len(sessions)} session subjects are not where CHRONICLE_PARTITIONS="
        f"{layout.partitions} puts them (such as {wrong[0]!r}): the log was written with another partition "
        f"count{hint}; set CHRONICLE_PARTITIONS to the log's and restore again (nothing was restored)"
    )


def _msg_id(event: StoredEvent) -> str:
    return (event.headers or {}).get(HDR_MSG_ID, "")


async def _publish(c: Container, events: list[StoredEvent], done: int, *, ack_wait_s: float = ACK_WAIT_S) -> int:
    """Publish ``events`` pipelined (one connection, in order), then check each ack in order; the
    count restored after them. The acks come to an inbox of this window and are read here: nats-py's
    ``publish_async`` never settles the future of a publish the stream answers with an error."""
    loop = asyncio.get_running_loop()
    acks: dict[str, asyncio.Future[dict[str, Any]]] = {str(e.seq): loop.create_future() for e in events}
    inbox = c.nc.new_inbox()

    async def answered(msg: Msg) -> None:
        future = acks.get(msg.subject.rsplit(".", 1)[-1])
        if future is not None and not future.done():
            try:
                future.set_result(json.loads(msg.data) if msg.data else {})
            except ValueError:
                future.set_result({"error": {"description": f"an answer that is not JSON: {msg.data[:80]!r}"}})

    sub = await c.nc.subscribe(f"{inbox}.*", cb=answered)
    try:
        for e in events:
            try:
                await c.nc.publish(e.subject, e.data, reply=f"{inbox}.{e.seq}", headers=e.headers)
            except NatsError as exc:  # a payload over the server's limit, the connection gone
                raise RestoreStopped(_stopped(e.seq, f"it could not be published ({exc!r})", done)) from None
        await c.nc.flush()
        await asyncio.wait(acks.values(), timeout=ack_wait_s)
    finally:
        await sub.unsubscribe()
    for event in events:
        future = acks[str(event.seq)]
        why = _wrong(c, event, future.result() if future.done() else None, ack_wait_s)
        if why is not None:
            raise RestoreStopped(_stopped(event.seq, why, done))
        done += 1
    return done


def _runs(events: list[StoredEvent], repeats: set[str], window: int) -> list[list[StoredEvent]]:
    """``events`` in runs of at most ``window``, a new run at each id repeated within the run
    (its copies are published a duplicate window apart)."""
    runs: list[list[StoredEvent]] = [[]]
    ids: set[str] = set()
    for e in events:
        i = _msg_id(e)
        if len(runs[-1]) >= window or (i in repeats and i in ids):
            runs.append([])
            ids = set()
        runs[-1].append(e)
        ids.add(i)
    return [r for r in runs if r]


def _wrong(c: Container, event: StoredEvent, ack: dict[str, Any] | None, waited_s: float) -> str | None:
    """What is wrong with the stream's answer to ``event``'s publish (None: stored as archived)."""
    if ack is None:
        return f"no answer from the stream within {waited_s:g}s"
    if "error" in ack:
        error = ack["error"] if isinstance(ack["error"], dict) else {}
        return f"the stream refused it ({error.get('description', ack['error'])}, error {error.get('err_code')})"
    if ack.get("stream") != c.layout.stream:
        return f"stream {ack.get('stream')!r} stored it, not {c.layout.stream!r}"
    if ack.get("duplicate"):
        return (
            f"the stream took it for a duplicate of sequence {ack.get('seq')} (the same Nats-Msg-Id inside its "
            "duplicate window)"
        )
    if ack.get("seq") != event.seq:
        return f"the stream stored it as sequence {ack.get('seq')}"
    return None


def _stopped(seq: int, why: str, done: int) -> str:
    held = f"sequences 1..{done}" if done else "nothing"
    return (
        f"restore stopped at archived sequence {seq}: {why}. The stream holds {held} of the archive (and perhaps "
        "some of the events published with it): delete the stream before restoring again"
    )


async def _record(store: SkillStore, bucket: str, manifest: Manifest, created: datetime) -> None:
    """The manifest names the restored stream, and says which stream it restores and how far."""
    manifest.restorations.append(
        Restoration(
            stream_created=created,
            restored_from=manifest.stream_created,
            through_seq=manifest.last_seq,
            restored_at=datetime.now(UTC),
        )
    )
    manifest.stream_created = created
    await store.put_bytes(bucket, manifest_key(manifest.stream), manifest.model_dump_json(indent=1).encode())


async def reclaim(c: Container) -> Restoration:
    """Give the archive back to ``c.layout.stream`` after a restore on another NATS server took it
    over (:func:`services.audit.archive.taken_over`: the manifest names the stream that restore
    made, restored from this one's archive): the restoration is dropped from the manifest, which
    names this stream again. Refused (:class:`ArchiveError`, nothing changed) when the archive is
    this stream's already, when it was not taken from this stream, when the restored stream has
    archived events of its own into it since (they are not this stream's), and when this stream
    holds fewer events than were restored (it is not the log that was archived). The restoration
    dropped is returned."""
    store, bucket, stream = store_of(c), c.settings.archive_bucket, c.layout.stream
    async with locked(c, stream):
        manifest = await read_manifest(store, bucket, stream)
        if manifest is None:
            raise ArchiveError(f"bucket {bucket!r} holds no archive of stream {stream!r}: nothing to reclaim")
        identity = await stream_identity(c.js, stream)
        if manifest.stream_created == identity.created:
            raise ArchiveError(
                f"the archive in bucket {bucket!r} is this stream's (created {manifest.stream_created.isoformat()}): "
                "nothing to reclaim"
            )
        taken = taken_over(manifest, identity.created)
        if taken is None:
            raise ArchiveError(
                f"{another_stream(bucket, manifest, identity.created)}, and no restore made that stream from this "
                "stream's archive: nothing to reclaim (archive this stream into another CHRONICLE_ARCHIVE_BUCKET)"
            )
        if manifest.last_seq > taken.through_seq:
            raise ArchiveError(
                f"the stream restored on {taken.restored_at.isoformat()} has archived "
                f"{span(taken.through_seq + 1, manifest.last_seq)} into bucket {bucket!r} since: they are its "
                "events, not this stream's; nothing changed (archive this stream into another CHRONICLE_ARCHIVE_BUCKET)"
            )
        if identity.last_seq < taken.through_seq:
            raise ArchiveError(
                f"this stream ends at sequence {identity.last_seq}, before the {taken.through_seq} events restored "
                "from its archive: it is not the log that was archived; nothing changed"
            )
        manifest.restorations.pop()
        manifest.stream_created = taken.restored_from
        await save(store, bucket, manifest)
        return taken


async def _rebind(c: Container, identity: LogIdentity, original: datetime) -> str:
    """Rebind the read models to the restored stream when they were made from the archived one
    (same name and creation time) and hold nothing beyond what was restored; else say what to do."""
    name, stream = c.settings.projector_name, identity.stream
    async with c.pool.connection() as conn, conn.transaction():
        bound = await read_binding(conn, name, lock=True)
        furthest = await highest_checkpoint(conn, name)
        if bound is None:
            return (
                f"read models: projector {name!r} is bound to no log in this database; to build them from the restored "
                "log run `chronicle rebuild` (a database restored from its own backup keeps the data keys and "
                "erasure records the log needs: restore that first)"
            )
        if bound.stream != stream or bound.created != original:
            return (
                f"read models: not rebound: projector {name!r} is bound to stream {bound.stream!r} created "
                f"{bound.created.isoformat() if bound.created else '(not reported)'}, not to the archived stream "
                f"created {original.isoformat()}; if they belong to this log all the same, run "
                "`chronicle log rebind --yes`, else `chronicle rebuild`"
            )
        if furthest is not None and furthest[1] > identity.last_seq:
            return (
                f"read models: not rebound: checkpoint {furthest[0]!r} is at sequence {furthest[1]}, beyond the last "
                f"restored sequence {identity.last_seq}: the read models hold events the archive lost (archived "
                "too seldom). `chronicle rebuild` makes them match the restored log, without those events"
            )
        await bind(conn, name, identity)
        return (
            f"read models: rebound projector {name!r} to the restored stream (it was bound to the archived one); "
            "run `chronicle verify` to compare them with the log"
        )


Objects = dict[tuple[str, str], tuple[BlobRef, StoredEvent]]
"""Objects referenced, by store and key: each one's reference and the first event naming it."""


async def _referenced(
    c: Container, events: list[StoredEvent], advice: list[str]
) -> tuple[Objects, Objects, set[tuple[str, str]]]:
    """The objects ``events`` reference, split as the projector decides the events naming them
    (:func:`projections.quarantine.screen`, with this database's keys and erasures, in log order):
    those an admitted event of a session not erased names (they must be there), those only events
    the contract refuses name (a tenant's own raw events, quarantined: said apart), and (store,
    key) of those expected gone (every other event naming them is an erased session's, erased by a
    ``session.erased`` the projector honours, or a tombstone). When the events cannot be screened
    (the keys not readable), every reference counts and ``advice`` says why."""
    decided: dict[int, str] = {}
    erased: set[str] = set()  # the subjects of erased sessions: their erasure deleted their objects
    try:
        for start in range(0, len(events), SCREEN_SLICE):
            chunk = events[start : start + SCREEN_SLICE]
            await c.keys.load(_wanted(c, chunk))
            for e in chunk:
                found = screen(e.seq, e.subject, e.data, c.layout, c.keys, c.keys)
                if isinstance(found, Quarantined | Tombstone):
                    decided[e.seq] = "refused" if isinstance(found, Quarantined) else "erased"
                elif isinstance(found[1], SessionErased):
                    erased.add(e.subject)
    except Exception as exc:  # no key-encryption key, the database gone: nothing is exempt
        advice.append(f"referenced objects: the events could not be screened ({exc!r}): every reference counts")
        decided, erased = {}, set()
    refs: Objects = {}
    refused: Objects = {}
    fates: dict[tuple[str, str], set[str]] = {}
    for e in events:
        fate = decided.get(e.seq) or ("erased" if e.subject in erased else "kept")
        for r in refs_in(e.data):
            (refused if fate == "refused" else refs).setdefault((r.store, r.key), (r, e))
            fates.setdefault((r.store, r.key), set()).add(fate)
    refused = {k: v for k, v in refused.items() if fates[k] == {"refused"}}
    refs = {k: v for k, v in refs.items() if k not in refused}
    return refs, refused, {k for k in refs if "kept" not in fates[k]}


def _wanted(c: Container, events: list[StoredEvent]) -> set[tuple[str, str, str | None]]:
    """(tenant, session, key id) of each event's subject, as the projector loads them."""
    found: set[tuple[str, str, str | None]] = set()
    for e in events:
        try:
            found.add((*c.layout.parse(e.subject), kid_in(e.data)))
        except ValueError:  # no session subject: screened as refused
            continue
    return found


async def _refused(c: Container, refs: list[tuple[BlobRef, StoredEvent]]) -> str:
    """The line said of the objects only refused events reference (not counted in what is missing)."""
    stores = _stores(c)
    gone = [(r, e) for r, e in refs if r.store not in stores]
    for kind in stores:
        mine = [(r, e) for r, e in refs if r.store == kind]
        if mine:
            try:
                present = await _present(c, kind, mine)
            except Exception:  # the store did not answer: said as missing
                present = set()
            gone.extend((r, e) for r, e in mine if r.key not in present)
    named = ", ".join(f"{key} (sequence {seq})" for key, seq in _keys(gone)[:NAMED])
    return (
        f"refused events: {len(refs)} objects are referenced only by events the contract refuses (raw events a "
        f"tenant published itself, which the projector quarantines: `chronicle quarantine list`), "
        f"{len(gone)} of them missing{': ' + named if named else ''}; not counted: no readable message names them"
    )


def _erasure(event: StoredEvent) -> bool:
    """Whether ``event`` is a ``session.erased`` (its type is never sealed)."""
    if b'"session.erased"' not in event.data:
        return False
    try:
        raw = json.loads(event.data)
    except ValueError:
        return False
    return isinstance(raw, dict) and raw.get("type") == "session.erased"


def _stores(c: Container) -> dict[str, str]:
    """The stores a reference may name here, by kind: what their objects are, and where."""
    s = c.settings
    return {
        JetStreamBlobStore.kind: f"claim-checked bodies in the JetStream object store bucket {s.blob_bucket!r}",
        CLAIM_CHECK_S3: f"claim-checked bodies in S3 bucket {s.claim_check_bucket!r}",
        "s3": f"over-cap messages' originals in S3 bucket {s.originals_bucket!r}",
    }


def _keys(refs: list[tuple[BlobRef, StoredEvent]]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(((r.key, e.seq) for r, e in refs), key=lambda k: k[1]))


async def _objects(
    c: Container, kind: str, what: str, refs: list[tuple[BlobRef, StoredEvent]], erased: set[tuple[str, str]]
) -> tuple[str, MissingObjects | None]:
    """The line said of one store's objects that the restored events reference, and those missing
    (None when none is): those only erased sessions name (``erased``: store and key) are deleted
    by their erasure, so they are counted apart and expected. The JetStream object store is not in
    the archive (NATS's data directory holds it); S3's buckets are not touched by a lost log, but
    may have lost objects of their own."""
    if not refs:
        return f"{what}: no restored event references one", None
    try:
        present = await _present(c, kind, refs)
    except Exception as exc:  # the store did not answer: nothing is known present
        line = f"{what}: the restored events reference {len(refs)}, which could not be looked for ({exc!r})"
        return line, MissingObjects(what, len(refs), _keys(refs), why=repr(exc))
    gone = [(r, e) for r, e in refs if r.key not in present]
    expected = [(r, e) for r, e in gone if (r.store, r.key) in erased]
    lost = [(r, e) for r, e in gone if (r.store, r.key) not in erased]
    said = f"{what}: the restored events reference {len(refs)}, " + (
        f"{len(lost)} missing" if lost else "all present" if not expected else "none missing"
    )
    if expected:
        said += f" (and {len(expected)} of erased sessions, deleted by their erasure: expected)"
    if lost and kind == JetStreamBlobStore.kind:
        said += (
            "; not in the archive: their messages stay unreadable until the bucket is restored from a copy of the "
            "NATS data directory"
        )
    elif lost:
        said += "; their messages stay unreadable until the bucket's objects are restored (versioning, a backup)"
    return said, MissingObjects(what, len(refs) - len(expected), _keys(lost)) if lost else None


async def _present(c: Container, kind: str, refs: list[tuple[BlobRef, StoredEvent]]) -> set[str]:
    """The keys of ``refs`` the store of ``kind`` holds: each asked of the JetStream object store
    (its info, no bytes); an S3 bucket's listing under ``blobs/`` once, for all of them."""
    if kind == JetStreamBlobStore.kind:
        store = JetStreamBlobStore(c.js, c.settings.blob_bucket)
        return {r.key for r, _ in refs if await store.has(r)}
    bucket = c.settings.claim_check_bucket if kind == CLAIM_CHECK_S3 else c.settings.originals_bucket
    listed = set(await store_of(c).keys(bucket, "blobs/"))
    return {
        r.key
        for r, _ in refs
        if SHA256_HEX.fullmatch(r.sha256) and r.key == f"{bucket}/blobs/{r.sha256}" and f"blobs/{r.sha256}" in listed
    }
