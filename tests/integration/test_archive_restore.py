"""``chronicle archive --restore``: the log made again from its archive after its NATS data was
lost, the read models rebound to it, and the archive continued on it; refused into a stream that
holds events and from an archive that is not whole. Real NATS, Postgres, S3 (moto), and the CLI
as a process."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from nats.js.errors import NotFoundError

from events import log as eventlog
from events.blobs import BlobRef, refs_in
from events.catalog import MessageAppended, SessionErased
from events.context import CompactionConfig, SessionConfig
from events.credentials import nkey_public_key
from events.log import StoredEvent
from events.omitted import OMITTED
from events.stream import DUPLICATE_WINDOW_S, ensure_stream
from events.subjects import SubjectLayout
from projections.logbinding import Binding, read_binding
from services.audit import archive
from services.audit import readers as audit
from services.audit.archive_segments import Segment, decode, encode, manifest_key, parse_manifest, segment_of
from services.bootstrap import Container, open_container
from services.ops.natsconf import NatsAccess
from services.settings import Settings
from tests.conftest import OPERATOR_SEED, make_settings, operator_nats, running_stack
from tests.integration.helpers import text_message
from tests.support import chronicle_cli, nats_server

T = "tenant-a"


@pytest.fixture
def settings(nats_url: str, fresh_db: str, s3_endpoint: str, request: pytest.FixtureRequest) -> Settings:
    """The stack's settings; claim-checked bodies in the JetStream object store, or in S3 when the
    test is given ``"s3"`` (``indirect``)."""
    return make_settings(
        nats_url,
        fresh_db,
        s3_endpoint=s3_endpoint,
        archive_bucket=f"archive-{fresh_db[-8:]}",
        claim_check_bucket=f"bodies-{fresh_db[-8:]}",
        claim_check_store=getattr(request, "param", "nats"),
        encryption=True,
        payload_limit_bytes=1024,
    )


def restore_cli(settings: Settings) -> subprocess.CompletedProcess[str]:
    return chronicle_cli(settings, "archive", "--restore", timeout=25)


Stored = list[tuple[int, str, bytes, dict[str, str] | None]]


async def _stored(settings: Settings) -> Stored:
    async with open_container(settings, log_check=False, create_stream=False) as c:
        return [(e.seq, e.subject, e.data, e.headers) async for e in eventlog.read(c.js, c.layout)]


async def _delete_stream(settings: Settings, *, objects: bool = False) -> None:
    """The log's stream lost (with ``objects``, the JetStream object store's bucket too)."""
    async with open_container(settings, log_check=False, create_stream=False) as c:
        await c.js.delete_stream(c.layout.stream)
        if objects:
            await c.js.delete_object_store(settings.blob_bucket)


async def _exists(settings: Settings) -> bool:
    async with open_container(settings, log_check=False, create_stream=False, absent_stream=True) as c:
        try:
            await c.js.stream_info(c.layout.stream)
        except NotFoundError:
            return False
        return True


@pytest.fixture
async def archived(settings: Settings) -> Stored:
    """A stack's log with sealed events, a compaction, a claim-checked body and an erasure (of a
    session with a claim-checked body of its own, which the erasure deletes), archived in segments
    of 5; yields the events as the stream stored them."""
    async with running_stack(settings) as c:
        config = SessionConfig(compaction=CompactionConfig(protect_head=1, tail_token_budget=10, min_tail_messages=2))
        await c.context.configure(T, "kept", config)
        for i in range(12):
            await c.commands.append(T, "kept", text_message(f"m{i}", f"message {i} " + "lorem " * 20), OMITTED)
        assert (await c.compaction.compact(T, "kept")).overlay is not None
        await c.commands.append(T, "kept", text_message("big", "claim-checked " * 200), OMITTED)  # over 1024 B
        for i in range(5):
            await c.commands.append(T, "gone", text_message(f"g{i}", f"to be erased {i}"), OMITTED)
        await c.commands.append(T, "gone", text_message("gbig", "erased with its body " * 100), OMITTED)
        erased = await c.eraser.erase_session(T, "gone")
        last = await eventlog.last_seq(c.js, c.layout)
        await c.waiter.wait_session(T, "kept", last)
        await c.waiter.wait_session(T, "gone", erased.seq)
        await archive.archive(c, segment_events=5)
    return await _stored(settings)


async def test_a_lost_log_is_restored_rebound_verified_and_archived_on(settings: Settings, archived: Stored) -> None:
    await _delete_stream(settings)
    done = restore_cli(settings)
    assert done.returncode == 0, done.stderr
    assert f"restored {len(archived)} events" in done.stdout
    assert "rebound projector" in done.stdout
    assert re.search(
        r"claim-checked bodies in the JetStream object store bucket .*: the restored events reference 2, none "
        r"missing \(and 1 of erased sessions, deleted by their erasure: expected\)",
        done.stdout,
    ), done.stdout
    assert await _stored(settings) == archived  # every event as it was: sequence, subject, bytes, headers

    async with running_stack(settings) as c:  # the binding names the restored stream: the stack starts
        async with c.pool.connection() as conn:
            bound = await read_binding(conn, settings.projector_name)
        assert bound is not None
        assert bound.created == (await c.js.stream_info(c.layout.stream)).created
        report = await audit.verify(c)
        assert report.ok, report.differences
        more = await c.commands.append(T, "kept", text_message("after", "after the restore"), OMITTED)
        await c.waiter.wait_session(T, "kept", more.seq)
        assert more.seq == len(archived) + 1

        added = await archive.archive(c, segment_events=10)  # continues after the last archived sequence
        assert (added.events, added.last_seq) == (1, more.seq)
        checked = await archive.check(c)
        assert checked.ok, checked.problems
        assert (checked.events, checked.compared) == (more.seq, more.seq)
        assert any("restored from this archive" in n for n in checked.notes), checked.notes

    check = chronicle_cli(settings, "archive", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{more.seq} equal to the stream's; 0 problems" in check.stdout


async def _delete_body(settings: Settings, archived: Stored, session: str = "kept") -> str:
    """The object of the claim-checked body of ``session`` deleted where it is stored; its key."""
    kept = settings.layout().session_subject(T, session)
    (ref,) = [r for _, subject, data, _ in archived if subject == kept for r in refs_in(data)]
    async with open_container(settings, log_check=False, create_stream=False) as c:
        await c.blobs.delete(ref)
    return ref.key


@pytest.mark.parametrize("settings", ["nats", "s3"], indirect=True)
async def test_a_restore_whose_events_reference_a_missing_body_says_which_and_exits_1(
    settings: Settings, archived: Stored
) -> None:
    """Every event is restored, but a claim-checked body one of them references is gone (the
    JetStream object store lost with the log, or an object deleted from S3): the restore says which
    store lacks how many of them, names them, and exits 1 (it said `… missing here` and exited 0,
    and an operator took the restore for whole). The erased session's body, which its erasure
    deleted, is expected gone and not counted."""
    key = await _delete_body(settings, archived)
    await _delete_stream(settings)

    done = restore_cli(settings)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"restored {len(archived)} events" in done.stdout
    assert await _stored(settings) == archived  # the log itself is whole
    where = (
        f"in the JetStream object store bucket {settings.blob_bucket!r}"
        if settings.claim_check_store == "nats"
        else f"in S3 bucket {settings.claim_check_bucket!r}"
    )
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"chronicle archive: restored, but not whole: 1 of 1 claim-checked bodies {where} are missing: {key} (sequence "
    ), lines[0]
    assert "and 1 of erased sessions, deleted by their erasure: expected" in done.stdout, done.stdout


async def _tenants_own(settings: Settings, publish: Callable[[Container], Awaitable[int]]) -> Stored:
    """What ``publish`` writes after the fixture's log (returning its last sequence), applied by
    the projector and archived; the events as the stream stored them."""
    async with running_stack(settings) as c:
        await c.waiter.wait_all(await publish(c))
        await archive.archive(c, segment_events=5)
    return await _stored(settings)


async def test_a_tenants_own_erasure_does_not_excuse_its_sessions_missing_body(
    settings: Settings, archived: Stored
) -> None:
    """A tenant publishes a ``session.erased`` of its own session on its own subject (no proof,
    nothing recorded): the projector quarantines it (``unrecorded_erasure``) and the session stays
    live, so its body, lost, is missing: the restore names it and exits 1 (it counted it as an
    erased session's, expected gone, and exited 0 while the message was unreadable)."""

    async def forged(c: Container) -> int:
        await c.commands.append(T, "faked", text_message("fbig", "not erased at all " * 100), OMITTED)
        return (await c.publisher.publish(SessionErased(tenant=T, session="faked", reason="forged"))).seq

    key = await _delete_body(settings, await _tenants_own(settings, forged), "faked")
    await _delete_stream(settings)

    done = restore_cli(settings)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("chronicle archive: restored, but not whole: 1 of 2 claim-checked bodies "), line
    assert f"are missing: {key} (sequence " in line, line
    assert "and 1 of erased sessions, deleted by their erasure: expected" in done.stdout, done.stdout


async def test_a_tenants_refused_event_naming_a_made_up_object_is_said_apart_and_the_restore_is_whole(
    settings: Settings, archived: Stored
) -> None:
    """A tenant publishes on its own subject a raw event the contract refuses (quarantined), naming
    an object that never existed: it is said on a line of its own, as the tenant's refused events,
    and the restore exits 0 (it exited 1, "not whole", on every restore from then on)."""
    made_up = BlobRef(store="jetstream-object", key="0" * 64, sha256="0" * 64, size=10)
    event = MessageAppended(
        tenant=T, session="kept", message_id="x", parent_id=None, role="user", body_sha256="0" * 64, message_ref=made_up
    )
    raw = {**json.loads(event.to_json()), "not_in_the_contract": 1}

    async def refused(c: Container) -> int:
        return (await c.js.publish(settings.layout().session_subject(T, "kept"), json.dumps(raw).encode())).seq

    stored = await _tenants_own(settings, refused)
    await _delete_stream(settings)

    done = restore_cli(settings)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "refused events: 1 objects are referenced only by events the contract refuses (raw events a tenant published "
        f"itself, which the projector quarantines: `chronicle quarantine list`), 1 of them missing: {made_up.key} "
        f"(sequence {stored[-1][0]})"
    ) in done.stdout, done.stdout
    assert "the restored events reference 2, none missing" in done.stdout, done.stdout


