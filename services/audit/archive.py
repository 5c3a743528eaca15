"""``chronicle archive``: the log copied to object storage for auditors (S3/MinIO bucket
``CHRONICLE_ARCHIVE_BUCKET``), and the check that an archive is whole and equals the log.

Each run appends segments for the events stored since the last one (services/audit/
archive_segments.py: the format), then rewrites the manifest, segment by segment, so that a run
stopped anywhere leaves an archive that the next run continues. Each run also lists the archive's
segment objects (one listing, no segment read): a listed segment whose object is gone is written
again from the stream when the stream still holds its events as archived (the same NDJSON), and
is said lost otherwise (:attr:`Archived.lost`); a range no listed segment covers (an entry dropped
from the manifest) is archived again from what the stream holds of it, the rest said lost
(:attr:`Archived.lost_holes`) unless accepted as lost (services/audit/archive_accept.py), after
the run lists again a
segment object of that range left in the bucket (read, and its events found equal to the stream's:
it may be the only copy of them); an unlisted object is deleted only after the last listed
sequence (a stopped run's). Segments are immutable: a
segment's key names its range, and the same events always make the same bytes. One run at a time
per stream (a Postgres advisory lock). The archive holds the events as stored: sealed fields stay
sealed (an erased session's stay unreadable there too), events written unsealed stay readable.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime

from events import log as eventlog
from events.log import StoredEvent
from projections.logbinding import stream_identity
from services.audit.archive_segments import (
    ArchiveError,
    Manifest,
    Restoration,
    Segment,
    chained,
    compare,
    decode,
    encode,
    gaps,
    key_range,
    manifest_key,
    parse_manifest,
    rewritten,
    segment_key,
    segment_of,
    span,
    uncovered,
    unlisted_segment,
)
from services.bootstrap import Container
from services.errors import Unavailable
from services.storage.s3 import SkillStore

SEGMENT_EVENTS = 10_000
"""Events per segment at most (the last segment of a run may hold fewer)."""
SEGMENT_BYTES = 64 * 1024 * 1024
"""Bytes of events per segment at most (claim checks keep events under the payload limit, but a
segment of 10,000 such events would be gigabytes to hold, encode and read back)."""


class ArchiveBusy(RuntimeError):
    """Another archive run of the same stream holds the lock."""


@dataclass(frozen=True, slots=True)
class Archived:
    """What a run added after the last archived sequence: segments, events, and the last sequence
    now archived; the missing segments it wrote again (a listed one whose object was gone, or one
    filling a range no listed segment covered), and the listed ones it could not (the stream no
    longer holds their events as archived), with the stream's first sequence when it looked (0:
    it did not need to)."""

    segments: int
    events: int
    last_seq: int
    repaired: tuple[Segment, ...] = ()
    lost: tuple[Segment, ...] = ()
    stream_first: int = 0
    adopted: tuple[Segment, ...] = ()
    """Segment objects the manifest did not list, inside a range no listed segment covers, listed
    again once read and found equal to the stream's events it still holds."""
    kept: tuple[tuple[str, str], ...] = ()
    """Segment objects the manifest does not list that the run left as they are, each with why."""
    lost_holes: tuple[tuple[int, int], ...] = ()
    """Ranges no listed segment covers that the stream no longer holds, not accepted as lost."""
    stream_last: int | None = None
    """The stream's last sequence when the run began (0: it has never held an event)."""

    @property
    def nothing(self) -> bool:
        """Nothing to archive: the stream has never held an event, and no archive was made (no
        manifest is written before a segment)."""
        return self.stream_last == 0 and self.last_seq == 0


@dataclass(slots=True)
class Checked:
    """What :func:`check` found: segments and events read, events compared with the stream, and
    every difference (empty: the archive is whole and equals the log)."""

    segments: int = 0
    events: int = 0
    compared: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the stream no longer holds and so nothing could compare: said, not a problem."""
    archive_last: int = 0
    """The last sequence the manifest lists (0: none)."""
    stream_last: int | None = None
    """The stream's last sequence when the check began (None: the check stopped before it)."""
    digests: dict[int, str] = field(default_factory=dict)
    """The archive's digest through each segment's last sequence (:func:`chained`), as far as
    every segment before it could be read; an anchor is checked against these."""

    @property
    def reach(self) -> str | None:
        """How far the archive reaches against the stream (behind is not a problem: runs are
        incremental; beyond is one, and among the problems); None when no manifest was read."""
        if self.stream_last is None:
            return None
        if self.archive_last > self.stream_last:
            return f"the archive claims up to sequence {self.archive_last}, beyond the stream's last {self.stream_last}"
        if self.archive_last == self.stream_last:
            return f"the archive reaches the stream's last sequence {self.stream_last}"
        return (
            f"the archive reaches sequence {self.archive_last}; the stream's last is {self.stream_last}: "
            f"{self.stream_last - self.archive_last} behind (the next `chronicle archive` adds them)"
        )

    @property
    def ok(self) -> bool:
        return not self.problems


