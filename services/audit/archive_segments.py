"""The audit archive's format (pure): the log copied to object storage as it is stored, in
segments an auditor can read with any gzip and JSON tool.

A segment is gzip'd NDJSON, one line per stored event, in stream order::

    {"seq": 41, "subject": "chronicle.ev.acme.p007.s-1", "time": "2026-12-02T05:31:07.123456+00:00",
     "headers": {"Nats-Msg-Id": "…"}, "data": "<base64 of the event's bytes exactly as stored>"}

The bytes are base64 so that what is archived is what the stream holds, byte for byte (a sealed
event stays sealed; a quarantined one keeps the bytes that were refused). The gzip header carries
no name or time, so the same events always make the same segment (a run repeated after a crash
writes identical objects). The manifest lists the segments with their ranges and SHA-256 (of the
gzip bytes, and of the NDJSON inside, which another zlib build does not change): it is what makes
an archive checkable without the stream. :func:`compare` walks a segment's events in
lockstep with the stream's of its range (what ``chronicle archive --check`` proves per segment).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from events.log import StoredEvent

FORMAT = "chronicle-archive/1"


class ArchiveError(ValueError):
    """An archive that is not what its manifest says (or not an archive of this format)."""


class Segment(BaseModel):
    """One object of the archive: the events with ``first <= seq <= last``, ``count`` of them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    first: int = Field(ge=1)
    last: int = Field(ge=1)
    count: int = Field(ge=1)
    bytes: int = Field(ge=0)
    sha256: str
    content_sha256: str | None = None
    """The SHA-256 of the segment's NDJSON before gzip (entries written before it was kept: None).
    Another zlib may compress the same events to other bytes; this hash still knows them."""


class Restoration(BaseModel):
    """A stream restored from this archive (``chronicle archive --restore``): the stream created at
    ``stream_created`` holds sequences 1..``through_seq`` as the stream created at ``restored_from``
    held them (subject, headers, bytes), stored anew at ``restored_at`` (so with the restore's times)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stream_created: datetime
    restored_from: datetime
    through_seq: int = Field(ge=1)
    restored_at: datetime


class AcceptedLoss(BaseModel):
    """Sequences ``first..last`` the archive lost while the stream no longer held them, accepted
    as lost at ``accepted_at`` (``chronicle archive --accept-lost``): runs stop failing on them, and
    ``--check`` says them as a note."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first: int = Field(ge=1)
    last: int = Field(ge=1)
    accepted_at: datetime


class Manifest(BaseModel):
    """The archive of one stream: its name and creation time (which stream, not only which name),
    and its segments in order, contiguous in sequence. ``restorations``: the streams restored from
    it, oldest first; the last one's stream is the one ``stream_created`` names (the archive
    continues there). ``accepted_lost``: the holes an operator accepted as lost, in order."""

    model_config = ConfigDict(extra="forbid")

    format: str = FORMAT
    stream: str
    stream_created: datetime
    segments: list[Segment] = Field(default_factory=list)
    restorations: list[Restoration] = Field(default_factory=list)
    accepted_lost: list[AcceptedLoss] = Field(default_factory=list)

    @property
    def last_seq(self) -> int:
        """The last sequence archived (0 when nothing is)."""
        return self.segments[-1].last if self.segments else 0

    @property
    def restored(self) -> Restoration | None:
        """The restoration that made the stream ``stream_created`` names (None: it was not restored)."""
        mine = [r for r in self.restorations if r.stream_created == self.stream_created]
        return mine[-1] if mine else None


def encode(events: Iterable[StoredEvent]) -> bytes:
    """A segment's bytes: deterministic for the same events (under the same zlib)."""
    return gzip.compress(ndjson(events), mtime=0)


