"""``chronicle archive``: the log copied to S3 for auditors, segment by segment, continued by each
run, checked against the stream; one run at a time; never into another stream's archive. Real
NATS, Postgres, S3 (moto), and the CLI as a process."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import re
import socket
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace

import psycopg
import pytest
from pydantic import SecretStr

from events import log as eventlog
from events.log import StoredEvent
from events.omitted import OMITTED
from services.audit import archive
from services.audit.archive import ArchiveBusy
from services.audit.archive_accept import accept_lost
from services.audit.archive_segments import (
    ArchiveError,
    Segment,
    decode,
    encode,
    manifest_key,
    parse_manifest,
    segment_key,
    segment_of,
)
from services.bootstrap import Container
from services.ops.cli import UNREACHABLE_EXIT
from services.settings import Settings, new_operator_seed
from services.storage.s3 import SkillStore
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import chronicle_cli


@pytest.fixture
async def stack(nats_url: str, fresh_db: str, s3_endpoint: str) -> AsyncIterator[Container]:
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint, archive_bucket=f"archive-{fresh_db[-8:]}")
    async with running_stack(settings) as c:
        yield c


async def appended(c: Container, session: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        await c.commands.append("tenant-a", session, text_message(f"m{i}", f"message {i}"), OMITTED)


async def manifest_of(c: Container) -> bytes:
    store = c.context.skills
    assert store is not None
    data = await store.get_bytes(c.settings.archive_bucket, manifest_key(c.layout.stream))
    assert data is not None
    return data


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return chronicle_cli(settings, "archive", *args)


async def test_each_run_archives_what_came_since_as_stored_and_the_check_finds_it_equal(stack: Container) -> None:
    c = stack
    await appended(c, "s-1", 12)
    await appended(c, "s-2", 9)
    end = await eventlog.last_seq(c.js, c.layout)
    first = await archive.archive(c, segment_events=10)
    assert (first.events, first.last_seq, first.segments) == (end, end, -(-end // 10))
    manifest = parse_manifest(await manifest_of(c))
    assert (manifest.segments[0].first, manifest.segments[0].last) == (1, 10)
    assert manifest.last_seq == end

    store = c.context.skills
    assert store is not None
    archived = []
    for segment in manifest.segments:
        data = await store.get_bytes(c.settings.archive_bucket, segment.key)
        assert data is not None
        archived.extend(decode(data, segment))
    stored = [e async for e in eventlog.read(c.js, c.layout)]
    assert [(e.seq, e.subject, e.data, e.headers) for e in archived] == [
        (e.seq, e.subject, e.data, e.headers) for e in stored
    ]

    again = await archive.archive(c, segment_events=10)
    assert (again.segments, again.events, again.last_seq) == (0, 0, end)  # nothing new: nothing written
    await appended(c, "s-1", 3, start=12)
    later = await archive.archive(c, segment_events=10)
    assert (later.events, later.last_seq) == (3, end + 3)
    assert parse_manifest(await manifest_of(c)).segments[-1].first == end + 1

    checked = await archive.check(c)
    assert checked.ok, checked.problems
    assert (checked.events, checked.compared) == (end + 3, end + 3)


async def test_the_check_names_a_segment_changed_or_gone(stack: Container) -> None:
    c = stack
    await appended(c, "s-1", 15)
    await archive.archive(c, segment_events=10)
    manifest = parse_manifest(await manifest_of(c))
    store = c.context.skills
    assert store is not None
    bucket = c.settings.archive_bucket
    first, second = manifest.segments[0], manifest.segments[1]
    data = await store.get_bytes(bucket, second.key)
    assert data is not None
    await store.put_bytes(bucket, first.key, data)  # another segment's bytes in its place
    await store.delete(bucket, second.key)
    checked = await archive.check(c)
    assert not checked.ok
    assert any(first.key in p and "do not hash" in p for p in checked.problems), checked.problems
    assert any(second.key in p and "missing" in p for p in checked.problems), checked.problems


async def test_one_run_at_a_time_and_never_into_another_streams_archive(stack: Container) -> None:
    c = stack
    await appended(c, "s-1", 2)
    async with await psycopg.AsyncConnection.connect(c.settings.database_url, autocommit=True) as other:
        held = f"chronicle-archive:{c.layout.stream}"
        await other.execute("SELECT pg_advisory_lock(hashtext(%s))", (held,))
        with pytest.raises(ArchiveBusy):
            await archive.archive(c)
        # given back here: a closed connection's backend releases its locks when it has ended,
        # which the client does not wait for (the next run found it still held, now and then)
        await other.execute("SELECT pg_advisory_unlock(hashtext(%s))", (held,))
    done = await archive.archive(c)  # the lock is free again
    assert done.events == 2
    manifest = parse_manifest(await manifest_of(c))
    store = c.context.skills
    assert store is not None
    recreated = manifest.model_copy(update={"stream_created": manifest.stream_created.replace(year=2020)})
    await store.put_bytes(
        c.settings.archive_bucket, manifest_key(c.layout.stream), recreated.model_dump_json().encode()
    )
    with pytest.raises(ArchiveError, match="another stream"):
        await archive.archive(c)


async def test_the_command_archives_then_checks_and_fails_a_check_that_finds_problems(stack: Container) -> None:
    c = stack
    await appended(c, "s-1", 4)
    done = await asyncio.to_thread(cli, c.settings, "--segment-events", "3")
    assert done.returncode == 0, done.stderr
    assert "archived 4 events in 2 segments" in done.stdout
    checked = await asyncio.to_thread(cli, c.settings, "--check")
    assert checked.returncode == 0, checked.stderr
    assert "4 equal to the stream's; 0 problems" in checked.stdout
    store = c.context.skills
    assert store is not None
    manifest = parse_manifest(await manifest_of(c))
    await store.delete(c.settings.archive_bucket, manifest.segments[0].key)
    failed = await asyncio.to_thread(cli, c.settings, "--check")
    assert failed.returncode == 1
    assert "missing" in failed.stdout
    refused = await asyncio.to_thread(cli, c.settings, "--segment-events", "0")
    assert refused.returncode == 2
    assert "at least 1" in refused.stderr


async def _rewrite(c: Container, index: int, events: list[StoredEvent]) -> None:
    """Segment ``index`` replaced by these events, its manifest entry made to match them."""
    store = c.context.skills
    assert store is not None
    bucket = c.settings.archive_bucket
    manifest = parse_manifest(await manifest_of(c))
    data = encode(events)
    old = manifest.segments[index]
    manifest.segments[index] = segment_of(old.key, events, data)
    await store.put_bytes(bucket, old.key, data)
    await store.put_bytes(bucket, manifest_key(c.layout.stream), manifest.model_dump_json().encode())


async def test_the_check_finds_an_event_changed_missing_from_the_stream_a_gap_and_a_stray_object(
    stack: Container,
) -> None:
    c = stack
    await appended(c, "s-1", 9)
    await archive.archive(c, segment_events=3)
    store = c.context.skills
    assert store is not None
    bucket = c.settings.archive_bucket
    manifest = parse_manifest(await manifest_of(c))
    first = manifest.segments[0]
    data = await store.get_bytes(bucket, first.key)
    assert data is not None
    events = decode(data, first)
    changed = [events[0], replace(events[1], data=events[1].data.replace(b"message 1", b"message X")), events[2]]
    await _rewrite(c, 0, changed)
    last = manifest.segments[-1]
    tail = await store.get_bytes(bucket, last.key)
    assert tail is not None
    beyond = replace(decode(tail, last)[-1], seq=last.last + 100)  # a sequence the stream never had
    await _rewrite(c, len(manifest.segments) - 1, [*decode(tail, last), beyond])
    stray = segment_key(c.layout.stream, 500, 600)
    await store.put_bytes(bucket, stray, b"left by a stopped run")
    checked = await archive.check(c)
    problems = "\n".join(checked.problems)
    assert f"sequence {events[1].seq}: the archived event differs" in problems
    assert f"sequence {last.last + 100} archived but missing from the stream" in problems
    assert f"segment object {stray} is not in the manifest" in problems

    manifest = parse_manifest(await manifest_of(c))
    del manifest.segments[1]
    await store.put_bytes(bucket, manifest_key(c.layout.stream), manifest.model_dump_json().encode())
    gap = await archive.check(c)
    assert any("a gap" in p for p in gap.problems), gap.problems


async def _three_segments(c: Container) -> tuple[int, list[Segment]]:
    """The stream's events archived in three segments of at least three events each: its last
    sequence and the segments."""
    await appended(c, "s-1", 9)
    end = await eventlog.last_seq(c.js, c.layout)
    await archive.archive(c, segment_events=-(-end // 3))
    manifest = parse_manifest(await manifest_of(c))
    assert (len(manifest.segments), manifest.last_seq) == (3, end)
    return end, manifest.segments


async def _events_of(c: Container, segment: Segment) -> list[StoredEvent]:
    store = c.context.skills
    assert store is not None
    data = await store.get_bytes(c.settings.archive_bucket, segment.key)
    assert data is not None
    return decode(data, segment)


async def _listing(c: Container, segments: list[Segment]) -> None:
    """The manifest rewritten to list these segments."""
    store = c.context.skills
    assert store is not None
    manifest = parse_manifest(await manifest_of(c)).model_copy(update={"segments": segments})
    await store.put_bytes(c.settings.archive_bucket, manifest_key(c.layout.stream), manifest.model_dump_json().encode())


async def test_a_clean_archive_checks_whole_equal_and_level_with_the_stream(stack: Container) -> None:
    c = stack
    end, _ = await _three_segments(c)
    checked = await archive.check(c)
    assert checked.ok, checked.problems
    assert (checked.segments, checked.events, checked.compared, checked.notes) == (3, end, end, [])
    assert checked.reach == f"the archive reaches the stream's last sequence {end}"


async def test_an_event_dropped_from_a_segment_with_its_manifest_entry_fixed_is_a_problem(stack: Container) -> None:
    c = stack
    end, segments = await _three_segments(c)
    middle = segments[1]
    events = await _events_of(c, middle)
    dropped = events[1].seq  # inside the range: first, last and order still hold
    await _rewrite(c, 1, [e for e in events if e.seq != dropped])  # sha256, bytes, count made to match
    checked = await archive.check(c)
    assert checked.problems == [f"sequence {dropped} in the stream but missing from the archive ({middle.key})"]
    assert (checked.events, checked.compared) == (end - 1, end - 1)
    done = await asyncio.to_thread(cli, c.settings, "--check")
    assert done.returncode == 1, done.stdout
    assert f"problem: sequence {dropped} in the stream but missing from the archive" in done.stdout
    assert f"{end - 1} equal to the stream's; 1 problems" in done.stdout


async def test_a_middle_segment_dropped_with_its_manifest_entry_is_a_gap(stack: Container) -> None:
    c = stack
    end, segments = await _three_segments(c)
    store = c.context.skills
    assert store is not None
    first, middle, last = segments
    await store.delete(c.settings.archive_bucket, middle.key)
    await _listing(c, [first, last])
    checked = await archive.check(c)
    assert checked.problems == [
        f"segment {last.key} starts at {last.first}, after {first.last}: a gap; the stream holds "
        f"{middle.count} of sequences {middle.first}..{middle.last}, which no segment archives"
    ]
    assert checked.reach == f"the archive reaches the stream's last sequence {end}"
    overlapping = last.model_copy(update={"first": middle.last})  # an edit that makes segments overlap
    await _listing(c, [first, middle, overlapping])
    overlap = await archive.check(c)
    assert any("overlap" in p for p in overlap.problems), overlap.problems


async def test_the_last_segment_dropped_with_its_manifest_entry_is_an_archive_behind_not_a_problem(
    stack: Container,
) -> None:
    c = stack
    end, segments = await _three_segments(c)
    store = c.context.skills
    assert store is not None
    await store.delete(c.settings.archive_bucket, segments[2].key)
    await _listing(c, segments[:2])
    checked = await archive.check(c)
    assert checked.ok, checked.problems
    behind = end - segments[1].last
    assert checked.reach == (
        f"the archive reaches sequence {segments[1].last}; the stream's last is {end}: {behind} behind "
        "(the next `chronicle archive` adds them)"
    )
    done = await asyncio.to_thread(cli, c.settings, "--check")
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip().splitlines()[-2:] == [
        checked.reach,
        f"digest through sequence {segments[1].last}: {segments[1].last}:{checked.digests[segments[1].last]}",
    ]


async def test_an_archive_claiming_more_than_the_stream_holds_is_a_problem(stack: Container) -> None:
    c = stack
    end, segments = await _three_segments(c)
    store = c.context.skills
    assert store is not None
    template = (await _events_of(c, segments[2]))[-1]
    invented = [replace(template, seq=end + k) for k in (1, 2, 3)]
    data = encode(invented)
    key = segment_key(c.layout.stream, end + 1, end + 3)
    await store.put_bytes(c.settings.archive_bucket, key, data)
    await _listing(c, [*segments, segment_of(key, invented, data)])
    checked = await archive.check(c)
    assert checked.problems == [
        f"the manifest claims sequences up to {end + 3}; the stream's last is {end}",
        f"sequences {end + 1}..{end + 3} archived but missing from the stream (its last is {end})",
    ]
    assert checked.reach == f"the archive claims up to sequence {end + 3}, beyond the stream's last {end}"
    done = await asyncio.to_thread(cli, c.settings, "--check")
    assert done.returncode == 1, done.stdout


async def test_a_run_deletes_what_a_stopped_run_left_unlisted_and_cuts_segments_by_bytes(stack: Container) -> None:
    c = stack
    await appended(c, "s-1", 3)
    store = c.context.skills
    assert store is not None
    stray = segment_key(c.layout.stream, 1, 7)  # a stopped run's segment, never listed
    await store.put_bytes(c.settings.archive_bucket, stray, b"partial")
    done = await archive.archive(c, segment_bytes=1)  # every event is over a byte: one a segment
    assert (done.segments, done.events) == (3, 3)
    assert await store.get_bytes(c.settings.archive_bucket, stray) is None
    checked = await archive.check(c)
    assert checked.ok, checked.problems


async def test_the_check_refuses_the_archive_of_another_stream_of_the_same_name(stack: Container) -> None:
    c = stack
    await appended(c, "s-1", 2)
    await archive.archive(c)
    manifest = parse_manifest(await manifest_of(c))
    store = c.context.skills
    assert store is not None
    earlier = manifest.model_copy(update={"stream_created": manifest.stream_created.replace(year=2020)})
    await store.put_bytes(c.settings.archive_bucket, manifest_key(c.layout.stream), earlier.model_dump_json().encode())
    checked = await archive.check(c)
    assert checked.compared == 0
    assert any("another stream" in p for p in checked.problems), checked.problems


async def test_the_command_says_it_could_not_run_when_object_storage_does_not_answer(stack: Container) -> None:
    c = stack
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = c.settings.model_copy(update={"s3_endpoint": f"127.0.0.1:{port}"})
    done = await asyncio.to_thread(cli, down)
    assert done.returncode == 2, done.stderr
    assert "chronicle archive:" in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_command_without_the_operator_identity_says_so_in_one_line(stack: Container) -> None:
    stranger = stack.settings.model_copy(update={"nats_nkey_seed": SecretStr(new_operator_seed())})
    done = await asyncio.to_thread(cli, stranger, "--check")
    assert done.returncode == UNREACHABLE_EXIT, done.stderr
    assert f"chronicle archive: NATS at {stack.settings.nats_url}:" in done.stderr
    assert "operator identity" in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_run_writes_a_deleted_segment_again_and_the_check_then_passes(stack: Container) -> None:
    c = stack
    _, segments = await _three_segments(c)
    store = c.context.skills
    assert store is not None
    bucket, middle = c.settings.archive_bucket, segments[1]
    before = await store.get_bytes(bucket, middle.key)
    await store.delete(bucket, middle.key)
    assert not (await archive.check(c)).ok
    done = await asyncio.to_thread(cli, c.settings)
    assert done.returncode == 0, done.stderr
    assert f"wrote again missing segment {middle.key} (sequences {middle.first}..{middle.last})" in done.stdout
    assert await store.get_bytes(bucket, middle.key) == before
    checked = await asyncio.to_thread(cli, c.settings, "--check")
    assert checked.returncode == 0, checked.stdout
    assert "0 problems" in checked.stdout


async def test_a_deleted_segment_the_stream_no_longer_holds_fails_every_run_in_one_line(stack: Container) -> None:
    c = stack
    end, segments = await _three_segments(c)
    store = c.context.skills
    assert store is not None
    first = segments[0]
    await store.delete(c.settings.archive_bucket, first.key)
    info = await c.js.stream_info(c.layout.stream)
    info.config.max_msgs = end - first.last  # the stream's limits drop the first segment's events
    await c.js.update_stream(info.config)
    assert (await c.js.stream_info(c.layout.stream)).state.first_seq == first.last + 1
    await appended(c, "s-1", 2, start=9)
    line = (
        f"chronicle archive: the archive lost sequences {first.first}..{first.last} (segment {first.key}): the "
        f"stream no longer holds them all (its first sequence is {first.last + 3}); they cannot be archived again "
        "(`chronicle archive --check` names the gap; `chronicle archive --accept-lost FIRST-LAST` accepts a range "
        "the stream no longer holds as lost)"
    )
    done = await asyncio.to_thread(cli, c.settings)
    assert done.returncode == 1, done.stdout
    assert done.stderr.splitlines() == [line]
    assert f"the archive now ends at sequence {end + 2}" in done.stdout  # what came since is archived still
    assert await store.get_bytes(c.settings.archive_bucket, first.key) is None
    again = await asyncio.to_thread(cli, c.settings)
    assert (again.returncode, again.stderr.splitlines()) == (1, [line])

    accepted = await asyncio.to_thread(cli, c.settings, "--accept-lost", f"{first.first}-{first.last}")
    assert accepted.returncode == 0, accepted.stderr
    assert f"sequences {first.first}..{first.last}: accepted as lost" in accepted.stdout
    assert first not in parse_manifest(await manifest_of(c)).segments  # its entry leaves with the loss
    after = await asyncio.to_thread(cli, c.settings)
    assert (after.returncode, after.stderr) == (0, "")
    checked = await asyncio.to_thread(cli, c.settings, "--check")
    assert checked.returncode == 0, checked.stdout
    assert f"note: sequences {first.first}..{first.last}: accepted as lost on " in checked.stdout
    twice = await asyncio.to_thread(cli, c.settings, "--accept-lost", f"{first.first}-{first.last}")
    assert (twice.returncode, twice.stdout.strip()) == (
        0,
        f"sequences {first.first}..{first.last}: already accepted as lost; nothing changed",
    )


async def test_a_run_fills_a_range_whose_segment_was_dropped_with_its_manifest_entry(stack: Container) -> None:
    c = stack
    end, segments = await _three_segments(c)
    store = c.context.skills
    assert store is not None
    first, middle, last = segments
    for gone in (first, middle):
        await store.delete(c.settings.archive_bucket, gone.key)
    await _listing(c, [last])
    info = await c.js.stream_info(c.layout.stream)
    info.config.max_msgs = end - first.first  # the stream no longer holds the first event
    await c.js.update_stream(info.config)
    done = await archive.archive(c, segment_events=100)
    assert [(s.first, s.last) for s in done.repaired] == [(first.first + 1, middle.last)]
    assert (done.segments, done.lost, done.lost_holes) == (0, (), ((first.first, first.first),))
    manifest = parse_manifest(await manifest_of(c))
    assert [(s.first, s.last) for s in manifest.segments] == [(first.first + 1, middle.last), (last.first, last.last)]
    checked = await archive.check(c)
    assert checked.problems == [
        f"sequence {first.first}: no segment archives them and the stream no longer holds them (its first "
        f"sequence is {first.first + 1}): lost"
    ]
    assert checked.compared == end - 1
    assert await accept_lost(c, first.first, first.first) is not None
    accepted = await archive.check(c)
    assert accepted.ok, accepted.problems
    assert len(accepted.notes) == 1
    assert accepted.notes[0].startswith(f"sequence {first.first}: accepted as lost on ")
    assert (await archive.archive(c)).lost_holes == ()


def _store(c: Container) -> SkillStore:
    store = c.context.skills
    assert store is not None
    return store


async def _drop_first(c: Container, end: int, first: Segment) -> None:
    """The stream's limits drop the events of the first segment (its first sequence then follows it)."""
    info = await c.js.stream_info(c.layout.stream)
    info.config.max_msgs = end - first.last
    await c.js.update_stream(info.config)
    assert (await c.js.stream_info(c.layout.stream)).state.first_seq == first.last + 1