def store_of(c: Container) -> SkillStore:
    store = c.context.skills
    if store is None:
        raise Unavailable("no object storage is configured (CHRONICLE_S3_ENDPOINT)")
    return store


def taken_over(manifest: Manifest, created: datetime | None) -> Restoration | None:
    """The restoration that made the stream the archive now names from the archive of the stream
    created at ``created``, when that stream is not the one the archive names (None otherwise): a
    restore on another NATS server (a drill, a copy for an auditor) while the archived stream lived
    on, the archive going on with the restored one since."""
    if created is None or manifest.stream_created == created or not manifest.restorations:
        return None
    last = manifest.restorations[-1]
    return last if last.stream_created == manifest.stream_created and last.restored_from == created else None


def taken_over_hint(manifest: Manifest, created: datetime | None) -> str:
    """What to add to the line that refuses another stream's archive when a restore took this
    stream's archive over (empty otherwise): what happened, and the way back."""
    taken = taken_over(manifest, created)
    if taken is None:
        return ""
    return (
        f": `chronicle archive --restore` made that stream from this stream's archive on "
        f"{taken.restored_at.isoformat()} (sequences 1..{taken.through_seq}), and the archive went on with it. If that "
        "restore was a drill or a copy and this stream is still the log, `chronicle archive --reclaim` gives the "
        "archive back to this stream (restore drills with `chronicle archive --restore --drill`, which leaves the "
        "archive as it is)"
    )


def another_stream(bucket: str, manifest: Manifest, created: datetime | None) -> str:
    """The line that refuses to archive into the archive of another stream of the same name."""
    return (
        f"bucket {bucket!r} holds the archive of another stream {manifest.stream!r} (created "
        f"{manifest.stream_created.isoformat()}, this one {created.isoformat() if created else 'at an unknown time'})"
        + taken_over_hint(manifest, created)
    )


async def read_manifest(store: SkillStore, bucket: str, stream: str) -> Manifest | None:
    data = await store.get_bytes(bucket, manifest_key(stream))
    return parse_manifest(data) if data is not None else None


