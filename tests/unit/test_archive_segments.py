"""The audit archive's format (services/audit/archive_segments.py): segments hold the events
byte for byte, always the same bytes for the same events, and anything that is not what the
manifest says is an ArchiveError naming the segment."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from events.log import StoredEvent
from services.audit.archive_segments import (
    FORMAT,
    AcceptedLoss,
    ArchiveError,
    Manifest,
    Restoration,
    Segment,
    compare,
    decode,
    encode,
    gaps,
    key_range,
    lost_line,
    parse_manifest,
    rewritten,
    segment_key,
    segment_of,
    uncovered,
    unlisted_segment,
)

AT = datetime(2026, 12, 2, 5, 31, 7, 123456, tzinfo=UTC)
EVENTS = [
    StoredEvent(41, "c.ev.acme.p007.s-1", b'{"type":"message.appended","v":3}', {"Nats-Msg-Id": "e-41"}, AT),
    StoredEvent(42, "c.ev.acme.p007.s-1", b"\xff\xfe not even UTF-8", None, AT),  # as a refused event was stored
    StoredEvent(44, "c.ev.acme.p002.s-2", b"{}", {"Nats-Msg-Id": "e-44", "Nats-Expected-Last-Subject-Sequence": "7"}),
]


def segment(data: bytes, events: list[StoredEvent] = EVENTS) -> Segment:
    return segment_of(segment_key("S", events[0].seq, events[-1].seq), events, data)


def test_a_segment_gives_back_the_events_as_stored() -> None:
    data = encode(EVENTS)
    assert decode(data, segment(data)) == EVENTS


def test_the_same_events_always_make_the_same_bytes_an_auditor_can_read() -> None:
    assert encode(EVENTS) == encode(list(EVENTS))
    lines = gzip.decompress(encode(EVENTS)).decode().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [41, 42, 44]
    assert json.loads(lines[0])["time"] == "2026-12-02T05:31:07.123456+00:00"


def test_keys_sort_as_sequences_do() -> None:
    keys = [segment_key("S", a, b) for a, b in ((1, 9), (10, 99), (100, 1000))]
    assert keys == sorted(keys)


def test_bytes_that_do_not_hash_to_the_manifest_are_refused() -> None:
    data = encode(EVENTS)
    with pytest.raises(ArchiveError, match="do not hash"):
        decode(encode(EVENTS[:2]), segment(data))


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"not gzip", "not gzip"),
        (gzip.compress(b'{"seq": 41}\n', mtime=0), "not an archived event"),
        (gzip.compress(b'{"seq": 41, "subject": "s", "data": "%%%"}\n', mtime=0), "not an archived event"),
    ],
)
def test_a_segment_that_is_not_one_is_refused(payload: bytes, match: str) -> None:
    entry = Segment(key="k", first=41, last=41, count=1, bytes=len(payload), sha256=segment(payload).sha256)
    with pytest.raises(ArchiveError, match=match):
        decode(payload, entry)


def test_a_range_or_count_other_than_the_manifests_is_refused() -> None:
    data = encode(EVENTS)
    right = segment(data)
    for wrong in (
        right.model_copy(update={"first": 40}),
        right.model_copy(update={"last": 45}),
        right.model_copy(update={"count": 4}),
    ):
        with pytest.raises(ArchiveError, match="segment"):
            decode(data, wrong)


def test_a_manifest_must_be_this_format_with_segments_in_order() -> None:
    manifest = Manifest(stream="S", stream_created=AT, segments=[segment(encode(EVENTS))])
    assert parse_manifest(manifest.model_dump_json().encode()) == manifest
    assert manifest.last_seq == 44
    assert Manifest(stream="S", stream_created=AT).last_seq == 0
    with pytest.raises(ArchiveError, match="format"):
        parse_manifest(manifest.model_copy(update={"format": "other/2"}).model_dump_json().encode())
    twice = manifest.model_copy(update={"segments": manifest.segments * 2})
    with pytest.raises(ArchiveError, match="overlap"):
        parse_manifest(twice.model_dump_json().encode())
    with pytest.raises(ArchiveError, match="not valid"):
        parse_manifest(b"{")
    assert FORMAT == "chronicle-archive/1"


def _at(*seqs: int) -> list[StoredEvent]:
    return [StoredEvent(q, "c.ev.acme.p007.s-1", f"event {q}".encode(), {"Nats-Msg-Id": f"e-{q}"}, AT) for q in seqs]


def test_a_segment_equal_to_the_streams_range_compares_every_event_and_says_nothing_else() -> None:
    found = compare("k", _at(1, 2, 3, 5), _at(1, 2, 3, 5), 1, 9)  # 4: the stream never delivered it to either
    assert (found.equal, found.problems, found.notes) == (4, [], [])


def test_events_the_stream_holds_and_the_archive_lacks_or_holds_otherwise_are_problems_said_as_ranges() -> None:
    archived = _at(1, 4, 6, 7, 8)
    archived[2] = StoredEvent(6, archived[2].subject, b"edited", archived[2].headers, AT)
    found = compare("k", archived, _at(1, 2, 3, 4, 6, 7, 8), 1, 8)
    assert found.problems == [
        "sequences 2..3 in the stream but missing from the archive (k)",
        "sequence 6: the archived event differs from the stream's (k)",
    ]
    assert found.equal == 4


def test_events_archived_beyond_the_streams_last_are_problems() -> None:
    found = compare("k", _at(8, 9, 10, 11), _at(8, 9), 1, 9)
    assert found.problems == ["sequences 10..11 archived but missing from the stream (its last is 9)"]
    assert found.equal == 2


def test_what_the_stream_no_longer_holds_is_a_note_not_a_problem() -> None:
    found = compare("k", _at(1, 2, 3, 4, 5, 6), _at(3, 4, 6), 3, 9)  # 1..2 before its first; 5 deleted
    assert found.problems == []
    assert found.notes == [
        "sequences 1..2 archived, before the stream's first sequence 3: the archive is all there is of it",
        "sequence 5 archived, deleted from the stream since: not compared (k)",
    ]
    assert found.equal == 3


def test_a_restored_range_compares_without_stored_times_and_nothing_else_is_forgiven() -> None:
    restored_at = AT.replace(year=2027)
    stored = [replace(e, time=restored_at) for e in EVENTS]
    assert compare("k", EVENTS, stored, 1, 44, retimed_through=44).equal == 3
    after = compare("k", EVENTS, stored, 1, 44, retimed_through=42)  # 44 was stored after the restore
    assert (after.equal, after.problems) == (2, ["sequence 44: the archived event differs from the stream's (k)"])
    changed = [*stored[:2], replace(stored[2], data=b"[]")]
    assert compare("k", EVENTS, changed, 1, 44, retimed_through=44).problems == [
        "sequence 44: the archived event differs from the stream's (k)"
    ]


def test_a_manifest_names_the_restoration_of_the_stream_it_continues_on() -> None:
    old = Manifest(stream="S", stream_created=AT)
    earlier = old.model_dump_json(exclude={"restorations"}).encode()  # a manifest from before restorations
    assert parse_manifest(earlier).restorations == []
    assert old.restored is None
    later = AT.replace(year=2027)
    restoration = Restoration(stream_created=later, restored_from=AT, through_seq=196, restored_at=later)
    restored = old.model_copy(update={"stream_created": later, "restorations": [restoration]})
    assert parse_manifest(restored.model_dump_json().encode()).restored == restoration
    again = restored.model_copy(update={"stream_created": later.replace(year=2028)})  # made anew, not restored
    assert again.restored is None


def test_a_missing_segment_is_made_again_only_from_the_very_events_archived() -> None:
    data = encode(EVENTS)
    entry = segment(data)
    assert rewritten(entry, EVENTS) == (data, entry)
    assert rewritten(entry, EVENTS[1:]) is None  # the stream no longer holds the first
    assert rewritten(entry, [replace(e, time=None) for e in EVENTS]) is None  # stored anew (restored)
    assert rewritten(entry, []) is None


def test_what_a_run_could_not_repair_is_one_line_naming_each_range_and_why() -> None:
    data = encode(EVENTS)
    entry = segment(data)
    line = lost_line([entry], stream_first=50)
    assert "\n" not in line
    assert line.startswith(f"the archive lost sequences 41..44 (segment {entry.key}): the stream no longer holds")
    assert "its first sequence is 50" in line
    assert "are not the archived ones" in lost_line([entry], stream_first=1)


def test_the_gaps_of_a_manifest_come_last_first_with_where_their_segments_go() -> None:
    def entry(first: int, last: int) -> Segment:
        return Segment(key=segment_key("S", first, last), first=first, last=last, count=1, bytes=1, sha256="0")

    manifest = Manifest(stream="S", stream_created=AT, segments=[entry(3, 4), entry(5, 9), entry(12, 20)])
    assert gaps(manifest) == [(10, 11, 2), (1, 2, 0)]
    assert gaps(Manifest(stream="S", stream_created=AT, segments=[entry(1, 4), entry(5, 9)])) == []


def test_a_segment_key_names_its_range_and_nothing_else_is_taken_for_one() -> None:
    assert key_range("s", segment_key("s", 41, 44)) == (41, 44)
    others = ("s/manifest.json", "other/segments/1-2.ndjson.gz", "s/segments/9-3.ndjson.gz", "s/segments/x.ndjson.gz")
    for key in others:
        assert key_range("s", key) is None


def test_an_unlisted_segment_is_read_as_its_key_says_or_refused() -> None:
    data = encode(EVENTS)
    entry, events = unlisted_segment("k", 41, 44, data)
    assert (events, entry) == (EVENTS, segment_of("k", EVENTS, data))
    with pytest.raises(ArchiveError, match=r"sequences are not 40\.\.44"):
        unlisted_segment("k", 40, 44, data)
    with pytest.raises(ArchiveError, match="not gzip'd"):
        unlisted_segment("k", 41, 44, b"partial")


def test_accepted_losses_leave_only_the_parts_they_do_not_cover() -> None:
    accepted = [AcceptedLoss(first=a, last=b, accepted_at=AT) for a, b in ((8, 9), (3, 4))]
    assert uncovered(1, 10, accepted) == [(1, 2), (5, 7), (10, 10)]
    assert uncovered(3, 4, accepted) == []
    assert uncovered(4, 8, accepted) == [(5, 7)]


def test_a_hole_no_segment_covers_is_said_in_the_same_line_as_a_missing_segment() -> None:
    entry = segment(encode(EVENTS))
    line = lost_line([entry], 50, [(45, 47)])
    assert f"sequences 41..44 (segment {entry.key})" in line
    assert "sequences 45..47 (no segment): the stream no longer holds them all (its first sequence is 50)" in line
    assert line.endswith(
        "`chronicle archive --accept-lost FIRST-LAST` accepts a range the stream no longer holds as lost)"
    )


def test_a_missing_segment_is_known_by_its_events_when_another_zlib_compressed_it() -> None:
    data = encode(EVENTS)
    other = gzip.compress(gzip.decompress(data), compresslevel=1, mtime=0)  # the same NDJSON, other gzip bytes
    assert other != data
    entry = segment(other)
    assert entry.content_sha256 == segment(data).content_sha256
    assert rewritten(entry, EVENTS) == (data, segment(data))  # written anew, its entry updated to the new bytes
    assert rewritten(entry, EVENTS[1:]) is None
    old = entry.model_copy(update={"content_sha256": None})  # an entry written before the content hash was kept
    assert rewritten(old, EVENTS) is None
    assert decode(data, segment(data)) == EVENTS


def test_a_segment_whose_events_do_not_hash_to_its_entry_is_refused() -> None:
    data = encode(EVENTS)
    forged = segment(data).model_copy(update={"content_sha256": "0" * 64})
    with pytest.raises(ArchiveError, match="content_sha256"):
        decode(data, forged)