async def test_a_restore_into_a_stream_that_holds_events_is_refused_in_one_line(
    settings: Settings, archived: Stored
) -> None:
    done = restore_cli(settings)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert f"last sequence {len(archived)}" in done.stderr
    assert "not empty" in done.stderr
    assert await _stored(settings) == archived


async def _get(settings: Settings, key: str) -> bytes:
    async with open_container(settings, log_check=False, create_stream=False, absent_stream=True) as c:
        assert c.context.skills is not None
        data = await c.context.skills.get_bytes(settings.archive_bucket, key)
    assert data is not None
    return data


async def _put(settings: Settings, objects: dict[str, bytes | None]) -> None:
    """Objects of the archive's bucket written (None: deleted)."""
    async with open_container(settings, log_check=False, create_stream=False, absent_stream=True) as c:
        store = c.context.skills
        assert store is not None
        for key, data in objects.items():
            if data is None:
                await store.delete(settings.archive_bucket, key)
            else:
                await store.put_bytes(settings.archive_bucket, key, data)


async def test_a_restore_from_an_archive_with_a_gap_or_a_changed_segment_publishes_nothing(
    settings: Settings, archived: Stored
) -> None:
    key = manifest_key(settings.stream)
    original = await _get(settings, key)
    manifest = parse_manifest(original)
    second = manifest.segments[1]
    changed = await _get(settings, second.key)
    gap = manifest.model_copy(update={"segments": [manifest.segments[0], *manifest.segments[2:]]})
    await _put(settings, {second.key: None, key: gap.model_dump_json().encode()})
    await _delete_stream(settings)

    done = restore_cli(settings)
    assert done.returncode == 2, done.stdout
    assert "not whole" in done.stderr
    assert "are not archived" in done.stderr
    assert not await _exists(settings)  # nothing made, nothing published

    await _put(settings, {second.key: changed[:-1] + bytes([changed[-1] ^ 1]), key: original})
    tampered = restore_cli(settings)
    assert tampered.returncode == 2
    assert "do not hash to the manifest's sha256" in tampered.stderr
    assert not await _exists(settings)

    await _put(settings, {second.key: changed})
    async with open_container(settings, absent_stream=True, create_stream=False, log_check=False) as c:
        await ensure_stream(c.js, c.layout)  # an empty stream (the services started meanwhile) takes a restore
    whole = restore_cli(settings)
    assert whole.returncode == 0, whole.stderr
    assert await _stored(settings) == archived