async def archive(
    c: Container, *, segment_events: int = SEGMENT_EVENTS, segment_bytes: int = SEGMENT_BYTES, to_seq: int | None = None
) -> Archived:
    """Archive the events stored after the last archived one (up to ``to_seq``). Segment objects
    the manifest does not list are seen to first (:func:`_unlisted`). Before appending, what the
    archive lost below its last sequence is made again from the stream where it still can be (the
    module's docstring)."""
    store, bucket, stream = store_of(c), c.settings.archive_bucket, c.layout.stream
    identity = await stream_identity(c.js, stream)
    if identity.created is None:
        raise ArchiveError(f"stream {stream!r} has no creation time: it cannot be told from another of its name")
    async with locked(c, stream):
        manifest = await read_manifest(store, bucket, stream)
        if manifest is None:
            manifest = Manifest(stream=stream, stream_created=identity.created)
        elif manifest.stream_created != identity.created:
            raise ArchiveError(another_stream(bucket, manifest, identity.created))
        objects = await segment_objects(store, bucket, manifest.stream)
        adopted, kept = await _unlisted(c, store, bucket, manifest, objects)
        missing = [s for s in manifest.segments if s.key not in objects]
        repaired, lost, stream_first = await _repair(c, store, bucket, manifest, missing)
        cut = Cut(segment_events, segment_bytes)
        holes = gaps(manifest)
        if holes and not stream_first:
            stream_first = int((await c.js.stream_info(stream)).state.first_seq)
        for first, last, index in holes:  # a segment dropped with its entry: what the stream holds of it
            if last >= stream_first:
                repaired += await _append(c, store, bucket, manifest, cut, max(first, stream_first), last, index)
        added = await _append(c, store, bucket, manifest, cut, manifest.last_seq + 1, to_seq, None)
        holes = gaps(manifest)  # now: what the stream no longer held, unless accepted as lost
        if holes and not stream_first:
            stream_first = int((await c.js.stream_info(stream)).state.first_seq)
        lost_holes = [
            part
            for first, last, _ in reversed(holes)
            if first < stream_first
            for part in uncovered(first, min(last, stream_first - 1), manifest.accepted_lost)
        ]
        return Archived(
            len(added),
            sum(s.count for s in added),
            manifest.last_seq,
            repaired=tuple(repaired),
            lost=tuple(lost),
            stream_first=stream_first,
            adopted=tuple(adopted),
            kept=tuple(kept),
            lost_holes=tuple(lost_holes),
            stream_last=identity.last_seq,
        )


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a run cuts segments: after ``events`` events, or once they hold ``bytes`` bytes."""

    events: int
    bytes: int


async def _append(
    c: Container,
    store: SkillStore,
    bucket: str,
    manifest: Manifest,
    cut: Cut,
    first: int,
    last: int | None,
    index: int | None,
) -> list[Segment]:
    """Archive the stream's events ``first..last`` (None: to its end) in segments listed at
    ``index`` of the manifest (None: after the last), each written before the manifest that lists
    it; the segments written."""
    written: list[Segment] = []
    batch: list[StoredEvent] = []
    size = 0
    async for event in eventlog.read(c.js, c.layout, None, first, last):
        batch.append(event)
        size += len(event.data)
        if len(batch) == cut.events or size >= cut.bytes:
            written.append(await _write(store, bucket, manifest, batch, index, len(written)))
            batch, size = [], 0
    if batch:
        written.append(await _write(store, bucket, manifest, batch, index, len(written)))
    return written


async def _unlisted(
    c: Container, store: SkillStore, bucket: str, manifest: Manifest, objects: set[str]
) -> tuple[list[Segment], list[tuple[str, str]]]:
    """The segment objects the manifest does not list. One after its last sequence is what a run
    stopped before its manifest left: deleted (this run writes that range again, perhaps cut
    elsewhere). One inside a range no listed segment covers (its entry dropped from the manifest)
    may be the only copy of its events: listed again when it reads as its key says and its events
    equal those the stream still holds of its range; else kept as it is. Nothing below the
    manifest's last sequence is ever deleted. The segments listed again, and those kept with why."""
    listed = {s.key for s in manifest.segments}
    adopted: list[Segment] = []
    kept: list[tuple[str, str]] = []
    for key in sorted(objects - listed):
        named = key_range(manifest.stream, key)
        if named is None:
            kept.append((key, "its key names no range of this stream's sequences"))
            continue
        if named[0] > manifest.last_seq:
            await store.delete(bucket, key)
            continue
        index, why = await _verified(c, store, bucket, manifest, key, named)
        if index is None:
            kept.append((key, why))
            continue
        adopted.append(manifest.segments[index])
        await save(store, bucket, manifest)
    return adopted, kept


async def _verified(
    c: Container, store: SkillStore, bucket: str, manifest: Manifest, key: str, named: tuple[int, int]
) -> tuple[int | None, str]:
    """An unlisted segment object of ``named`` listed in ``manifest`` (not yet written) where its
    range lies in a gap, it reads as its key says, and its events are the stream's: its index
    there; else None and why not."""
    first, last = named
    index = next((i for i, s in enumerate(manifest.segments) if s.first > first), len(manifest.segments))
    before = manifest.segments[index - 1].last if index else 0
    if first <= before or (index < len(manifest.segments) and manifest.segments[index].first <= last):
        return None, "it overlaps a listed segment"
    data = await store.get_bytes(bucket, key)
    if data is None:
        return None, "it went while the run read it"
    try:
        segment, events = unlisted_segment(key, first, last, data)
    except ArchiveError as exc:
        return None, str(exc)
    info = await c.js.stream_info(c.layout.stream)
    held = [e async for e in eventlog.read(c.js, c.layout, None, first, last)]
    restored = manifest.restored
    found = compare(
        key,
        events,
        held,
        int(info.state.first_seq),
        int(info.state.last_seq),
        retimed_through=restored.through_seq if restored is not None else 0,
    )
    if found.problems:
        return None, "; ".join(found.problems)
    manifest.segments.insert(index, segment)
    return index, ""


