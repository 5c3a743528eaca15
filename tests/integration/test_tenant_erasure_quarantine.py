"""A tenant's erasure leaves none of its refused events in ``quarantine``, on real NATS and Postgres:
those of a session that exists only through refused events (on its subject, or named by a stray's
bytes), those of a session's ids under another partition's token, and those on a subject of the
tenant that names no session (the tenant scope's, erased last). Live, after a rebuild and in a
verify alike; another tenant's refusals on look-alike subjects (a name ``_`` would match in a
``LIKE``, a name it starts) stay. A session's erasure deletes its refusals under any partition
token, and a session named only by a stray can be erased by its id."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
import pytest
from minio import Minio

from events.context import SessionConfig, SkillsBlock
from events.ids import TENANT_SCOPE
from events.subjects import partition_of
from services.audit import readers as audit
from services.audit.strays import strays
from services.bootstrap import Container
from services.settings import Settings
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import appended, text_message
from tests.integration.test_erased_quarantine import T, api, publish, quarantined, rebuilt_as_live, stored_anywhere
from tests.support import chronicle_cli

SECRET = b"tenant secret"


@pytest.fixture
def settings(nats_url: str, fresh_db: str) -> Settings:
    """A stream and a database of the test's own, two partitions."""
    return make_settings(nats_url, fresh_db, partitions=2)


def under(c: Container, tenant: str, session: str, token: str | None = None) -> str:
    """The session's subject, or its ids under partition token ``token``."""
    subject = c.layout.session_subject(tenant, session)
    if token is None:
        return subject
    return subject.replace(f".p{partition_of(tenant, session, c.layout.partitions):03d}.", f".{token}.")


def other_token(c: Container, tenant: str, session: str) -> str:
    """Another partition's token of the layout than the session's own."""
    return f"p{(partition_of(tenant, session, c.layout.partitions) + 1) % c.layout.partitions:03d}"


async def erased_sessions(conninfo: str, tenant: str) -> set[str]:
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute("SELECT session_id FROM erasures WHERE tenant = %s", (tenant,))
        return {str(r[0]) for r in await cur.fetchall()}


async def test_a_tenant_erasure_leaves_none_of_its_refused_events_and_no_look_alikes_are_touched(
    settings: Settings, fresh_db: str
) -> None:
    """(a) a session that exists only through refused events: raw bytes on its own subject
    (``ghostd``), and one only a stray's bytes name (``ghost2``); (b) a live session's ids under
    another partition's token (of the layout, and past it); (c) subjects of the tenant naming no
    session. Each was left by a tenant erasure before; none is now, its ghosts' erasures are
    recorded, and a rebuild and verify agree. Look-alike tenants keep every row."""
    h = uuid.uuid4().hex[:8]
    victim, wildcard_twin, longer = f"tq_{h}", f"tq-{h}", f"tq_{h}x"  # `_` is a LIKE wildcard
    async with running_stack(settings) as c:
        await c.commands.append(victim, "d1", text_message("m1", "live content"), None)
        p = c.layout.prefix
        gone = [
            await publish(c, under(c, victim, "ghostd"), SECRET + b" a: raw bytes of a ghost session"),
            await publish(c, under(c, victim, "ghostd"), appended(victim, "ghost2", "s1", None).to_json()),
            await publish(c, under(c, victim, "d1", other_token(c, victim, "d1")), SECRET + b" b: wrong partition"),
            await publish(c, under(c, victim, "d1", "p007"), SECRET + b" b: past the partitions"),
            await publish(c, f"{p}.{victim}.nosession", SECRET + b" c: no session"),
            await publish(c, f"{p}.{victim}.p000.d1.more", SECRET + b" c: four tokens"),
            await publish(c, f"{p}.{victim}.p000.~AA", SECRET + b" c: a NUL is no session id"),
            await publish(c, f"{p}.{victim}.p000.a:b", SECRET + b" c: not the canonical token of a:b"),
            await publish(c, f"{p}.{victim}.p000.h\u00e9", SECRET + b" c: nor a plain non-ASCII one"),
        ]
        kept = [
            await publish(c, f"{p}.{twin}.{rest}", SECRET + b" look-alike")
            for twin in (wildcard_twin, longer)
            for rest in ("nosession", "p007.d1", "p000.ghostd", f"{other_token(c, twin, 'd1')}.d1")
        ]
        kept.append(  # another tenant's bytes naming the victim's ghost: that tenant's, never the victim's
            await publish(c, under(c, wildcard_twin, "ghostd"), appended(victim, "ghostd", "s1", None).to_json())
        )
        await c.waiter.wait_all(max(kept))
        assert set(await quarantined(fresh_db)) == {*gone, *kept}

        async with running_stack(settings, projector=False) as other:
            done = await other.eraser.erase_tenant(victim)
        await c.waiter.wait_all(max(e.seq for e in done))
        assert set(await quarantined(fresh_db)) == set(kept)
        assert {e.session for e in done} == {"d1", "ghostd", "ghost2", TENANT_SCOPE}
        assert await erased_sessions(fresh_db, victim) == {"d1", "ghostd", "ghost2", TENANT_SCOPE}
        assert await erased_sessions(fresh_db, wildcard_twin) == set()
        assert [r[0] for r in await rebuilt_as_live(c, fresh_db)] == sorted(kept)
        assert (await audit.verify(c)).ok

        # what the tenant publishes afterwards on those subjects is never stored either
        last = [
            await publish(c, f"{p}.{victim}.nosession", SECRET + b" after"),
            await publish(c, under(c, victim, "ghostd", "p007"), SECRET + b" after"),
            await publish(c, under(c, victim, "ghost2"), SECRET + b" after"),
        ]
        await c.waiter.wait_all(max(last))
        assert set(await quarantined(fresh_db)) == set(kept)
        async with await psycopg.AsyncConnection.connect(fresh_db) as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM quarantine WHERE position(%s::bytea in raw) > 0", (b"look-alike",)
            )
            assert await cur.fetchone() == (len(kept) - 1,)
        assert (await audit.verify(c)).ok