def ndjson(events: Iterable[StoredEvent]) -> bytes:
    """A segment's content before gzip: one line per event."""
    lines = [
        json.dumps(
            {
                "seq": e.seq,
                "subject": e.subject,
                "time": e.time.isoformat() if e.time is not None else None,
                "headers": e.headers or None,
                "data": base64.b64encode(e.data).decode("ascii"),
            },
            separators=(",", ":"),
        )
        for e in events
    ]
    return ("\n".join(lines) + "\n").encode()


def chained(previous: str, first: int, last: int, events: Iterable[StoredEvent]) -> str:
    """The archive's digest through a segment: SHA-256 over the digest through the segment before
    (``""`` before the first), the segment's range and its events as archived (:func:`ndjson`:
    sequence, subject, stored time, headers, bytes). A digest an auditor keeps where the operator
    cannot change it proves later that the archive through that sequence is what it was: a
    segment rewritten, added inside the range, dropped or reordered changes it, whatever the
    manifest was made to say."""
    content = hashlib.sha256(ndjson(events)).hexdigest()
    return hashlib.sha256(f"{previous}\n{first}\n{last}\n{content}".encode()).hexdigest()


def parse_anchor(text: str) -> tuple[int, str] | None:
    """``SEQ:DIGEST`` (a sequence and a 64-hex-digit digest, as ``--check`` prints them); None if not."""
    seq, sep, digest = text.partition(":")
    digest = digest.strip().lower()
    if not sep or not seq.isdigit() or int(seq) < 1 or len(digest) != 64:
        return None
    if any(ch not in "0123456789abcdef" for ch in digest):
        return None
    return int(seq), digest


def decode(data: bytes, segment: Segment) -> list[StoredEvent]:
    """The events of a segment, checked against its manifest entry: its SHA-256, then each line,
    then the sequence range and count. :class:`ArchiveError` for anything else."""
    if hashlib.sha256(data).hexdigest() != segment.sha256:
        raise ArchiveError(f"segment {segment.key}: its bytes do not hash to the manifest's sha256")
    out = _events(data, segment.key, segment.first, segment.last, segment.content_sha256)
    if len(out) != segment.count:
        raise ArchiveError(f"segment {segment.key}: {len(out)} events, the manifest says {segment.count}")
    return out


def unlisted_segment(key: str, first: int, last: int, data: bytes) -> tuple[Segment, list[StoredEvent]]:
    """A segment object no manifest entry lists, read as what its key says (``first..last``): its
    manifest entry and events, once each line is an archived event and the sequences run from
    ``first`` to ``last`` in order. :class:`ArchiveError` otherwise."""
    events = _events(data, key, first, last)
    return segment_of(key, events, data), events


def _events(data: bytes, key: str, first: int, last: int, content_sha256: str | None = None) -> list[StoredEvent]:
    """A segment's events, each line an archived event, their sequences ``first..last`` in order
    (and its NDJSON hashing to ``content_sha256`` when given)."""
    try:
        raw = gzip.decompress(data)
        text = raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"segment {key}: not gzip'd UTF-8: {exc}") from None
    if content_sha256 is not None and hashlib.sha256(raw).hexdigest() != content_sha256:
        raise ArchiveError(f"segment {key}: its events do not hash to the manifest's content_sha256")
    out = [_event(line, key) for line in text.split("\n") if line]
    seqs = [e.seq for e in out]
    if not seqs or seqs != sorted(set(seqs)) or seqs[0] != first or seqs[-1] != last:
        raise ArchiveError(f"segment {key}: sequences are not {first}..{last} in order")
    return out


def segment_of(key: str, events: list[StoredEvent], data: bytes) -> Segment:
    return Segment(
        key=key,
        first=events[0].seq,
        last=events[-1].seq,
        count=len(events),
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_sha256=hashlib.sha256(ndjson(events)).hexdigest(),
    )


