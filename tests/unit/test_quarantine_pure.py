"""Pure cores around quarantine: screening, storable text, backoff, partition tokens, readiness."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from events.catalog import SessionErased
from events.ids import TENANT_SCOPE
from events.sealing import StaticKeys
from events.subjects import SubjectLayout, partition_of
from projections.quarantine import (
    Quarantined,
    Tombstone,
    body_names,
    named_session,
    refused_sessions,
    screen,
    storable_text,
    subject_erased,
    subject_owner,
    tombstone_erased,
    tombstone_refused,
)
from projections.runner import retry_delay
from services.api.metrics import (
    REGISTRY,
    Snapshot,
    assess,
    compactor_reasons,
    export_lags,
    projector_checkpoints,
    suspects,
)
from tests.integration.helpers import appended

LAYOUT = SubjectLayout(partitions=4)
NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def test_screen_admits_or_makes_the_quarantine_item_with_the_raw_bytes() -> None:
    event = appended("tenant-a", "s-1", "m1", None)
    subject = LAYOUT.session_subject("tenant-a", "s-1")
    assert screen(7, subject, event.to_json(), LAYOUT) == (7, event)
    refused = screen(8, subject, b"not json", LAYOUT)
    assert refused == Quarantined(8, subject, "not_json", refused.detail, b"not json")  # type: ignore[union-attr]


def test_screen_tombstones_a_refused_event_under_an_erased_sessions_subject_whatever_its_bytes_say() -> None:
    keys = StaticKeys()
    keys.erase("tenant-a", "s-1")
    subject = LAYOUT.session_subject("tenant-a", "s-1")
    other = appended("tenant-a", "s-2", "m1", None).to_json()  # names another session: the subject decides
    assert screen(8, subject, b"{bad marker", LAYOUT, keys) == Tombstone(8, subject)
    assert screen(9, subject, other, LAYOUT, keys) == Tombstone(9, subject)
    part = partition_of("tenant-a", "s-1", 4)
    for other_part in range(4):  # its ids under any partition token (and any other token) are its
        wrong = subject.replace(f".p{part:03d}.", f".p{other_part:03d}.")
        assert screen(10, wrong, b"{bad marker", LAYOUT, keys) == Tombstone(10, wrong)
    odd = subject.replace(f".p{part:03d}.", ".p9999.")
    assert screen(10, odd, b"{bad marker", LAYOUT, keys) == Tombstone(10, odd)
    decided_without_the_session = [
        f"{LAYOUT.prefix}.tenant-a.nosession",  # the tenant scope's (not erased here)
        f"{LAYOUT.prefix}.tenant-a.p000.s-1.more",
        LAYOUT.session_subject("tenant-a", "s-2"),  # a live session
        LAYOUT.session_subject("tenant-b", "s-1"),  # the same session id, another tenant
        f"{LAYOUT.prefix}-x.tenant-a.p000.s-1",  # another prefix
    ]
    for other_subject in decided_without_the_session:
        refused = screen(10, other_subject, b"{bad marker", LAYOUT, keys)
        assert isinstance(refused, Quarantined), other_subject
        assert refused.raw == b"{bad marker"


def test_the_subject_owner_is_the_session_under_any_partition_token_else_the_tenant_scope() -> None:
    """Pure, from the subject alone: a session's ids under any middle token are the session's; any
    other subject under a tenant's prefix is the tenant scope's (erased last by a tenant erasure);
    a subject under no tenant's prefix is nobody's. Tokens are exact: no look-alike maps to a tenant."""
    p = LAYOUT.prefix
    assert subject_owner(LAYOUT.session_subject("tenant-a", "s-1"), LAYOUT) == ("tenant-a", "s-1")
    assert subject_owner(f"{p}.tenant-a.p003.s-1", LAYOUT) == ("tenant-a", "s-1")
    assert subject_owner(f"{p}.tenant-a.p003.~cyAx", LAYOUT) == ("tenant-a", "s 1")
    assert subject_owner(f"{p}.tenant_a.p000.s-1", LAYOUT) == ("tenant_a", "s-1")
    assert subject_owner(LAYOUT.session_subject("tenant-a", TENANT_SCOPE), LAYOUT) == ("tenant-a", TENANT_SCOPE)
    for scoped in [
        f"{p}.tenant-a.nosession",
        f"{p}.tenant-a.p000.s-1.more",
        f"{p}.tenant-a.p000.~cyAx=",  # not canonical
        f"{p}.tenant-a.p000.~AA",  # a NUL: no session id
        f"{p}.tenant-a.p000.~_w",  # not UTF-8
        f"{p}.tenant-a.p000.~Lw",  # '/': no session id
        f"{p}.tenant-a.p000.a:b",  # a plain token that is no canonical encoding (its own: ~YTpi)
        f"{p}.tenant-a.p000.hé",
        f"{p}.tenant-a.p000.ab\x00c",  # a NUL in the subject, and as the table stores it, escaped
        f"{p}.tenant-a.p000.ab\\x00c",
    ]:
        assert subject_owner(scoped, LAYOUT) == ("tenant-a", TENANT_SCOPE), scoped
    for nobodys in [f"{p}.tenant-a", f"{p}.~dGVuYW50LWE.p000.s", f"{p}.=.p000.s", "other.tenant-a.p000.s", p]:
        assert subject_owner(nobodys, LAYOUT) is None, nobodys
    keys = StaticKeys()
    keys.erase("tenant-a", TENANT_SCOPE)  # a tenant erasure's last step
    assert subject_erased(f"{p}.tenant-a.nosession", LAYOUT, keys)
    assert not subject_erased(f"{p}.tenant-a.p000.s-1", LAYOUT, keys)  # its own session decides
    assert not subject_erased(f"{p}.tenant-ab.nosession", LAYOUT, keys)
    assert not subject_erased(f"{p}.tenant_a.nosession", LAYOUT, keys)


def test_screen_tombstones_a_stray_whose_bytes_name_an_erased_session_on_any_subject() -> None:
    """A stray (refused on another session's subject, or on another partition's token) whose JSON
    names an erased session is a tombstone, escaped or not; one naming a live session of the same
    tenant, or bytes that name no session, are quarantined with their raw bytes."""
    keys = StaticKeys()
    keys.erase("tenant-a", "s-1")
    stray = json.loads(appended("tenant-a", "s-1", "m1", None).to_json())
    live_subject = LAYOUT.session_subject("tenant-a", "s-2")
    part = partition_of("tenant-a", "s-1", 4)
    own = LAYOUT.session_subject("tenant-a", "s-1")
    wrong_part = own.replace(f".p{part:03d}.", f".p{(part + 1) % 4:03d}.")
    escaped = json.dumps(stray).replace('"s-1"', '"\\u0073-1"').encode()
    assert named_session(live_subject, escaped, LAYOUT) == ("tenant-a", "s-1")
    for subject, data in [
        (live_subject, json.dumps(stray).encode()),  # subject_mismatch: another session's subject
        (wrong_part, json.dumps(stray).encode()),  # subject_mismatch: another partition's token
        (wrong_part, json.dumps({**stray, "version": 99}).encode()),
        (live_subject, escaped),
    ]:
        assert screen(5, subject, data, LAYOUT, keys) == Tombstone(5, subject), (subject, data)
    kept = [
        json.dumps({**stray, "session": "s-2"}).encode(),  # names a live session of the tenant
        json.dumps({**stray, "tenant": "tenant-b"}).encode(),  # the same session id, another tenant
        json.dumps([stray]).encode(),  # not an object
        json.dumps({**stray, "session": ["s-1"]}).encode(),  # not a string
        json.dumps(stray).encode()[:-1],  # cut
        b"[" * 100_000,  # nested past the parser's depth: no RecursionError
    ]
    live_part = partition_of("tenant-a", "s-2", 4)
    live_wrong = live_subject.replace(f".p{live_part:03d}.", f".p{(live_part + 1) % 4:03d}.")
    for data in kept:
        refused = screen(6, live_wrong, data, LAYOUT, keys)
        assert isinstance(refused, Quarantined), data[:80]
        assert refused.raw == data
        assert screen(6, wrong_part, data, LAYOUT, keys) == Tombstone(6, wrong_part)  # the erased one's ids
    assert screen(6, live_wrong, kept[0], LAYOUT) == screen(6, live_wrong, kept[0], LAYOUT, keys)
    assert isinstance(screen(7, wrong_part, json.dumps(stray).encode(), LAYOUT), Quarantined)  # no keys: as before


def test_refusals_of_a_session_erased_since_they_were_screened_are_tombstones_the_rest_kept() -> None:
    """A stray (and a refusal under the session's subject) screened before the erasure is learned
    is a tombstone once it is, as :func:`screen` decides then; a live session's and one naming no
    session stay; the sessions asked about are each subject's and each stray's."""
    keys = StaticKeys()
    own = LAYOUT.session_subject("tenant-a", "s-1")
    live = LAYOUT.session_subject("tenant-a", "s-2")
    data = appended("tenant-a", "s-1", "m1", None).to_json()
    items = [screen(1, live, data, LAYOUT, keys), screen(2, own, b"{bad", LAYOUT, keys)]
    items += [screen(3, live, b"{bad", LAYOUT, keys), screen(4, f"{LAYOUT.prefix}.x", b"{bad", LAYOUT, keys)]
    refused = [q for q in items if isinstance(q, Quarantined)]
    assert len(refused) == 4
    assert refused_sessions(refused, LAYOUT) == {("tenant-a", "s-1"), ("tenant-a", "s-2")}
    assert tombstone_refused(refused, LAYOUT, keys) == (refused, [])
    keys.erase("tenant-a", "s-1")
    assert tombstone_refused(refused, LAYOUT, keys) == (refused[2:], [1, 2])
    assert [screen(q.seq, q.subject, q.raw, LAYOUT, keys) for q in refused[:2]] == [
        Tombstone(1, live),
        Tombstone(2, own),
    ]


def test_body_names_is_exactly_the_named_tenant_and_session_when_postgres_can_hold_them() -> None:
    assert body_names(json.dumps({"tenant": "t", "session": "s"}).encode()) == ("t", "s")
    assert body_names(json.dumps({"tenant": "t", "session": "s" * 128}).encode()) == ("t", "s" * 128)
    for data in [
        b"\xff\xfe",  # not UTF-8
        json.dumps({"tenant": "t"}).encode(),
        json.dumps({"tenant": "t", "session": "s" * 129}).encode(),  # no session id: no index entry
        json.dumps({"tenant": "t", "session": "a\x00b"}).encode(),  # a NUL: no Postgres text
        b'{"tenant": "t", "session": "\\ud800"}',  # a lone surrogate: no UTF-8
        json.dumps({"tenant": "t t", "session": "s"}).encode(),  # no tenant id
        json.dumps({"tenant": "t" * 65, "session": "s"}).encode(),
    ]:
        assert body_names(data) is None, data


def test_body_names_reads_the_bytes_as_migration_031_reads_them() -> None:
    """Strict UTF-8 JSON, as Postgres's ``convert_from(raw, 'UTF8')::jsonb``: no byte-order mark,
    no other encoding, no NaN; a number of any length is a number (Python's int conversion refused
    one of over 4,300 digits, where Postgres names the row)."""
    body = {"tenant": "t", "session": "s"}
    for data in [
        b"\xef\xbb\xbf" + json.dumps(body).encode(),  # a UTF-8 byte-order mark
        json.dumps(body).encode("utf-16"),
        b'{"tenant": "t", "session": "s", "x": NaN}',
    ]:
        assert body_names(data) is None, data
    assert body_names(b'{"tenant": "t", "session": "s", "n": ' + b"9" * 5000 + b"}") == ("t", "s")


def test_one_refusals_bytes_are_parsed_once_for_its_several_decisions() -> None:
    data = json.dumps({"tenant": "t", "session": f"once-{datetime.now(UTC).timestamp()}"}).encode()
    before = body_names.cache_info()
    for _ in range(5):
        body_names(data)
    after = body_names.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 4)


def test_named_session_is_a_session_of_the_tenant_whose_subject_the_bytes_were_stored_on() -> None:
    """A tenant publishes only on its own subjects: bytes naming another tenant's session name
    nothing (whether that session is erased must not show in this tenant's quarantine)."""
    data = json.dumps({"tenant": "tenant-a", "session": "s-1"}).encode()
    assert named_session(LAYOUT.session_subject("tenant-a", "s-2"), data, LAYOUT) == ("tenant-a", "s-1")
    assert named_session(LAYOUT.session_subject("tenant-b", "s-1"), data, LAYOUT) is None
    assert named_session(f"{LAYOUT.prefix}.tenant-a.nosession", data, LAYOUT) is None  # no session subject


def test_a_refused_event_naming_another_tenants_erased_session_is_quarantined_with_its_bytes() -> None:
    keys = StaticKeys()
    keys.erase("tenant-a", "s-1")
    stray = appended("tenant-a", "s-1", "m1", None).to_json()
    for subject in [LAYOUT.session_subject("tenant-b", "s-1"), LAYOUT.session_subject("tenant-b", "s-2")]:
        refused = screen(6, subject, stray, LAYOUT, keys)
        assert isinstance(refused, Quarantined), subject
        assert refused.raw == stray
        assert tombstone_refused([refused], LAYOUT, keys) == ([refused], [])
        assert refused_sessions([refused], LAYOUT) == {LAYOUT.parse(subject)}  # only its subject's asked about


def test_events_of_a_session_erased_since_they_were_screened_are_tombstones_but_its_erasure_stays() -> None:
    keys = StaticKeys()
    kept = appended("tenant-a", "s-1", "m1", None)
    before = appended("tenant-a", "s-2", "m1", None)
    erased = SessionErased(tenant="tenant-a", session="s-2")
    items = [(1, kept), (2, before), (3, erased)]
    assert tombstone_erased(items, keys) == (items, [])  # nothing erased: nothing changes
    keys.erase("tenant-a", "s-2")  # its session.erased, screened later in the batch, was learned
    assert tombstone_erased(items, keys) == ([(1, kept), (3, erased)], [2])


def test_storable_text_escapes_what_postgres_text_cannot_hold_and_bounds_it() -> None:
    assert storable_text("a\x00b\ud800c") == "a\\x00b\\ud800c"
    assert len(storable_text("x" * 10_000)) == 500


def test_retry_delay_doubles_up_to_the_cap() -> None:
    assert [retry_delay(n, 0.1, 1.0) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert retry_delay(10_000, 0.1, 30.0) == 30.0


def test_partition_token_is_read_from_the_subject_not_recomputed() -> None:
    subject = LAYOUT.session_subject("tenant-a", "s-1")
    part = partition_of("tenant-a", "s-1", 4)
    assert LAYOUT.partition_token(subject) == part
    wrong = subject.replace(f".p{part:03d}.", f".p{(part + 1) % 4:03d}.")
    assert LAYOUT.partition_token(wrong) == (part + 1) % 4
    odd = ["chronicle.ev.t.p004.s", "chronicle.ev.t.p1.s", "chronicle.ev.t.x.s", "chronicle.ev.t.p000", "x.t.p000.s"]
    for subject in odd:
        assert LAYOUT.partition_token(subject) is None


def snap(last: int, **points: tuple[int, float]) -> Snapshot:
    return Snapshot(last, {n: (seq, NOW - timedelta(seconds=ago)) for n, (seq, ago) in points.items()}, NOW, {})


def test_ready_when_caught_up_however_long_ago_the_last_move() -> None:
    assert assess(snap(10, projector=(10, 3600)), "projector", 1, stall_s=60, max_lag=100) == ([], 0)


def test_a_consumer_that_has_not_moved_while_events_wait_is_a_reason() -> None:
    reasons, lag = assess(snap(12, projector=(10, 61)), "projector", 1, stall_s=60, max_lag=100)
    assert lag == 2
    assert len(reasons) == 1
    assert "projector" in reasons[0]
    assert "not advanced" in reasons[0]
    assert assess(snap(12, projector=(10, 5)), "projector", 1, stall_s=60, max_lag=100) == ([], 2)


def test_lag_past_the_threshold_is_a_reason() -> None:
    reasons, lag = assess(snap(500, projector=(100, 1)), "projector", 1, stall_s=60, max_lag=100)
    assert lag == 400
    assert reasons == ["projection lag 400 is past the threshold 100"]


def test_before_any_projector_ran_nothing_can_be_said() -> None:
    assert assess(snap(50, compactor=(0, 999)), "projector", 1, stall_s=60, max_lag=10) == ([], None)


def test_partition_checkpoints_replace_the_single_one_once_all_report() -> None:
    fresh = {f"projector.p{p:03d}": (10, 1.0) for p in range(2)}
    stale_single = snap(10, projector=(3, 999), **fresh)
    assert set(projector_checkpoints(stale_single.checkpoints, "projector", 2)) == set(fresh)
    assert assess(stale_single, "projector", 2, stall_s=60, max_lag=100) == ([], 0)
    half = snap(10, projector=(3, 999), **{"projector.p000": (10, 1.0)})
    assert set(projector_checkpoints(half.checkpoints, "projector", 2)) == {"projector", "projector.p000"}


def test_the_lag_exported_is_the_serving_checkpoints_not_a_retired_layouts() -> None:
    """After a switch from one projector to partition workers the single checkpoint stays where it
    stopped: its lag grew with every append (in ``/metrics`` and ``/readyz``'s ``lag``), a false
    alarm for good, while readiness already left it out."""
    single = snap(10, projector=(8, 1.0))
    assert export_lags(single, "projector", 2) == {"projector": 2}
    lag = {"projector": "projector"}
    assert REGISTRY.get_sample_value("chronicle_projection_lag", lag) == 2
    fresh = {f"projector.p{p:03d}": (30, 1.0) for p in range(2)}
    assert export_lags(snap(30, projector=(10, 999), **fresh), "projector", 2) == dict.fromkeys(fresh, 0)
    assert REGISTRY.get_sample_value("chronicle_projection_lag", lag) is None
    assert REGISTRY.get_sample_value("chronicle_events_applied", lag) is None
    assert REGISTRY.get_sample_value("chronicle_projection_lag", {"projector": "projector.p001"}) == 0


def test_a_projector_that_never_applied_anything_is_a_stall_once_events_have_waited_long_enough() -> None:
    waited = NOW - timedelta(seconds=61)
    reasons, lag = assess(snap(7), "projector", 1, stall_s=60, max_lag=100, unapplied_since=waited)
    assert lag == 7
    assert reasons == ["projector projector has applied nothing for 61s with 7 events waiting"]
    recent = NOW - timedelta(seconds=5)
    assert assess(snap(7), "projector", 1, stall_s=60, max_lag=100, unapplied_since=recent) == ([], 7)
    assert assess(snap(0), "projector", 1, stall_s=60, max_lag=100, unapplied_since=waited) == ([], None)


def test_the_stall_clock_runs_from_when_events_began_to_wait_not_from_the_checkpoints_last_move() -> None:
    quiet_for_an_hour = snap(11, projector=(10, 3600))
    just_stored = {"projector": NOW - timedelta(milliseconds=5)}
    assert suspects(quiet_for_an_hour, "projector", 1, stall_s=60) == {"projector": 11}
    assert assess(quiet_for_an_hour, "projector", 1, stall_s=60, max_lag=100, waiting_since=just_stored) == ([], 1)
    waited = {"projector": NOW - timedelta(seconds=61)}
    reasons, lag = assess(quiet_for_an_hour, "projector", 1, stall_s=60, max_lag=100, waiting_since=waited)
    assert (lag, reasons) == (1, ["consumer projector has not advanced for 61s with 1 events waiting"])


def test_a_backlog_older_than_the_threshold_is_no_stall_while_the_checkpoint_moves() -> None:
    moving = snap(500, projector=(100, 1))
    long_waiting = {"projector": NOW - timedelta(hours=2)}
    assert suspects(moving, "projector", 1, stall_s=60) == {}
    assert assess(moving, "projector", 1, stall_s=60, max_lag=1000, waiting_since=long_waiting) == ([], 400)


def test_only_checkpoints_behind_and_idle_past_the_threshold_are_suspects() -> None:
    points = {"projector.p000": (10, 3600.0), "projector.p001": (12, 3600.0), "projector.p002": (9, 5.0)}
    assert suspects(snap(12, **points), "projector", 3, stall_s=60) == {"projector.p000": 11}


def test_no_compactor_is_a_reason_only_where_one_is_required() -> None:
    assert compactor_reasons(2, required=True) == []
    assert compactor_reasons(0, required=False) == []
    (reason,) = compactor_reasons(0, required=True)
    assert reason.startswith("no compactor is running")
    assert "CHRONICLE_READINESS_COMPACTOR=false" in reason