async def test_a_restore_under_another_partition_count_is_refused_naming_one_that_fits(
    settings: Settings, archived: Stored
) -> None:
    """Each session subject's partition token comes from the count the log was written with:
    restored under another, the projector would refuse the events filed elsewhere and new ones
    would go to other subjects. Nothing is made; the count the message names places every event."""
    layout = settings.layout()
    sessions = {subject for _, subject, _, _ in archived if layout.placed(subject) is not None}

    def misplaced(n: int) -> int:
        return sum(not replace(layout, partitions=n).placed(s) for s in sessions)

    other = next(n for n in (1, 2, 3, 5, 6, 7) if misplaced(n) * 2 > len(sessions))
    await _delete_stream(settings)
    done = restore_cli(settings.model_copy(update={"partitions": other}))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().count("\n") == 0
    assert f"{misplaced(other)} of the archive's {len(sessions)} session subjects" in done.stderr
    assert f"CHRONICLE_PARTITIONS={other} puts them" in done.stderr
    named = re.search(r"\((\d+) partitions place them all\)", done.stderr)
    assert named is not None, done.stderr
    assert misplaced(int(named[1])) == 0
    assert not await _exists(settings)  # nothing made, nothing published
    assert restore_cli(settings).returncode == 0  # under the log's own count
    assert await _stored(settings) == archived