async def test_a_run_lists_again_an_unlisted_segment_that_is_the_only_copy_of_its_events(stack: Container) -> None:
    c = stack
    end, segments = await _three_segments(c)
    store, (first, middle, last) = _store(c), segments
    kept = await store.get_bytes(c.settings.archive_bucket, first.key)
    await _listing(c, [middle, last])  # its entry dropped, its object still in the bucket
    await _drop_first(c, end, first)
    done = await asyncio.to_thread(cli, c.settings)
    assert done.returncode == 0, done.stderr
    assert f"listed again segment {first.key} (sequences {first.first}..{first.last})" in done.stdout
    assert await store.get_bytes(c.settings.archive_bucket, first.key) == kept
    assert parse_manifest(await manifest_of(c)).segments == segments
    checked = await asyncio.to_thread(cli, c.settings, "--check")
    assert checked.returncode == 0, checked.stdout
    assert "0 problems" in checked.stdout


async def test_an_unlisted_segment_that_does_not_read_as_its_key_says_is_kept_and_its_hole_reported(
    stack: Container,
) -> None:
    c = stack
    end, segments = await _three_segments(c)
    store, (first, middle, last) = _store(c), segments
    await store.put_bytes(c.settings.archive_bucket, first.key, b"garbage")
    await _listing(c, [middle, last])
    await _drop_first(c, end, first)
    done = await asyncio.to_thread(cli, c.settings)
    assert done.returncode == 1, done.stdout
    assert f"kept segment object {first.key}, which the manifest does not list: segment {first.key}: not gzip'd" in (
        done.stdout
    )
    assert done.stderr.splitlines() == [
        f"chronicle archive: the archive lost sequences {first.first}..{first.last} (no segment): the stream no "
        f"longer holds them all (its first sequence is {first.last + 1}); they cannot be archived again "
        "(`chronicle archive --check` names the gap; `chronicle archive --accept-lost FIRST-LAST` accepts a range "
        "the stream no longer holds as lost)"
    ]
    assert await store.get_bytes(c.settings.archive_bucket, first.key) == b"garbage"
    with pytest.raises(ArchiveError, match="which the manifest does not list"):
        await accept_lost(c, first.first, first.last)  # that object may be all there is: looked at first


