"""Objects a write stores before it is decided (a claim-checked body, an over-cap original) and
that no event then references: a sealed one is this write's own (a fresh nonce, so a fresh key)
and is deleted when the write records nothing; a plain one's key is a content hash an event may
already reference, and it stays. Real NATS (JetStream object store), Postgres, S3 (moto), the
projector; encryption on unless a test says otherwise."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from nats.js.errors import NotFoundError

from events.blobs import refs_in
from events.omitted import OMITTED
from services.bootstrap import Container
from services.errors import ErasedSession, MessageConflict, MessageNotFound
from services.settings import Settings
from services.writes import commands as writes
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.integration.test_micro_compaction import tool_message

ROW_CAP = 20_000
LIMIT = 1024


def over_cap(mid: str, words: str = "the original") -> dict[str, Any]:
    return text_message(mid, words + " " + "line of text\n" * 3000)  # ~39 KB: over the row cap


def settings_for(nats_url: str, db_url: str, s3_endpoint: str, **overrides: object) -> Settings:
    return make_settings(
        nats_url,
        db_url,
        s3_endpoint=s3_endpoint,
        row_cap_bytes=ROW_CAP,
        originals_bucket=f"orig-{uuid.uuid4().hex[:12]}",  # this test's alone: its objects are counted
        **overrides,
    )


async def originals(c: Container) -> list[str]:
    skills = c.context.skills
    assert skills is not None
    return await skills.keys(c.settings.originals_bucket, "blobs/")


async def claim_checked(c: Container) -> set[str]:
    """The keys of the claim-check bucket's objects (JetStream object store)."""
    try:
        store = await c.js.object_store(c.settings.blob_bucket)
        return {o.name or "" for o in await store.list(ignore_deletes=True) if not o.deleted}
    except NotFoundError:  # no bucket, or an empty one
        return set()


async def referenced(c: Container, tenant: str, session: str, store: str) -> set[str]:
    """The object keys (sha256) the session's events name in ``store`` (the originals' ``s3``,
    the claim checks' ``jetstream-object``: an unsealed original and its claim check may share
    the hash)."""
    subject = c.layout.session_subject(tenant, session)
    last = await c.publisher.last_subject_seq(tenant, session)
    found: set[str] = set()
    seq = 1
    while seq <= last:
        msg = await c.js.get_msg(c.layout.stream, seq, next=True, subject=subject)
        found |= {r.sha256 for r in refs_in(msg.data or b"") if r.store == store}
        seq = int(msg.seq or seq) + 1
    return found


@pytest.mark.parametrize("keyed", [False, True], ids=["plain-retry", "idempotency-key"])
async def test_a_repeated_sealed_over_cap_append_leaves_one_original(
    nats_url: str, fresh_db: str, s3_endpoint: str, keyed: bool
) -> None:
    settings = settings_for(nats_url, fresh_db, s3_endpoint, encryption=True)
    async with running_stack(settings) as c:
        key = "k-1" if keyed else None
        first = await c.commands.append("tenant-a", "x-1", over_cap("big"), OMITTED, key)
        again = await c.commands.append("tenant-a", "x-1", over_cap("big"), OMITTED, key)
        assert (again.seq, again.created) == (first.seq, keyed)  # answered as the first: no new event
        stored = await originals(c)
        assert len(stored) == 1, stored
        assert {k.removeprefix("blobs/") for k in stored} <= await referenced(c, "tenant-a", "x-1", "s3")


