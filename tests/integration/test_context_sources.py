"""Read-only blocks kept in object storage are read with no database connection held: rendered,
and sized when a config is PUT or a block written (also an object that is missing or not text,
which a sized prompt has as an empty block, and the config in force's objects on a refusal's
path, or those of a config that changed since the objects were read)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from events.admission import MAX_WRITTEN_BYTES
from events.context import SessionConfig, SkillsBlock
from projections import context_queries
from services.bootstrap import Container
from services.context.blocks import SIZING_ROUNDS
from services.context.rules import object_key
from services.errors import ContentionExhausted, PromptTooLarge, SourceMissing, SourceNotText
from tests.e2e.context_support import new_bucket

T = "tenant-a"
NOT_UTF8 = b"\xff\xfe policy \xc3\x28"


@contextlib.contextmanager
def watched_reads(stack: Container) -> Iterator[list[tuple[str, int]]]:
    """Every object-storage read made meanwhile, in order: the object's key (the tenant's prefix
    left off) and how many pool connections were held then by anything but the projector (which
    applies events meanwhile)."""
    storage = stack.context._storage()
    holders: dict[asyncio.Task[Any], int] = {}
    connection = stack.pool.connection

    @contextlib.asynccontextmanager
    async def tracked(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        task = asyncio.current_task()
        assert task is not None
        holders[task] = holders.get(task, 0) + 1
        try:
            async with connection(*args, **kwargs) as conn:
                yield conn
        finally:
            holders[task] -= 1

    reads: list[tuple[str, int]] = []
    get_text = storage.get_text

    async def watched(bucket: str, key: str, *, limit: int | None = None) -> str | None:  # get_text's own signature
        held = sum(n for t, n in holders.items() if "ProjectorRunner" not in repr(t.get_coro()))
        reads.append((key.removeprefix(object_key(T, "")), held))
        return await get_text(bucket, key, limit=limit)

    storage.get_text = watched  # type: ignore[method-assign]
    stack.pool.connection = tracked  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        storage.get_text = get_text  # type: ignore[method-assign]
        stack.pool.connection = connection  # type: ignore[method-assign]


def readonly(bucket: str, *keys: str, writable: bool = False) -> SessionConfig:
    """A config of one read-only block per object ``keys`` (labels ``r0``, ``r1``, …), and a
    writable block ``notes`` when asked."""
    blocks: list[dict[str, Any]] = [
        {"label": f"r{i}", "kind": "readonly", "source": {"bucket": bucket, "key": key}} for i, key in enumerate(keys)
    ]
    if writable:
        blocks.append({"label": "notes", "kind": "writable"})
    return SessionConfig.model_validate({"blocks": blocks})


async def objects(stack: Container, sid: str) -> str:
    """A bucket holding ``soul.md`` (text), ``policy.bin`` (not UTF-8) and no ``gone.md``."""
    storage = stack.context._storage()
    bucket = new_bucket(stack.settings)  # a document put makes no bucket
    await storage.put(bucket, object_key(T, "soul.md"), "You are kind.", None)
    await storage.put_bytes(bucket, object_key(T, "policy.bin"), NOT_UTF8)
    return bucket


async def test_object_storage_is_read_with_no_connection_held(stack: Container, new_id: Callable[[str], str]) -> None:
    sid = new_id("sources")
    bucket = await objects(stack, sid)
    config = readonly(bucket, "soul.md")
    await stack.context.configure(T, sid, config)

    with watched_reads(stack) as reads:
        await stack.context.configure(T, sid, config)  # the prompt it would leave is sized
        prompt = await stack.context.frozen_prompt(T, sid)
        sources = await stack.context.sources(T, sid)
        async with stack.pool.connection() as conn:
            blocks = await stack.context.blocks(conn, T, sid, sources=sources)
    assert "You are kind." in prompt.text
    assert [b.content for b in blocks if b.label == "r0"] == ["You are kind."]
    assert reads
    assert {held for _, held in reads} == {0}, reads  # every read happened with every pool connection idle


@pytest.mark.parametrize(
    ("key", "refused"), [("gone.md", SourceMissing), ("policy.bin", SourceNotText)], ids=["missing", "not_text"]
)
async def test_sizing_a_config_reads_an_object_missing_or_not_text_once_with_no_connection_held(
    stack: Container, new_id: Callable[[str], str], key: str, refused: type[Exception]
) -> None:
    """Sized as the empty block a sized prompt has in its place, read once, before the decision
    (it was left out of what was read, and read again inside it with a connection held). The
    config is taken; the prompt is refused where it is rendered."""
    sid = new_id("sources")
    bucket = await objects(stack, sid)
    with watched_reads(stack) as reads:
        await stack.context.configure(T, sid, readonly(bucket, "soul.md", key))
    assert sorted(reads) == sorted([("soul.md", 0), (key, 0)])
    with pytest.raises(refused):
        await stack.context.frozen_prompt(T, sid)


@pytest.mark.parametrize("in_force", ["soul.md", "gone.md", "policy.bin"], ids=["text", "missing", "not_text"])
async def test_a_refused_config_reads_the_objects_of_the_config_in_force_with_no_connection_held(
    stack: Container, new_id: Callable[[str], str], in_force: str
) -> None:
    """A config whose prompt could not be stored is sized against the config in force, whose
    objects are read before the decision is made again (they were read inside it)."""
    sid = new_id("sources")
    bucket = await objects(stack, sid)
    await stack.context._storage().put(bucket, object_key(T, "big.md"), "x" * (MAX_WRITTEN_BYTES + 1000), None)
    await stack.context.configure(T, sid, readonly(bucket, in_force))
    with watched_reads(stack) as reads, pytest.raises(PromptTooLarge):
        await stack.context.configure(T, sid, readonly(bucket, "big.md"))
    assert reads == [("big.md", 0), (in_force, 0)]


async def test_a_write_sized_under_a_config_changed_since_its_objects_were_read_reads_them_first(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block write sizes the prompt with the objects read before it; when the config changed
    meanwhile, the new config's objects are read with no connection held, and the write decided again."""
    sid = new_id("sources")
    bucket = await objects(stack, sid)
    await stack.context.configure(T, sid, readonly(bucket, "soul.md", writable=True))
    sources = stack.context.sources

    async def then_changed(*args: Any, **kwargs: Any) -> Any:
        texts = await sources(*args, **kwargs)
        await stack.context.configure(T, sid, readonly(bucket, "soul.md", "gone.md", "policy.bin", writable=True))
        return texts

    with watched_reads(stack) as reads:
        monkeypatch.setattr(stack.context, "sources", then_changed)
        written = await stack.context.write(T, sid, "notes", "remember this", "replace", "api")
        monkeypatch.undo()
    assert written.content == "remember this"
    assert {held for _, held in reads} == {0}, reads
    assert [k for k, _ in reads].count("gone.md") == 2  # sized for the PUT, then for the write: before it