def rewritten(segment: Segment, events: Sequence[StoredEvent]) -> tuple[bytes, Segment] | None:
    """A missing segment made again from the stream's events of its range, with its manifest
    entry: when they are the events archived there, by the NDJSON its entry hashes
    (``content_sha256``; the gzip bytes may differ under another zlib, and the entry is then
    updated to them), or, for an entry without that hash, by the very gzip bytes it hashes. None
    when they are not (the stream no longer holds them all, or holds them otherwise: restored, so
    with other times)."""
    if not events:
        return None
    data = encode(events)
    if hashlib.sha256(data).hexdigest() == segment.sha256:
        return data, segment
    if segment.content_sha256 is None:
        return None
    made = segment_of(segment.key, list(events), data)
    return (data, made) if made.content_sha256 == segment.content_sha256 else None


def gaps(manifest: Manifest) -> list[tuple[int, int, int]]:
    """The ranges no listed segment covers below the manifest's last sequence (before the first
    segment too), as ``(first, last, index)``: ``index`` is where in ``manifest.segments`` a
    segment of that range goes. Last gap first, so that filling one keeps the others' indexes."""
    out: list[tuple[int, int, int]] = []
    after = 0
    for index, s in enumerate(manifest.segments):
        if s.first > after + 1:
            out.append((after + 1, s.first - 1, index))
        after = s.last
    return out[::-1]


def uncovered(first: int, last: int, accepted: Sequence[AcceptedLoss]) -> list[tuple[int, int]]:
    """The parts of ``first..last`` that no accepted loss covers, in order."""
    out: list[tuple[int, int]] = []
    at = first
    for loss in sorted(accepted, key=lambda a: a.first):
        if loss.last < at or loss.first > last:
            continue
        if loss.first > at:
            out.append((at, loss.first - 1))
        at = loss.last + 1
    if at <= last:
        out.append((at, last))
    return out


def lost_line(lost: Sequence[Segment], stream_first: int, holes: Sequence[tuple[int, int]] = ()) -> str:
    """What an archive run could not repair, in one line: each missing segment's range and key,
    each range no segment covers (``holes``), and why the stream cannot give it back
    (``stream_first``: the first sequence it holds)."""
    gone = f"the stream no longer holds them all (its first sequence is {stream_first})"
    said = "; ".join(
        [
            *(
                f"{span(s.first, s.last)} (segment {s.key}): "
                + (gone if s.first < stream_first else "the stream's events there are not the archived ones")
                for s in lost
            ),
            *(f"{span(first, last)} (no segment): {gone}" for first, last in holes),
        ]
    )
    return (
        f"the archive lost {said}; they cannot be archived again (`chronicle archive --check` names the gap; "
        "`chronicle archive --accept-lost FIRST-LAST` accepts a range the stream no longer holds as lost)"
    )


def span(first: int, last: int) -> str:
    """``sequence 7``, ``sequences 9..12``: a range of sequences as the archive's lines say it."""
    return f"sequence {first}" if first == last else f"sequences {first}..{last}"


def segment_key(stream: str, first: int, last: int) -> str:
    """Segments sort by their key as they do by sequence."""
    return f"{stream}/segments/{first:020d}-{last:020d}.ndjson.gz"


def key_range(stream: str, key: str) -> tuple[int, int] | None:
    """The range a segment key of the stream names (None: not a segment key of it)."""
    name = key.removeprefix(f"{stream}/segments/")
    if name == key or not name.endswith(".ndjson.gz"):
        return None
    first, sep, last = name.removesuffix(".ndjson.gz").partition("-")
    if not sep or not first.isdigit() or not last.isdigit() or not 1 <= int(first) <= int(last):
        return None
    return int(first), int(last)


def manifest_key(stream: str) -> str:
    return f"{stream}/manifest.json"


def parse_manifest(data: bytes) -> Manifest:
    try:
        manifest = Manifest.model_validate_json(data)
    except ValueError as exc:
        raise ArchiveError(f"the manifest is not valid: {str(exc)[:300]}") from None
    if manifest.format != FORMAT:
        raise ArchiveError(f"the manifest's format is {manifest.format!r}, not {FORMAT!r}")
    after = 0
    for s in manifest.segments:
        if s.first <= after or s.last < s.first:
            raise ArchiveError(f"the manifest's segments overlap or go back at {s.key}")
        after = s.last
    return manifest


