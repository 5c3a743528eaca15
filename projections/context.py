"""Context projection: config, writable blocks, search entries, skills index, loaded skills,
reclaimed tool outputs and rendered prompts.

Pure core: :func:`plan` maps one event to SQL statements; :class:`ContextProjection` runs them in
the runner's transaction. Every statement is an upsert or a delete, so replays are harmless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from events.catalog import (
    ContextWritten,
    MessagesCleared,
    PromptRendered,
    SearchEntryIndexed,
    SessionConfigured,
    SessionDeleted,
    SessionErased,
    SkillIndexed,
    SkillLoaded,
    SkillRemoved,
    SkillUnloaded,
)
from events.envelope import Event

Statement = tuple[str, tuple[Any, ...]]

SESSION_TABLES = (
    "session_configs",
    "context_blocks",
    "search_entries",
    "loaded_skills",
    "reclaimed_outputs",
    "prompts",
)


def plan(event: Event, seq: int) -> list[Statement]:
    t, s = event.tenant, event.session
    match event:
        case SessionConfigured():
            return [
                (
                    "INSERT INTO session_configs (tenant, session_id, config, seq) VALUES (%s, %s, %s, %s) "
                    "ON CONFLICT (tenant, session_id) DO UPDATE SET config = excluded.config, seq = excluded.seq",
                    (t, s, Jsonb(event.config.model_dump(mode="json")), seq),
                )
            ]
        case ContextWritten():
            return [
                (
                    "INSERT INTO context_blocks (tenant, session_id, label, content, tokens, seq) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, session_id, label) DO UPDATE "
                    "SET content = excluded.content, tokens = excluded.tokens, seq = excluded.seq",
                    (t, s, event.label, event.content, event.tokens, seq),
                )
            ]
        case SearchEntryIndexed():
            return [
                (
                    "INSERT INTO search_entries (tenant, session_id, label, key, content, created_seq, updated_seq) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, session_id, label, key) DO UPDATE "
                    "SET content = excluded.content, updated_seq = excluded.updated_seq",
                    (t, s, event.label, event.key, event.content, seq, seq),
                )
            ]
        case SkillIndexed():
            return [
                (
                    "INSERT INTO skills_index (tenant, bucket, key, description, etag, size, seq) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, bucket, key) DO UPDATE "
                    "SET description = excluded.description, etag = excluded.etag, size = excluded.size, "
                    "seq = excluded.seq",
                    (t, event.bucket, event.key, event.description, event.etag, event.size, seq),
                )
            ]
        case SkillRemoved():
            return [
                (
                    "DELETE FROM skills_index WHERE tenant = %s AND bucket = %s AND key = %s",
                    (t, event.bucket, event.key),
                )
            ]
        case SkillLoaded():
            return [
                (
                    "INSERT INTO loaded_skills (tenant, session_id, label, key, seq, tool_call_id) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, session_id, label, key) "
                    "DO UPDATE SET seq = excluded.seq, tool_call_id = excluded.tool_call_id",
                    (t, s, event.label, event.key, seq, event.tool_call_id),
                )
            ]
        case SkillUnloaded():
            out: list[Statement] = [
                (
                    "DELETE FROM loaded_skills WHERE tenant = %s AND session_id = %s AND label = %s AND key = %s",
                    (t, s, event.label, event.key),
                )
            ]
            if event.tool_call_id is not None:  # message '' : whichever message carries the call
                out.append(
                    (
                        "INSERT INTO reclaimed_outputs (tenant, session_id, message_id, tool_call_id, skill_key, seq) "
                        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        (t, s, event.message_id or "", event.tool_call_id, event.key, seq),
                    )
                )
            return out
        case PromptRendered():
            return [
                (
                    "INSERT INTO prompts (tenant, session_id, version, text, tokens, reason, seq) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (t, s, event.version_no, event.text, event.tokens, event.reason, seq),
                )
            ]
        case MessagesCleared():
            return [
                ("DELETE FROM loaded_skills WHERE tenant = %s AND session_id = %s", (t, s)),
                ("DELETE FROM reclaimed_outputs WHERE tenant = %s AND session_id = %s", (t, s)),
            ]
        case SessionDeleted():
            return [(f"DELETE FROM {table} WHERE tenant = %s AND session_id = %s", (t, s)) for table in SESSION_TABLES]
        case SessionErased() if s == "":  # the tenant scope: the tenant-level entries
            return [("DELETE FROM skills_index WHERE tenant = %s", (t,))]
        case SessionErased():
            return [(f"DELETE FROM {table} WHERE tenant = %s AND session_id = %s", (t, s)) for table in SESSION_TABLES]
        case _:
            return []


class ContextProjection:
    name = "context"

    async def apply(self, conn: AsyncConnection[Any], items: Sequence[tuple[int, Event]]) -> None:
        async with conn.cursor() as cur:
            for seq, event in items:
                for sql, params in plan(event, seq):
                    await cur.execute(sql, params)