async def _repair(
    c: Container, store: SkillStore, bucket: str, manifest: Manifest, missing: list[Segment]
) -> tuple[list[Segment], list[Segment], int]:
    """Each missing segment written again from the stream's events of its range when they are
    the archived ones (:func:`rewritten`; an entry the new bytes hash otherwise is updated in the
    manifest, written after them); the segments repaired, those lost, and the stream's first
    sequence (0 when nothing was missing)."""
    if not missing:
        return [], [], 0
    stream_first = int((await c.js.stream_info(c.layout.stream)).state.first_seq)
    repaired: list[Segment] = []
    lost: list[Segment] = []
    for segment in missing:
        made = None
        if segment.first >= stream_first:  # else part of it is gone: nothing to read (a jump costs a get per seq)
            held = [e async for e in eventlog.read(c.js, c.layout, None, segment.first, segment.last)]
            made = rewritten(segment, held)
        if made is None:
            lost.append(segment)
            continue
        data, entry = made
        await store.put_bytes(bucket, segment.key, data)
        if entry != segment:
            manifest.segments[manifest.segments.index(segment)] = entry
            await save(store, bucket, manifest)
        repaired.append(entry)
    return repaired, lost, stream_first


@contextlib.asynccontextmanager
async def locked(c: Container, stream: str) -> AsyncIterator[None]:
    """The archive of ``stream`` held by this run alone (a Postgres advisory lock):
    :class:`ArchiveBusy` when another run (an archive or a restore) holds it."""
    lock_key = f"chronicle-archive:{stream}"
    async with c.pool.connection() as lock:
        cur = await lock.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (lock_key,))
        row = await cur.fetchone()
        if row is None or not row[0]:
            raise ArchiveBusy(f"another `chronicle archive` of stream {stream!r} is running")
        try:
            yield
        finally:
            await lock.execute("SELECT pg_advisory_unlock(hashtext(%s))", (lock_key,))


async def _write(
    store: SkillStore, bucket: str, manifest: Manifest, batch: list[StoredEvent], index: int | None, nth: int
) -> Segment:
    """One segment of ``batch``, listed at ``index + nth`` (None: appended)."""
    data = encode(batch)
    key = segment_key(manifest.stream, batch[0].seq, batch[-1].seq)
    await store.put_bytes(bucket, key, data)  # first the segment, then the manifest that lists it
    segment = segment_of(key, batch, data)
    manifest.segments.insert(len(manifest.segments) if index is None else index + nth, segment)
    await save(store, bucket, manifest)
    return segment


async def save(store: SkillStore, bucket: str, manifest: Manifest) -> None:
    """The manifest written over the one in the bucket."""
    await store.put_bytes(bucket, manifest_key(manifest.stream), manifest.model_dump_json(indent=1).encode())


async def segment_objects(store: SkillStore, bucket: str, stream: str) -> set[str]:
    """The keys of the segment objects of the stream's archive (one listing: no object is read)."""
    prefix = segment_key(stream, 1, 1).rsplit("/", 1)[0] + "/"
    return set(await store.keys(bucket, prefix))


async def unlisted(store: SkillStore, bucket: str, manifest: Manifest) -> list[str]:
    """Segment objects of the stream's archive that its manifest does not list."""
    listed = {s.key for s in manifest.segments}
    return sorted(await segment_objects(store, bucket, manifest.stream) - listed)