async def test_accept_lost_refuses_what_is_not_a_hole_the_stream_no_longer_holds(stack: Container) -> None:
    c = stack
    end, segments = await _three_segments(c)
    store, (first, middle, last) = _store(c), segments
    await store.delete(c.settings.archive_bucket, first.key)
    await _drop_first(c, end, first)
    before = await manifest_of(c)
    refusals = {
        (first.first, first.last - 1): f"segment {first.key} is missing; accept its whole range",
        (middle.first, middle.last): f"the stream holds sequences from {middle.first}",
        (last.last + 1, last.last + 2): f"the archive reaches sequence {last.last}",
    }
    for (low, high), said in refusals.items():
        with pytest.raises(ArchiveError, match=re.escape(said)):
            await accept_lost(c, low, high)
    await store.put_bytes(c.settings.archive_bucket, first.key, b"back")
    with pytest.raises(ArchiveError, match=re.escape(f"segment {first.key} is in the bucket, so not lost")):
        await accept_lost(c, first.first, first.last)
    assert await manifest_of(c) == before
    for given in ("x", "3-", "0-2", "5-3"):
        refused = await asyncio.to_thread(cli, c.settings, "--accept-lost", given)
        assert refused.returncode == 2, refused.stdout
        assert len(refused.stderr.splitlines()) == 1
        assert "--accept-lost" in refused.stderr
    held = await asyncio.to_thread(cli, c.settings, "--accept-lost", f"{middle.first}-{middle.last}")
    assert held.returncode == 2, held.stdout
    assert held.stderr.startswith(f"chronicle archive: sequences {middle.first}..{middle.last}: the stream holds")
    assert await manifest_of(c) == before