async def test_an_archive_behind_the_read_models_is_restored_but_not_rebound(
    settings: Settings, archived: Stored
) -> None:
    key = manifest_key(settings.stream)
    manifest = parse_manifest(await _get(settings, key))
    last = manifest.segments[-1]
    behind = manifest.model_copy(update={"segments": manifest.segments[:-1]})
    await _put(settings, {last.key: None, key: behind.model_dump_json().encode()})  # the last run never archived
    bound = await _binding(settings)
    await _delete_stream(settings, objects=True)

    done = restore_cli(settings)
    assert done.returncode == 1, done.stderr  # the bodies went with the object store
    assert f"sequences 1..{last.first - 1}" in done.stdout
    assert re.search(r"restored, but not whole: (\d+) of \1 claim-checked bodies", done.stderr), done.stderr
    assert f"read models: not rebound: checkpoint {settings.projector_name!r} is at sequence {len(archived)}" in (
        done.stdout
    )
    assert "`chronicle rebuild`" in done.stdout
    assert await _stored(settings) == archived[: last.first - 1]
    assert await _binding(settings) == bound  # left as it was


async def test_read_models_bound_to_another_log_are_not_rebound(settings: Settings, archived: Stored) -> None:
    async with open_container(settings, log_check=False, create_stream=False) as c, c.pool.connection() as conn:
        await conn.execute(
            "UPDATE log_binding SET stream_created = stream_created - interval '1 day' WHERE projector = %s",
            (settings.projector_name,),
        )
    bound = await _binding(settings)
    await _delete_stream(settings)
    done = restore_cli(settings)
    assert done.returncode == 0, done.stderr
    assert "read models: not rebound" in done.stdout
    assert "not to the archived stream" in done.stdout
    assert await _binding(settings) == bound


async def _binding(settings: Settings) -> Binding | None:
    async with open_container(settings, log_check=False, create_stream=False) as c, c.pool.connection() as conn:
        return await read_binding(conn, settings.projector_name)


def _same_id_as_before(events: list[StoredEvent]) -> list[StoredEvent]:
    """The second event under the first's ``Nats-Msg-Id`` (as two events published further apart
    than the duplicate window would be stored)."""
    first, second = events[0], events[1]
    assert first.headers is not None
    assert second.headers is not None
    return [
        first,
        replace(second, headers={**second.headers, "Nats-Msg-Id": first.headers["Nats-Msg-Id"]}),
        *events[2:],
    ]


def _expecting_another(events: list[StoredEvent]) -> list[StoredEvent]:
    """The second event published with an expectation the restored stream does not meet."""
    second = events[1]
    headers = {**(second.headers or {}), "Nats-Expected-Last-Subject-Sequence": "999"}
    return [events[0], replace(second, headers=headers), *events[2:]]


