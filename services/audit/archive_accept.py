"""``chronicle archive --accept-lost FIRST-LAST``: a hole the archive cannot fill any more (the
stream no longer holds those events) accepted as lost, recorded in the manifest
(:class:`~services.audit.archive_segments.AcceptedLoss`). Runs then stop failing on it, and
``--check`` says it as a note instead of a problem. Only such a hole is accepted: a range the
stream still holds, one beyond the archive's last sequence, one where the bucket holds a segment
object, or one cutting a missing segment in two, is refused and nothing changes."""

from __future__ import annotations

from datetime import UTC, datetime

from services.audit.archive import another_stream, locked, read_manifest, save, segment_objects, store_of
from services.audit.archive_segments import AcceptedLoss, ArchiveError, key_range, span, uncovered
from services.bootstrap import Container


async def accept_lost(c: Container, first: int, last: int) -> AcceptedLoss | None:
    """Record ``first..last`` as accepted lost (the loss recorded; None: already accepted, nothing
    changed). Listed segments of the range, whose objects are gone, leave the manifest with it.
    :class:`ArchiveError` for a range that is not such a hole (nothing changed)."""
    store, bucket, stream = store_of(c), c.settings.archive_bucket, c.layout.stream
    async with locked(c, stream):
        manifest = await read_manifest(store, bucket, stream)
        if manifest is None:
            raise ArchiveError(f"bucket {bucket!r} holds no archive of stream {stream!r}")
        info = await c.js.stream_info(stream)
        if manifest.stream_created != info.created:
            raise ArchiveError(another_stream(bucket, manifest, info.created))
        stream_first = int(info.state.first_seq)
        said = span(first, last)
        if last > manifest.last_seq:
            raise ArchiveError(
                f"{said}: the archive reaches sequence {manifest.last_seq}; only a hole below it can be "
                "accepted as lost"
            )
        if last >= stream_first:
            raise ArchiveError(
                f"{said}: the stream holds sequences from {stream_first}; only what it no longer holds can be "
                "accepted as lost (`chronicle archive` archives the rest again)"
            )
        objects = await segment_objects(store, bucket, stream)
        dropped = []
        for s in manifest.segments:
            if s.last < first or s.first > last:
                continue
            if s.key in objects:
                raise ArchiveError(f"{said}: segment {s.key} is in the bucket, so not lost")
            if s.first < first or s.last > last:
                raise ArchiveError(f"{said}: segment {s.key} is missing; accept its whole range {s.first}-{s.last}")
            dropped.append(s)
        for key in sorted(objects):
            named = key_range(stream, key)
            if named is not None and named[0] <= last and named[1] >= first:
                raise ArchiveError(
                    f"{said}: the bucket holds segment object {key}, which the manifest does not list; "
                    "run `chronicle archive` first (it lists it again when its events are the stream's)"
                )
        if not uncovered(first, last, manifest.accepted_lost):
            return None
        loss = AcceptedLoss(first=first, last=last, accepted_at=datetime.now(UTC))
        manifest.segments = [s for s in manifest.segments if s not in dropped]
        manifest.accepted_lost = sorted([*manifest.accepted_lost, loss], key=lambda a: a.first)
        await save(store, bucket, manifest)
        return loss