async def test_a_segment_another_zlib_compressed_is_written_again_from_its_events_and_its_entry_updated(
    stack: Container,
) -> None:
    c = stack
    _, segments = await _three_segments(c)
    store, middle = _store(c), segments[1]
    events = await _events_of(c, middle)
    ours = await store.get_bytes(c.settings.archive_bucket, middle.key)
    assert ours is not None
    theirs = gzip.compress(gzip.decompress(ours), compresslevel=1, mtime=0)  # as another zlib build would
    assert theirs != ours
    await _listing(c, [segments[0], segment_of(middle.key, events, theirs), segments[2]])
    await store.delete(c.settings.archive_bucket, middle.key)
    done = await asyncio.to_thread(cli, c.settings)
    assert done.returncode == 0, done.stderr
    assert f"wrote again missing segment {middle.key}" in done.stdout
    assert await store.get_bytes(c.settings.archive_bucket, middle.key) == ours
    assert parse_manifest(await manifest_of(c)).segments == segments  # the entry hashes the bytes written
    checked = await archive.check(c)
    assert checked.ok, checked.problems


async def test_a_run_lists_the_segment_objects_by_key_without_a_request_per_object(
    stack: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = stack
    _, segments = await _three_segments(c)
    store = _store(c)
    described = await store.list(c.settings.archive_bucket, f"{c.layout.stream}/segments/")

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("a HEAD request per segment")

    monkeypatch.setattr(store._client, "stat_object", refused)
    keys = await archive.segment_objects(store, c.settings.archive_bucket, c.layout.stream)
    assert keys == {o.key for o in described} == {s.key for s in segments}
    await store.delete(c.settings.archive_bucket, segments[1].key)
    done = await archive.archive(c)
    assert done.repaired == (segments[1],)


async def test_an_archive_begun_after_the_stream_dropped_its_first_events_reports_them_lost(stack: Container) -> None:
    c = stack
    await appended(c, "s-1", 9)
    end = await eventlog.last_seq(c.js, c.layout)
    info = await c.js.stream_info(c.layout.stream)
    info.config.max_msgs = end - 3
    await c.js.update_stream(info.config)
    done = await asyncio.to_thread(cli, c.settings)
    assert done.returncode == 1, done.stdout
    assert f"the archive now ends at sequence {end}" in done.stdout
    assert done.stderr.startswith("chronicle archive: the archive lost sequences 1..3 (no segment): the stream no ")
    accepted = await asyncio.to_thread(cli, c.settings, "--accept-lost", "1-3")
    assert accepted.returncode == 0, accepted.stderr
    again = await asyncio.to_thread(cli, c.settings)
    assert (again.returncode, again.stderr) == (0, "")


async def test_archiving_a_stream_that_never_held_an_event_makes_nothing_and_says_so(stack: Container) -> None:
    """(The run said it archived 0 events and that the archive ended at sequence 0, and `--check`
    right after it said the bucket held no archive of the stream: a problem, exit 1.)"""
    c, settings = stack, stack.settings
    assert await eventlog.last_seq(c.js, c.layout) == 0
    run = cli(settings)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        f"nothing to archive: stream {settings.stream!r} has never held an event; no archive made in bucket "
        f"{settings.archive_bucket!r}"
    ]
    checked = cli(settings, "--check")
    assert checked.returncode == 0, (checked.stdout, checked.stderr)
    assert checked.stdout.splitlines() == [
        f"note: stream {settings.stream!r} has never held an event: nothing to archive, so no archive yet",
        "checked 0 segments, 0 events; 0 equal to the stream's; 0 problems",
    ]
    await appended(c, "s-1", 1)  # now there is something, and no archive of it: a problem until a run
    assert (await archive.check(c)).problems == [
        f"bucket {settings.archive_bucket!r} holds no archive of stream {settings.stream!r}"
    ]
    assert (await archive.archive(c)).events == 1
    assert (await archive.check(c)).ok