async def _forge_first_segment(settings: Settings, forged: Callable[[list[StoredEvent]], list[StoredEvent]]) -> None:
    """The archive's first segment rewritten by ``forged`` (its manifest entry to match), the stream deleted."""
    key = manifest_key(settings.stream)
    manifest = parse_manifest(await _get(settings, key))
    first = manifest.segments[0]
    data = encode(forged(decode(await _get(settings, first.key), first)))
    events = decode(data, segment_of(first.key, decode(data, _unchecked(first, data)), data))
    rewritten = manifest.model_copy(update={"segments": [segment_of(first.key, events, data), *manifest.segments[1:]]})
    await _put(settings, {first.key: data, key: rewritten.model_dump_json().encode()})
    await _delete_stream(settings)


async def test_a_log_holding_one_id_twice_is_restored_whole(settings: Settings, archived: Stored) -> None:
    """The log stored an id twice (published again past the duplicate window: a client's late
    retry, or a tenant on purpose): republished seconds apart, the stream took the second for a
    duplicate and the restore stopped there, every time (a tenant could make the backup useless).
    The restore narrows the duplicate window for it, and sets it back."""
    await _forge_first_segment(settings, _same_id_as_before)
    done = restore_cli(settings)
    assert done.returncode == 0, done.stdout + done.stderr
    nc = await operator_nats(settings.nats_url)
    try:
        info = await nc.jetstream().stream_info(settings.stream)
        assert info.state.last_seq == parse_manifest(await _get(settings, manifest_key(settings.stream))).last_seq
        assert info.config.duplicate_window == DUPLICATE_WINDOW_S
    finally:
        await nc.close()


@pytest.mark.parametrize(("forged", "said"), [(_expecting_another, "the stream refused it")])
async def test_a_restore_the_stream_does_not_ack_as_archived_stops_at_that_event_and_says_so(
    settings: Settings, archived: Stored, forged: Callable[[list[StoredEvent]], list[StoredEvent]], said: str
) -> None:
    key = manifest_key(settings.stream)
    await _forge_first_segment(settings, forged)

    done = restore_cli(settings)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"restore stopped at archived sequence 2: {said}" in done.stderr
    assert "The stream holds sequences 1..1 of the archive" in done.stderr
    assert "delete the stream before restoring again" in done.stderr
    assert parse_manifest(await _get(settings, key)).restorations == []  # the archive still names the lost stream


def _unchecked(segment: Segment, data: bytes) -> Segment:
    """``segment`` with the hash of ``data`` (to read back forged bytes)."""
    return segment.model_copy(update={"sha256": hashlib.sha256(data).hexdigest(), "content_sha256": None})


async def test_a_restore_from_a_bucket_without_the_archive_or_with_to_seq_is_refused_and_makes_nothing(
    settings: Settings,
) -> None:
    async with running_stack(settings):
        pass  # the stack's database and log, nothing archived
    await _delete_stream(settings)
    done = restore_cli(settings)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"chronicle archive: bucket {settings.archive_bucket!r} holds no archive of stream {settings.stream!r}"
    )
    assert not await _exists(settings)
    partial = chronicle_cli(settings, "archive", "--restore", "--to-seq", "5")
    assert partial.returncode == 2
    assert "no --to-seq" in partial.stderr
    both = chronicle_cli(settings, "archive", "--restore", "--check")
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr
    assert not await _exists(settings)


@pytest.fixture
def drill_nats(tmp_path: Path) -> Iterator[str]:
    """Another nats-server (the operator identity only): where a restore drill makes the log again
    while the archived stream lives on."""
    with nats_server(tmp_path, NatsAccess((nkey_public_key(OPERATOR_SEED),), SubjectLayout())) as url:
        yield url


