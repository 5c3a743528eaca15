"""Replay, time travel, rebuild-and-swap and verify against a live stack."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg

from bench.support import settings_env
from events import log as eventlog
from events.omitted import OMITTED
from events.subjects import partition_of
from projections import queries
from projections.rebuild import checksums
from services.audit import readers as audit
from services.bootstrap import Container
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended, logged_message, text_message
from tests.support import chronicle_cli

T = "tenant-a"


async def _live_history(c: Container, sid: str, leaf: str | None = None) -> list[str]:
    async with c.pool.connection() as conn:
        if leaf is None:
            row = await queries.latest_leaf(conn, T, sid)
            leaf = row.id if row else None
        return [r.content for r in await queries.history(conn, T, sid, leaf)] if leaf else []


async def _script(c: Container, sid: str) -> list[tuple[int, list[str]]]:
    """Writes a branching history; returns (seq, live history at that point) after each write."""
    seen: list[tuple[int, list[str]]] = []

    async def snap(seq: int) -> None:
        await c.waiter.wait_session(T, sid, seq)
        seen.append((seq, await _live_history(c, sid)))

    for i in range(4):
        await snap((await c.commands.append(T, sid, text_message(f"m{i}", f"turn {i}"), OMITTED)).seq)
    await snap((await c.commands.append(T, sid, text_message("b1", "branch"), "m1")).seq)
    await snap((await c.commands.update(T, sid, text_message("m1", "turn one, edited"))).seq)
    await snap((await c.commands.delete_messages(T, sid, ["m2"])).seq)
    await snap((await c.commands.append(T, sid, text_message("m4", "after delete"), OMITTED)).seq)
    await snap((await c.commands.clear(T, sid)).seq)
    await snap((await c.commands.append(T, sid, text_message("n0", "fresh start"), OMITTED)).seq)
    return seen


async def test_history_as_of_any_sequence_matches_what_was_live(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("tt")
    seen = await _script(stack, sid)
    for seq, live in seen:
        state = await audit.session_as_of(stack, T, sid, seq)
        assert state.path(state.latest_leaf()) == live, f"as of {seq}"
    # branch-specific history as of a sequence
    seq_after_branch = seen[4][0]
    state = await audit.session_as_of(stack, T, sid, seq_after_branch)
    assert [json.loads(m)["id"] for m in state.path("m3")] == ["m0", "m1", "m2", "m3"]
    assert [json.loads(m)["id"] for m in state.path("b1")] == ["m0", "m1", "b1"]


async def test_replay_cli_prints_the_events_in_order(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("replay")
    for i in range(3):
        await stack.commands.append(T, sid, text_message(f"m{i}", f"hello {i}"), OMITTED)
    env = settings_env(stack.settings)
    cmd = [sys.executable, "-m", "services.ops.cli", "replay", "--tenant", T, "--session", sid]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    events = [json.loads(line) for line in out]
    assert [logged_message(e["event"]).message_id for e in events] == ["m0", "m1", "m2"]
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    stored = [datetime.fromisoformat(e["stored_at"]) for e in events]  # the stream's clock
    assert stored == sorted(stored)
    assert abs(stored[-1] - datetime.now(UTC)) < timedelta(minutes=1)
    table = subprocess.run(
        [*cmd, "--format", "table", "--from-seq", str(events[1]["seq"])],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert len(table) == 2
    assert "message.appended" in table[0]


async def test_replay_of_a_session_with_no_event_is_one_line_exit_1(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """As ``chronicle erase`` of a session the log does not hold: not found is exit 1, never an
    empty success that a typo in the id would also give."""
    sid = new_id("nope")
    done = chronicle_cli(stack.settings, "replay", "--tenant", T, "--session", sid)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.strip().splitlines() == [
        f"chronicle replay: no event of session {sid!r} of tenant {T!r} in the log: nothing to replay"
    ]


async def test_replay_finds_a_sessions_events_that_arrived_on_another_partitions_subject(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """An event of the session published on a subject with another partition token (a newer
    version, too) is quarantined ``subject_mismatch``, and replay shows it among the session's
    own, in order; a session whose only event went astray is found too (not 'no event')."""
    layout = stack.layout

    def astray(sid: str, mid: str) -> tuple[str, bytes]:
        own = layout.session_subject(T, sid)
        part = partition_of(T, sid, layout.partitions)
        wrong = own.replace(f".p{part:03d}.", f".p{(part + 1) % layout.partitions:03d}.")
        event = json.loads(appended(T, sid, mid, None).to_json())
        return wrong, json.dumps({**event, "version": 99}).encode()

    sid, lone = new_id("astray"), new_id("astray-only")
    before = await stack.commands.append(T, sid, text_message("m0", "own subject"), OMITTED)
    wrong, data = astray(sid, "m1")
    stray = await stack.js.publish(wrong, data, stream=stack.settings.stream)
    after = await stack.commands.append(T, sid, text_message("m2", "own again"), "m0")
    lone_subject, lone_data = astray(lone, "x1")
    lone_stray = await stack.js.publish(lone_subject, lone_data, stream=stack.settings.stream)
    await stack.waiter.wait_all(max(after.seq, lone_stray.seq), timeout_s=20)
    async with stack.pool.connection() as conn:
        cur = await conn.execute("SELECT reason FROM quarantine WHERE seq = ANY(%s)", ([stray.seq, lone_stray.seq],))
        assert [r for (r,) in await cur.fetchall()] == ["subject_mismatch", "subject_mismatch"]

    done = chronicle_cli(stack.settings, "replay", "--tenant", T, "--session", sid)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["seq"] for r in records] == [before.seq, stray.seq, after.seq]
    assert (records[1]["subject"], records[1]["refused"]["reason"]) == (wrong, "subject_mismatch")
    assert [sorted(r) for r in (records[0], records[2])] == [["event", "seq", "stored_at"]] * 2

    done = chronicle_cli(stack.settings, "replay", "--tenant", T, "--session", lone)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["seq"] for line in done.stdout.splitlines()] == [lone_stray.seq]
    done = chronicle_cli(
        stack.settings, "replay", "--tenant", T, "--session", lone, "--to-seq", str(lone_stray.seq - 1)
    )
    assert done.returncode == 1  # before it, the session has no event


async def test_history_as_of_a_sequence_past_the_log_is_one_line_exit_2_and_the_last_is_taken(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """As ``as_of_seq`` over HTTP: a sequence the log has not reached has no history yet (what it
    shows would change as the log grows), so it is refused, naming the last."""
    sid = new_id("asof")
    await stack.commands.append(T, sid, text_message("m0", "hello"), OMITTED)
    last = await eventlog.last_seq(stack.js, stack.layout)
    done = chronicle_cli(stack.settings, "history", "--tenant", T, "--session", sid, "--as-of-seq", str(last + 10))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.strip().splitlines() == [
        f"chronicle history: --as-of-seq {last + 10} is past the log's last sequence ({last}): no history as of it yet"
    ]
    done = chronicle_cli(stack.settings, "history", "--tenant", T, "--session", sid, "--as-of-seq", str(last))
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["id"] for line in done.stdout.splitlines()] == ["m0"]


async def test_history_of_an_erased_or_never_written_session_is_one_line_exit_1_never_empty(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """As ``chronicle replay``: an auditor's mistyped or erased session is said, not answered as a
    session with no messages (exit 0, nothing printed), now and as of a sequence."""
    sid, never = new_id("gone"), new_id("never")
    await stack.commands.append(T, sid, text_message("m0", "hello"), OMITTED)
    before = await eventlog.last_seq(stack.js, stack.layout)
    done = chronicle_cli(stack.settings, "history", "--tenant", T, "--session", sid, "--as-of-seq", str(before))
    assert (done.returncode, [json.loads(line)["id"] for line in done.stdout.splitlines()]) == (0, ["m0"])
    erased = chronicle_cli(stack.settings, "erase", "--tenant", T, "--session", sid, "--reason", "audit test")
    assert erased.returncode == 0, erased.stderr
    for extra in ([], ["--as-of-seq", str(before)]):
        done = chronicle_cli(stack.settings, "history", "--tenant", T, "--session", sid, *extra)
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(f"chronicle history: session {sid!r} of tenant {T!r} was erased at "), line
        done = chronicle_cli(stack.settings, "history", "--tenant", T, "--session", never, *extra)
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        assert done.stderr.strip().splitlines() == [
            f"chronicle history: no event of session {never!r} of tenant {T!r} in the log: no history"
        ]


async def test_history_now_of_a_deleted_session_is_one_line_exit_1_and_as_of_before_it_shows_it(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """A deleted session's read models are gone but its log is not: the history of now printed
    nothing and exited 0, as for a session that never held a message; it says it was deleted and
    how to read it as it was."""
    sid = new_id("deleted")
    await stack.commands.append(T, sid, text_message("m0", "hello"), OMITTED)
    before = await eventlog.last_seq(stack.js, stack.layout)
    gone = await stack.commands.delete_session(T, sid)
    await stack.waiter.wait_session(T, sid, gone.seq)
    done = chronicle_cli(stack.settings, "history", "--tenant", T, "--session", sid)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"chronicle history: session {sid!r} of tenant {T!r} was deleted at "), line
    assert "--as-of-seq" in line
    done = chronicle_cli(stack.settings, "history", "--tenant", T, "--session", sid, "--as-of-seq", str(before))
    assert (done.returncode, [json.loads(x)["id"] for x in done.stdout.splitlines()]) == (0, ["m0"])


async def test_history_of_a_leaf_the_session_does_not_hold_is_one_line_exit_1(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """``--leaf-id`` of no message of the session printed nothing and exited 0, as an empty path."""
    sid = new_id("noleaf")
    done_append = await stack.commands.append(T, sid, text_message("m0", "hello"), OMITTED)
    await stack.waiter.wait_session(T, sid, done_append.seq)
    seq = str(await eventlog.last_seq(stack.js, stack.layout))
    for extra, when in (((), ""), (("--as-of-seq", seq), f" as of sequence {seq}")):
        done = chronicle_cli(stack.settings, "history", "--tenant", T, "--session", sid, "--leaf-id", "nope", *extra)
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        assert done.stderr.strip() == (
            f"chronicle history: no message 'nope' in session {sid!r} of tenant {T!r}{when}: no path to show"
        )
        done = chronicle_cli(stack.settings, "history", "--tenant", T, "--session", sid, "--leaf-id", "m0", *extra)
        assert (done.returncode, [json.loads(x)["id"] for x in done.stdout.splitlines()]) == (0, ["m0"])


async def test_rebuild_swaps_in_identical_tables_and_projection_continues(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        await _script(c, "rb")
        async with c.pool.connection() as conn:
            before = await checksums(conn, "public")
        report = await audit.rebuild_and_swap(c)
        assert report.swapped_at_seq > 0
        async with c.pool.connection() as conn:
            assert await checksums(conn, "public") == before
            cur = await conn.execute(
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'rebuild_%%' OR nspname LIKE 'old_%%'"
            )
            assert await cur.fetchone() == (0,)
        r = await c.commands.append(T, "rb", text_message("after", "after the swap"), OMITTED)
        await c.waiter.wait_session(T, "rb", r.seq)
        assert json.loads((await _live_history(c, "rb"))[-1])["id"] == "after"
        ok = await audit.verify(c)
        assert ok.ok, ok.differences


async def test_verify_reports_a_tampered_read_model(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        await _script(c, "vf")
        assert (await audit.verify(c)).ok
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await conn.execute("UPDATE messages SET content = '{\"tampered\":true}' WHERE id = 'n0'")
        report = await audit.verify(c)
        assert not report.ok
        assert any("tampered" in line for line in report.differences["messages"])
        env = settings_env(settings)
        done = subprocess.run(
            [sys.executable, "-m", "services.ops.cli", "verify"], env=env, capture_output=True, text=True
        )
        assert done.returncode == 1
        assert "DIFFERENT" in done.stdout


async def _usage(c: Container) -> tuple[tuple[int, int, float, str | None], ...]:
    async with c.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT input_tokens, output_tokens, estimated_cost, end_reason FROM sessions "
            "WHERE tenant = %s AND id = 'us'",
            (T,),
        )
        return tuple(await cur.fetchall())


async def test_a_rebuild_sums_usage_as_live_did_and_verify_finds_a_tampered_counter(
    nats_url: str, fresh_db: str
) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        await c.commands.create_session(T, "us", "usage", None, {})
        for i in range(5):
            await c.commands.add_usage(T, "us", 10 + i, i, 0.1 * (i + 1))
        done = await c.commands.end_session(T, "us", "compaction")
        await c.waiter.wait_session(T, "us", done.seq)
        assert await _usage(c) == ((60, 10, 0.1 + 0.2 + 0.30000000000000004 + 0.4 + 0.5, "compaction"),)
        async with c.pool.connection() as conn:
            before = await checksums(conn, "public")
        await audit.rebuild_and_swap(c)
        async with c.pool.connection() as conn:
            assert await checksums(conn, "public") == before
        assert (await audit.verify(c)).ok
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            await conn.execute("UPDATE sessions SET input_tokens = input_tokens + 1 WHERE id = 'us'")
        report = await audit.verify(c)
        assert not report.ok
        assert report.differences["sessions"]


async def test_a_usage_counter_saturates_instead_of_halting_the_projector(nats_url: str, fresh_db: str) -> None:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c:
        made = await c.commands.create_session(T, "us", "", None, {})
        await c.waiter.wait_session(T, "us", made.seq)
        top = 2**63 - 1
        async with c.pool.connection() as conn:  # as if 9.2 million maximal additions came before
            await conn.execute("UPDATE sessions SET input_tokens = %s WHERE tenant = %s AND id = 'us'", (top - 5, T))
        await c.commands.add_usage(T, "us", 10**12, 3, 0.0)
        after = await c.commands.end_session(T, "us", "done")  # applied after it: nothing halted
        await c.waiter.wait_session(T, "us", after.seq)
        assert await _usage(c) == ((top, 3, 0.0, "done"),)