async def check(c: Container) -> Checked:
    """Prove the archive complete and equal to the log for the range it covers.

    The manifest must be valid and its segments contiguous from sequence 1 (each starts right
    after the one before; no overlap, no gap), with no other segment object beside them, and of
    this stream (its creation time). Each segment must be what its manifest entry says (hash,
    range, count); its events are then walked in lockstep with the stream's of the same range:
    every sequence the stream holds there must be archived exactly once and equal (subject,
    headers, time, bytes), and nothing may be archived beyond the stream's last sequence. What the
    stream itself no longer holds (before its first sequence, or deleted inside its range: the
    stream refuses deletes, so only a stream changed outside Chronicle) is not compared and is
    said as a note, not as a problem; but sequences before its first that no segment archives are
    a hole the archive lost, a problem unless accepted as lost (then a note). How far the archive
    reaches is said too: behind the stream is not a problem (each run archives what came since
    the last). No archive of a stream that has never held an event is not one either (a note: a
    run over it has nothing to archive and makes none)."""
    store, bucket, stream = store_of(c), c.settings.archive_bucket, c.layout.stream
    out = Checked()
    try:
        manifest = await read_manifest(store, bucket, stream)
    except ArchiveError as exc:
        out.problems.append(str(exc))
        return out
    info = await c.js.stream_info(stream)  # its identity (creation time) and the range it holds
    if manifest is None and int(info.state.last_seq) == 0:  # what a run over it made: nothing
        out.notes.append(f"stream {stream!r} has never held an event: nothing to archive, so no archive yet")
        return out
    if manifest is None:
        out.problems.append(f"bucket {bucket!r} holds no archive of stream {stream!r}")
        return out
    first_held, last_held = int(info.state.first_seq), int(info.state.last_seq)
    same_stream = manifest.stream_created == info.created
    if same_stream:  # how far it reaches is said of this stream's archive only
        out.archive_last, out.stream_last = manifest.last_seq, last_held
    else:
        out.problems.append(
            f"the archive is of another stream {stream!r} (created {manifest.stream_created.isoformat()}); this one "
            f"was created {info.created.isoformat() if info.created else 'at an unknown time'}"
            + taken_over_hint(manifest, info.created)
        )
    out.problems.extend(
        f"segment object {key} is not in the manifest" for key in await unlisted(store, bucket, manifest)
    )
    if manifest.last_seq > last_held:
        out.problems.append(
            f"the manifest claims sequences up to {manifest.last_seq}; the stream's last is {last_held}"
        )
    restored = manifest.restored if same_stream else None
    retimed = restored.through_seq if restored is not None else 0
    if restored is not None:
        out.notes.append(
            f"sequences 1..{retimed} were restored from this archive on {restored.restored_at.isoformat()} (from the "
            f"stream created {restored.restored_from.isoformat()}): the stream stored them anew, so they are compared "
            "without their stored time"
        )
    after = 0
    digest: str | None = ""  # None once a segment could not be read: nothing after it is chained
    for segment in manifest.segments:
        if segment.first != after + 1 and same_stream:
            await _gap(c, out, manifest, segment, after, first_held)
        elif segment.first != after + 1:
            out.problems.append(f"segment {segment.key} starts at {segment.first}, after {after}: a gap")
        after = segment.last
        data = await store.get_bytes(bucket, segment.key)
        if data is None:
            out.problems.append(f"segment {segment.key} is missing")
            digest = None
            continue
        try:
            events = decode(data, segment)
        except ArchiveError as exc:
            out.problems.append(str(exc))
            digest = None
            continue
        out.segments += 1
        out.events += len(events)
        if digest is not None:
            digest = out.digests[segment.last] = chained(digest, segment.first, segment.last, events)
        if not same_stream:
            continue
        held = [e async for e in eventlog.read(c.js, c.layout, None, segment.first, segment.last)]
        found = compare(segment.key, events, held, first_held, last_held, retimed_through=retimed)
        out.compared += found.equal
        out.problems.extend(found.problems)
        out.notes.extend(found.notes)
    return out


async def _gap(c: Container, out: Checked, manifest: Manifest, segment: Segment, after: int, first_held: int) -> None:
    """Sequences between two segments (or before the first): a problem when the stream holds any
    of them (the archive lost them), or when they are before its first sequence (``first_held``:
    lost for good) unless accepted as lost (then a note); a note when the stream, inside its range,
    holds none (deleted from it: nothing to archive there)."""
    first, last = after + 1, segment.first - 1
    if first > last:  # an overlap (parse_manifest refuses one; said here should it get through)
        out.problems.append(f"segment {segment.key} starts at {segment.first}, after {after}: an overlap")
        return
    if first < first_held:  # what the stream no longer holds: lost, or accepted as lost
        gone = min(last, first_held - 1)
        for loss in manifest.accepted_lost:
            if loss.first <= gone and loss.last >= first:
                out.notes.append(
                    f"{span(max(loss.first, first), min(loss.last, gone))}: accepted as lost on "
                    f"{loss.accepted_at.isoformat()} (`chronicle archive --accept-lost`)"
                )
        out.problems.extend(
            f"{span(a, b)}: no segment archives them and the stream no longer holds them (its first sequence is "
            f"{first_held}): lost"
            for a, b in uncovered(first, gone, manifest.accepted_lost)
        )
        first = gone + 1
        if first > last:
            return
    held = [e.seq async for e in eventlog.read(c.js, c.layout, None, first, last)]
    if held:
        out.problems.append(
            f"segment {segment.key} starts at {segment.first}, after {after}: a gap; the stream holds "
            f"{len(held)} of {span(first, last)}, which no segment archives"
        )
    else:
        out.notes.append(f"{span(first, last)}: the stream holds none of them, so no segment archives them")