async def test_a_session_erasure_deletes_its_refusals_under_any_partition_token_and_a_stray_named_session_is_erasable(
    settings: Settings, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """A session's ids under another partition's token are its own: its erasure deletes those rows,
    not another tenant's with the same ids. A session only a stray's bytes name (no event of its
    own) is erased by its id (``chronicle erase --session``), which deletes the stray."""
    sid, live = new_id("doomed"), new_id("live")
    async with running_stack(settings) as c:
        await c.commands.append(T, sid, text_message("m1", "kept until the erasure"), None)
        await c.commands.append(T, live, text_message("m1", "a live one"), None)
        misplaced = [
            await publish(c, under(c, T, sid, other_token(c, T, sid)), SECRET),
            await publish(c, under(c, T, sid, "p007"), SECRET),
        ]
        ghost = new_id("ghost")
        stray = await publish(c, under(c, T, live), appended(T, ghost, "s1", None).to_json())
        kept = [
            await publish(c, under(c, "tenant-a", sid, "p007"), SECRET),
            await publish(c, under(c, "tenant-a", sid, other_token(c, "tenant-a", sid)), SECRET),
            await publish(c, under(c, T, live, other_token(c, T, live)), SECRET),
        ]
        await c.waiter.wait_all(max(kept))
        assert set(await quarantined(fresh_db)) == {*misplaced, stray, *kept}
        async with running_stack(settings, projector=False) as other:
            first = await other.eraser.erase_session(T, sid)
            assert set(await quarantined(fresh_db)) == {stray, *kept}
            await c.waiter.wait_all(first.seq)
            erased = chronicle_cli(settings, "erase", "--tenant", T, "--session", ghost)
            assert erased.returncode == 0, erased.stderr
        assert set(await quarantined(fresh_db)) == set(kept)
        assert ghost in await erased_sessions(fresh_db, T)
        await c.waiter.wait_all(await publish(c, under(c, T, live, "p009"), b"{after"))
        report = await audit.verify(c)
        assert report.ok, report.differences


async def test_a_tenant_known_only_by_a_refusal_on_a_subject_naming_no_session_is_erased_by_the_cli(
    settings: Settings, fresh_db: str
) -> None:
    """No session, key or session subject: only a refused event on ``<prefix>.<tenant>.nosession``.
    The dry run lists the tenant-level entries, and ``--yes`` erases them, deleting the row."""
    tenant = f"tq_{uuid.uuid4().hex[:8]}"
    async with running_stack(settings) as c:
        seq = await publish(c, f"{c.layout.prefix}.{tenant}.nosession", SECRET)
        await c.waiter.wait_all(seq)
        assert set(await quarantined(fresh_db)) == {seq}
        dry = chronicle_cli(settings, "erase", "--tenant", tenant)
        assert dry.returncode == 1, dry.stderr
        assert "would erase: the tenant-level entries" in dry.stdout.splitlines()
        done = chronicle_cli(settings, "erase", "--tenant", tenant, "--yes")
        assert done.returncode == 0, done.stderr
        assert await quarantined(fresh_db) == {}
        assert not await stored_anywhere(fresh_db, SECRET)
        assert (await audit.verify(c)).ok


async def test_a_skill_write_of_a_tenant_whose_tenant_level_entries_were_erased_says_so(
    nats_url: str, fresh_db: str, s3_endpoint: str, new_id: Callable[[str], str]
) -> None:
    """``set_context`` on a skills block, once a tenant erasure erased the tenant scope: ``410
    session_erased`` naming the tenant-level entries, not "session ''"."""
    sid, bucket = new_id("skills"), f"skills-{uuid.uuid4().hex[:8]}"
    settings = make_settings(nats_url, fresh_db, s3_endpoint=s3_endpoint)
    s = settings
    Minio(s.s3_endpoint, s.s3_access_key, s.s3_secret_key, secure=False, region=s.s3_region).make_bucket(bucket)
    async with running_stack(settings) as c, api(c) as client:
        config = SessionConfig(blocks=[SkillsBlock(label="skills", bucket=bucket)])
        await c.waiter.wait_all(await c.context.configure(T, sid, config), timeout_s=20)
        await c.eraser.erase_session(T, TENANT_SCOPE, must_exist=False)
        r = await client.post(
            f"/v1/sessions/{sid}/tools/set_context", json={"label": "skills", "title": "greet", "content": "Hello."}
        )
        assert r.status_code == 410, r.text
        body = r.json()
        assert body["code"] == "session_erased"
        assert "session ''" not in body["detail"]
        assert "tenant-level entries" in body["detail"]
        assert "tenant erasure" in body["detail"]


async def test_replay_shows_a_sessions_refusals_under_another_partition_token_with_the_session(
    settings: Settings, new_id: Callable[[str], str]
) -> None:
    """``chronicle replay --session`` (services/audit/strays.py) lists what an erasure of the session
    deletes: its refusals under another partition's token too, not only the strays naming it."""
    sid = new_id("s")
    async with running_stack(settings) as c:
        await c.commands.append(T, sid, text_message("m1", "live"), None)
        seq = await publish(c, under(c, T, sid, other_token(c, T, sid)), b"not json, on another token")
        await c.waiter.wait_all(seq)
        assert [s.seq for s in await strays(c, T, sid)] == [seq]
        assert [s.seq for s in await strays(c, T, sid, from_seq=seq + 1)] == []