async def test_a_write_whose_config_keeps_changing_while_its_objects_are_read_gives_up(
    stack: Container, new_id: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round of reading meets a config changed since: after ``SIZING_ROUNDS``, ``503 contention``."""
    sid = new_id("sources")
    bucket = await objects(stack, sid)
    await stack.context.configure(T, sid, readonly(bucket, "soul.md", writable=True))
    config_sources = stack.context._config_sources
    changes: list[str] = []
    putting: list[bool] = []

    async def then_changed(*args: Any, **kwargs: Any) -> Any:
        texts = await config_sources(*args, **kwargs)
        if not putting and len(changes) < 10:  # each config names an object not read yet
            changes.append(f"more-{len(changes)}.md")
            putting.append(True)
            try:
                await stack.context.configure(T, sid, readonly(bucket, "soul.md", *changes, writable=True))
            finally:
                putting.clear()
        return texts

    monkeypatch.setattr(stack.context, "_config_sources", then_changed)
    with pytest.raises(ContentionExhausted):
        await stack.context.write(T, sid, "notes", "remember this", "replace", "api")
    monkeypatch.undo()
    assert len(changes) == SIZING_ROUNDS + 1  # before the write, then after each round's reads
    async with stack.pool.connection() as conn:
        assert "notes" not in await context_queries.block_contents(conn, T, sid)  # nothing written


async def test_sizing_a_skill_put_reads_an_object_missing_or_not_text_once_with_no_connection_held(
    stack: Container, new_id: Callable[[str], str]
) -> None:
    """A skill put sizes the session's prompt too: its read-only objects are read before, each once."""
    sid = new_id("sources")
    bucket = await objects(stack, sid)
    config = readonly(bucket, "soul.md", "gone.md", "policy.bin")
    config = config.model_copy(update={"blocks": [*config.blocks, SkillsBlock(label="skills", bucket=bucket)]})
    await stack.waiter.wait_all(await stack.context.configure(T, sid, config), timeout_s=20)
    with watched_reads(stack) as reads:
        await stack.context.set_skill(T, sid, "skills", "greet.md", "Say hello.", "Greets")
    assert sorted(reads) == [("gone.md", 0), ("policy.bin", 0), ("soul.md", 0)]