async def test_a_restore_drill_on_another_nats_server_leaves_the_archive_to_the_live_stream(
    settings: Settings, archived: Stored, drill_nats: str, backup: Callable[[str], str]
) -> None:
    """`--restore --drill` restores the whole log elsewhere (a drill, an auditor's copy) and writes
    nothing to the archive: the live stream keeps archiving into it and `--check` stays clean (a
    restore without it made the archive the restored stream's, and every later `chronicle archive`
    of the live stream exited 2)."""
    manifest = await _get(settings, manifest_key(settings.stream))
    drill = settings.model_copy(update={"nats_url": drill_nats, "database_url": backup(settings.database_url)})
    done = chronicle_cli(drill, "archive", "--restore", "--drill", timeout=25)
    # a claim-checked body stays in the live server's object store: the drill's copy lacks it
    assert done.returncode == 1, done.stderr
    assert "restored, but not whole: 1 of 1 claim-checked bodies in the JetStream object store" in done.stderr
    assert f"restored {len(archived)} events" in done.stdout
    assert "a drill: the archive is left as it was" in done.stdout
    assert "rebound projector" in done.stdout  # the drill's copy of the database follows its log
    assert await _stored(drill) == archived
    assert await _get(settings, manifest_key(settings.stream)) == manifest  # not one byte changed

    async with running_stack(settings) as c:  # the live stack goes on, and so does its archive
        more = await c.commands.append(T, "kept", text_message("after", "after the drill"), OMITTED)
        await c.waiter.wait_session(T, "kept", more.seq)
    run = chronicle_cli(settings, "archive")
    assert run.returncode == 0, run.stderr
    assert f"the archive now ends at sequence {more.seq}" in run.stdout
    check = chronicle_cli(settings, "archive", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{more.seq} equal to the stream's; 0 problems" in check.stdout

    refused = chronicle_cli(drill, "archive")  # the drill's stream is not archived there
    assert refused.returncode == 2
    assert "holds the archive of another stream" in refused.stderr
    alone = chronicle_cli(settings, "archive", "--drill")
    assert alone.returncode == 2
    assert alone.stderr.strip() == "chronicle archive: --drill goes with --restore"


async def test_a_live_stream_whose_archive_a_restore_elsewhere_took_says_so_and_reclaims_it(
    settings: Settings, archived: Stored, drill_nats: str, backup: Callable[[str], str]
) -> None:
    """A restore made elsewhere without `--drill` takes the archive over: the live stream's runs
    and checks say that restore did it and name `--reclaim`, which gives the archive back once
    (refused, nothing changed, while the restored stream has archived events of its own into it,
    and when there is nothing to reclaim)."""
    drill = settings.model_copy(update={"nats_url": drill_nats, "database_url": backup(settings.database_url)})
    done = chronicle_cli(drill, "archive", "--restore", timeout=25)
    assert done.returncode == 1, done.stderr  # restored, but the claim-checked body stayed in the live server
    assert f"restored {len(archived)} events" in done.stdout

    run = chronicle_cli(settings, "archive")
    assert run.returncode == 2
    assert "made that stream from this stream's archive" in run.stderr
    assert "`chronicle archive --reclaim`" in run.stderr
    check = chronicle_cli(settings, "archive", "--check")
    assert check.returncode == 1
    assert "`chronicle archive --reclaim`" in check.stdout
    assert "reaches" not in check.stdout  # how far another stream's archive reaches says nothing of this one

    async with running_stack(drill) as c:  # the restored stream archives an event of its own there
        more = await c.commands.append(T, "kept", text_message("drill", "written in the drill"), OMITTED)
        await c.waiter.wait_session(T, "kept", more.seq)
    assert chronicle_cli(drill, "archive").returncode == 0
    taken = await _get(settings, manifest_key(settings.stream))
    refused = chronicle_cli(settings, "archive", "--reclaim")
    assert refused.returncode == 2
    assert f"has archived sequence {more.seq} into bucket" in refused.stderr
    assert await _get(settings, manifest_key(settings.stream)) == taken

    manifest = parse_manifest(taken)  # the drill's segment dropped by hand: only the restoration stands
    drills = [s.key for s in manifest.segments if s.last > len(archived)]
    manifest.segments = [s for s in manifest.segments if s.last <= len(archived)]
    await _put(settings, {manifest_key(settings.stream): manifest.model_dump_json().encode(), **dict.fromkeys(drills)})
    back = chronicle_cli(settings, "archive", "--reclaim")
    assert back.returncode == 0, back.stderr
    assert "is this stream's again" in back.stdout
    check = chronicle_cli(settings, "archive", "--check")
    assert f"{len(archived)} equal to the stream's; 0 problems" in check.stdout
    again = chronicle_cli(settings, "archive", "--reclaim")
    assert again.returncode == 2
    assert "nothing to reclaim" in again.stderr
    assert chronicle_cli(drill, "archive", "--reclaim").returncode == 2  # the drill's stream took nothing