async def test_a_refused_sealed_over_cap_append_leaves_nothing(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    settings = settings_for(nats_url, fresh_db, s3_endpoint, encryption=True, payload_limit_bytes=LIMIT)
    async with running_stack(settings) as c:
        await c.commands.append("tenant-a", "x-1", over_cap("big"), OMITTED)
        before = (await originals(c), await claim_checked(c))
        with pytest.raises(MessageConflict):  # same id, another body: 409, nothing recorded
            await c.commands.append("tenant-a", "x-1", over_cap("big", "another text"), OMITTED)
        assert (await originals(c), await claim_checked(c)) == before


async def test_an_over_cap_append_claim_checks_only_what_its_event_references(
    nats_url: str, fresh_db: str, s3_endpoint: str
) -> None:
    """The whole body was claim-checked too, then dropped for its capped form: an object per
    over-cap append that no event named (sealed or not)."""
    settings = settings_for(nats_url, fresh_db, s3_endpoint, encryption=False, payload_limit_bytes=LIMIT)
    async with running_stack(settings) as c:
        # an assistant's tool output is cut to 1000 characters: its capped form is claim-checked too
        await c.commands.append("tenant-a", "x-1", tool_message("big", "line of text\n" * 3000), OMITTED)
        stored = await claim_checked(c)
        assert len(stored) == 1, stored
        assert stored == await referenced(c, "tenant-a", "x-1", "jetstream-object")


async def test_a_refused_sealed_update_leaves_no_claim_check(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    settings = settings_for(nats_url, fresh_db, s3_endpoint, encryption=True, payload_limit_bytes=LIMIT)
    async with running_stack(settings) as c:
        await c.commands.append("tenant-a", "x-1", text_message("m1", "small"), OMITTED)
        with pytest.raises(MessageNotFound):
            await c.commands.update("tenant-a", "x-1", text_message("nope", "x" * (2 * LIMIT)))
        assert await claim_checked(c) == set()


async def test_a_repeated_plain_append_keeps_the_shared_object(nats_url: str, fresh_db: str, s3_endpoint: str) -> None:
    """Unsealed, the repeat's original is the first's object (same bytes, same key): it stays."""
    settings = settings_for(nats_url, fresh_db, s3_endpoint, encryption=False)
    async with running_stack(settings) as c:
        await c.commands.append("tenant-a", "x-1", over_cap("big"), OMITTED)
        again = await c.commands.append("tenant-a", "x-1", over_cap("big"), OMITTED)
        assert not again.created
        stored = await originals(c)
        assert len(stored) == 1, stored
        assert {k.removeprefix("blobs/") for k in stored} == await referenced(c, "tenant-a", "x-1", "s3")


async def test_a_sealed_fork_refused_before_its_copies_leaves_no_original(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source erased while the fork packed its copies (its original stored again under the
    fork's key): the fork answers 410, publishes no copy, and its original copy is deleted."""
    settings = settings_for(nats_url, fresh_db, s3_endpoint, encryption=True)
    async with running_stack(settings) as c:
        last = await c.commands.append("tenant-a", "x-1", over_cap("big"), OMITTED)
        await c.waiter.wait_all(last.seq, timeout_s=20)
        real = writes._erased

        async def erased_meanwhile(cmd: Any, tenant: str, session: str) -> bool:
            if session == "x-1" and not await real(cmd, tenant, session):
                await c.eraser.erase_session(tenant, session)  # its own original goes with it
            return await real(cmd, tenant, session)

        monkeypatch.setattr(writes, "_erased", erased_meanwhile)
        with pytest.raises(ErasedSession):
            await writes.fork(c.commands, c.eraser, "tenant-a", "x-1", "big", "f-1", None)
        assert await originals(c) == []


async def test_a_sealed_fork_another_call_completed_leaves_only_that_calls_original(
    nats_url: str, fresh_db: str, s3_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's retry racing the first call: the other call made and copied the whole fork
    before this one's creation; this one publishes nothing, and the original copy it packed goes."""
    settings = settings_for(nats_url, fresh_db, s3_endpoint, encryption=True)
    async with running_stack(settings) as c:
        last = await c.commands.append("tenant-a", "x-1", over_cap("big"), OMITTED)
        await c.waiter.wait_all(last.seq, timeout_s=20)
        create = c.commands.create_session

        async def raced(*args: Any, **kwargs: Any) -> Any:
            monkeypatch.setattr(c.commands, "create_session", create)
            await writes.fork(c.commands, c.eraser, "tenant-a", "x-1", "big", "f-1", None)  # the other call
            return await create(*args, **kwargs)  # session_exists: the other call made it

        monkeypatch.setattr(c.commands, "create_session", raced)
        forked = await writes.fork(c.commands, c.eraser, "tenant-a", "x-1", "big", "f-1", None)
        assert forked.messages == 1
        wanted = await referenced(c, "tenant-a", "x-1", "s3") | await referenced(c, "tenant-a", "f-1", "s3")
        stored = await originals(c)
        assert len(stored) == 2, stored  # the source's and the fork's
        assert {k.removeprefix("blobs/") for k in stored} == wanted