def _event(line: str, key: str) -> StoredEvent:
    try:
        raw: Any = json.loads(line)
        return StoredEvent(
            seq=int(raw["seq"]),
            subject=str(raw["subject"]),
            data=base64.b64decode(raw["data"], validate=True),
            headers=dict(raw["headers"]) if raw.get("headers") else None,
            time=datetime.fromisoformat(raw["time"]) if raw.get("time") else None,
        )
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise ArchiveError(f"segment {key}: a line is not an archived event: {str(exc)[:200]}") from None


@dataclass(slots=True)
class Comparison:
    """One segment's events walked in lockstep with the stream's of its range.

    ``equal``: sequences held by both, byte for byte the same. ``problems``: what makes the archive
    not the log (an event the stream holds and the archive lacks; one they hold differently; one
    archived beyond the stream's last sequence). ``notes``: what the stream itself no longer holds
    (before its first sequence, or deleted inside its range), which nothing can compare: not a
    problem of the archive, but said."""

    equal: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def compare(
    key: str,
    archived: Sequence[StoredEvent],
    stored: Sequence[StoredEvent],
    stream_first: int,
    stream_last: int,
    *,
    retimed_through: int = 0,
) -> Comparison:
    """Compare a segment's events (``archived``, in order) with the stream's events of the same
    range (``stored``, in order, as the stream delivers them: without what it no longer holds).
    ``stream_first``/``stream_last``: the range the stream holds now. Every sequence either side
    holds is accounted for exactly once. Sequences up to ``retimed_through`` were restored from
    the archive (stored anew, at the restore's time): compared without their stored time."""
    out = Comparison()
    missing: list[int] = []  # held by the stream, not archived
    differ: list[int] = []
    beyond: list[int] = []  # archived after the stream's last sequence
    before: list[int] = []  # archived before the stream's first sequence
    deleted: list[int] = []  # archived, inside the stream's range, but no longer in the stream
    i = j = 0
    while i < len(archived) or j < len(stored):
        a = archived[i] if i < len(archived) else None
        s = stored[j] if j < len(stored) else None
        if a is not None and s is not None and a.seq == s.seq:
            if a == s or (a.seq <= retimed_through and replace(a, time=None) == replace(s, time=None)):
                out.equal += 1
            else:
                differ.append(a.seq)
            i, j = i + 1, j + 1
        elif s is not None and (a is None or s.seq < a.seq):
            missing.append(s.seq)
            j += 1
        else:
            assert a is not None
            if a.seq > stream_last:
                beyond.append(a.seq)
            elif a.seq < stream_first:
                before.append(a.seq)
            else:
                deleted.append(a.seq)
            i += 1
    out.problems += [f"{r} in the stream but missing from the archive ({key})" for r in _ranges(missing)]
    out.problems += [f"{r}: the archived event differs from the stream's ({key})" for r in _ranges(differ)]
    out.problems += [f"{r} archived but missing from the stream (its last is {stream_last})" for r in _ranges(beyond)]
    out.notes += [
        f"{r} archived, before the stream's first sequence {stream_first}: the archive is all there is of it"
        for r in _ranges(before)
    ]
    out.notes += [f"{r} archived, deleted from the stream since: not compared ({key})" for r in _ranges(deleted)]
    return out


def _ranges(seqs: list[int]) -> list[str]:
    """``sequence 7``, ``sequences 9..12``: runs of consecutive sequences, each said once."""
    out: list[str] = []
    start = 0
    for k in range(1, len(seqs) + 1):
        if k == len(seqs) or seqs[k] != seqs[k - 1] + 1:
            out.append(span(seqs[start], seqs[k - 1]))
            start = k
    return out