async def test_a_digest_kept_by_an_auditor_proves_the_archive_through_its_sequence_unchanged(stack: Container) -> None:
    """``--check`` prints the archive's digest through its last sequence; ``--check --anchor`` with
    a digest kept from an earlier check passes while the archive through that sequence is what it
    was, and names the anchor once a segment there was rewritten with its manifest entry made to
    match (what an operator who controls the bucket could do), however the rest compares."""
    c = stack
    end, segments = await _three_segments(c)
    first = await asyncio.to_thread(cli, c.settings, "--check")
    assert first.returncode == 0, first.stdout
    [line] = [x for x in first.stdout.splitlines() if x.startswith("digest through sequence")]
    anchor = line.split(": ", 1)[1]
    assert anchor.startswith(f"{end}:")
    middle = segments[1].last
    digest_middle = (await archive.check(c)).digests[middle]
    await appended(c, "s-1", 3, start=9)  # archived later: the anchors through earlier sequences hold
    await archive.archive(c, segment_events=3)
    for kept in (anchor, f"{middle}:{digest_middle}"):
        again = await asyncio.to_thread(cli, c.settings, "--check", "--anchor", kept)
        assert again.returncode == 0, again.stdout
    events = await _events_of(c, segments[0])
    forged = [events[0], *events[1:-1], dataclasses.replace(events[-1], data=b'{"forged": true}')]
    await _rewrite(c, 0, forged)
    tampered = await asyncio.to_thread(cli, c.settings, "--check", "--anchor", f"{middle}:{digest_middle}")
    assert tampered.returncode == 1, tampered.stdout
    assert f"problem: anchor {middle}: the archive through sequence {middle} is not what it was" in tampered.stdout
    nowhere = await asyncio.to_thread(cli, c.settings, "--check", "--anchor", f"{middle + 1}:{digest_middle}")
    assert (
        f"problem: anchor {middle + 1}: no segment that could be read ends at sequence {middle + 1}" in nowhere.stdout
    )
    for bad in (("--anchor", anchor), ("--check", "--anchor", "12:nothex"), ("--check", "--anchor", "0:" + "a" * 64)):
        refused = await asyncio.to_thread(cli, c.settings, *bad)
        assert refused.returncode == 2, (bad, refused.stdout)
        assert "--anchor goes with --check and takes SEQ:DIGEST" in refused.stderr
