"""Read queries over the context read models."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from events.context import SessionConfig
from projections import pages, queries, search_languages
from projections import search_query as sq
from projections.reclaimed import Reclaimed, reclaimed_in
from projections.search_bound import SEARCH_TIMEOUT_S, bounded
from projections.skill_scan import load_outputs, scan_loaded

Conn = AsyncConnection[Any]
SEARCH_CANDIDATES = 1000  # newest matches ranked, so a common word costs the same as a rare one
SEARCH_SAMPLE = 1000  # newest entries of the block that give BM25 its document frequencies
SKILL_SCAN_MESSAGES = 1000
"""The newest messages of the latest leaf's path that :func:`history_loaded_skills` looks at."""
SKILL_SCAN_BYTES = 16 * 1024 * 1024
"""The most stored JSON of assistant messages it reads (what a scan costs, whatever the session)."""


@dataclass(frozen=True, slots=True)
class PromptRow:
    version: int
    text: str
    tokens: int
    reason: str
    seq: int


async def config(conn: Conn, tenant: str, session: str) -> SessionConfig | None:
    cur = await conn.execute(
        "SELECT config FROM session_configs WHERE tenant = %s AND session_id = %s", (tenant, session)
    )
    row = await cur.fetchone()
    return SessionConfig.model_validate(row[0]) if row else None


async def tenant_configs(conn: Conn, tenant: str) -> list[SessionConfig]:
    """The configuration of each session of ``tenant`` that has one."""
    cur = await conn.execute("SELECT config FROM session_configs WHERE tenant = %s", (tenant,))
    return [SessionConfig.model_validate(row[0]) for row in await cur.fetchall()]


async def session_known(conn: Conn, tenant: str, session: str) -> bool:
    """The session lives for this tenant: a live registry row, or a stored configuration (a
    session is configured before its first message, as the SDK's builder does)."""
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM sessions WHERE tenant = %s AND id = %s AND deleted_at IS NULL) "
        "OR EXISTS (SELECT 1 FROM session_configs WHERE tenant = %s AND session_id = %s)",
        (tenant, session, tenant, session),
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def block_contents(conn: Conn, tenant: str, session: str) -> dict[str, str]:
    cur = await conn.execute(
        "SELECT label, content FROM context_blocks WHERE tenant = %s AND session_id = %s", (tenant, session)
    )
    return {str(label): str(content) for label, content in await cur.fetchall()}


async def entry_counts(conn: Conn, tenant: str, session: str, labels: list[str]) -> dict[str, int]:
    """Entries per searchable block (one query for all of a render's blocks; absent labels: 0)."""
    if not labels:
        return {}
    cur = await conn.execute(
        "SELECT label, count(*) FROM search_entries WHERE tenant = %s AND session_id = %s AND label = ANY(%s) "
        "GROUP BY label",
        (tenant, session, labels),
    )
    return {label: 0 for label in labels} | {str(k): int(n) for k, n in await cur.fetchall()}


async def search_entries(
    conn: Conn,
    tenant: str,
    session: str,
    label: str,
    query: str,
    limit: int = 10,
    timeout_s: float = SEARCH_TIMEOUT_S,
) -> list[tuple[str, str]]:
    """(key, content) of entries matching every part of the query (:mod:`projections.search_query`),
    best first by BM25 over the block's entries (bounded as message search is, in time too:
    :class:`~projections.search_bound.SearchTimedOut` past ``timeout_s``)."""
    parts = sq.parse(query)
    if not parts:
        return []
    async with bounded(conn, timeout_s):
        return await _search_entries(conn, tenant, session, label, parts, limit)


async def _search_entries(
    conn: Conn, tenant: str, session: str, label: str, parts: list[sq.Part], limit: int
) -> list[tuple[str, str]]:
    config = await search_languages.config_of(conn, tenant)  # the one its rows were indexed with
    match = sq.match_sql(parts)
    scope = "e.tenant = %(t)s AND e.session_id = %(s)s AND e.label = %(l)s"
    sample = f"SELECT e.content_tsv FROM search_entries e WHERE {scope} ORDER BY e.updated_seq DESC LIMIT %(sample)s"
    cur = await conn.execute(
        f"""
        WITH cand AS MATERIALIZED (
            SELECT e.key, e.content, e.content_tsv, e.updated_seq FROM search_entries e
            WHERE {scope} AND numnode({match}) > 0 AND e.content_tsv @@ {match}
            ORDER BY e.updated_seq DESC LIMIT %(cand)s
        ),
        scored AS MATERIALIZED (  -- each frequency computed once, for the candidates only
            SELECT c.key, c.content, c.updated_seq, octet_length(c.content)::float8 AS len,
                   {sq.tf_sql(parts, "c.content_tsv")}
            FROM cand c
        ),
        {sq.stats_sql(parts, sample)}
        SELECT scored.key, scored.content FROM scored, stats
        ORDER BY {sq.bm25_sql(parts, "scored.len", "stats", "scored")} DESC, scored.updated_seq DESC
        LIMIT %(n)s
        """,
        {"t": tenant, "s": session, "l": label, "cand": SEARCH_CANDIDATES, "sample": SEARCH_SAMPLE, "n": limit}
        | sq.params(parts, config),
    )
    return [(str(k), str(c)) for k, c in await cur.fetchall()]


async def skill_listing(conn: Conn, tenant: str, bucket: str, prefix: str) -> list[tuple[str, str | None]]:
    """(full key, description) under ``prefix``, in S3 listing order (binary key order)."""
    cur = await conn.execute(
        "SELECT key, description FROM skills_index WHERE tenant = %s AND bucket = %s AND starts_with(key, %s) "
        'ORDER BY key COLLATE "C"',
        (tenant, bucket, prefix),
    )
    return [(str(k), d) for k, d in await cur.fetchall()]


async def skill_listings(
    conn: Conn, tenant: str, wanted: list[tuple[str, str]]
) -> dict[tuple[str, str], list[tuple[str, str | None]]]:
    """:func:`skill_listing` of several (bucket, prefix) pairs in one query."""
    if not wanted:
        return {}
    cur = await conn.execute(
        "SELECT w.bucket, w.prefix, s.key, s.description FROM unnest(%s::text[], %s::text[]) AS w(bucket, prefix) "
        "JOIN skills_index s ON s.tenant = %s AND s.bucket = w.bucket AND starts_with(s.key, w.prefix) "
        'ORDER BY s.key COLLATE "C"',
        ([b for b, _ in wanted], [p for _, p in wanted], tenant),
    )
    out: dict[tuple[str, str], list[tuple[str, str | None]]] = {w: [] for w in wanted}
    for bucket, prefix, key, description in await cur.fetchall():
        out[(bucket, prefix)].append((str(key), description))
    return out


async def indexed_skills(conn: Conn, tenant: str, bucket: str) -> dict[str, str]:
    cur = await conn.execute("SELECT key, etag FROM skills_index WHERE tenant = %s AND bucket = %s", (tenant, bucket))
    return {str(k): str(e) for k, e in await cur.fetchall()}


async def loaded_skills(conn: Conn, tenant: str, session: str) -> list[tuple[str, str]]:
    cur = await conn.execute(
        "SELECT label, key FROM loaded_skills WHERE tenant = %s AND session_id = %s ORDER BY seq",
        (tenant, session),
    )
    return [(str(label), str(key)) for label, key in await cur.fetchall()]


async def history_loaded_skills(conn: Conn, tenant: str, session: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(label, key) -> (message id, tool call id): the skills the session's history shows loaded
    (:func:`projections.skill_scan.scan_loaded`), as the reference rebuilds its loaded set when a
    session starts. Its view is the latest leaf's path with unloaded outputs read as history
    reads show them; overlays are not applied (the reference's scan over ``getHistoryRowStats``
    rows: an output inside a compacted range is still stored, and an unload reclaims it).

    Bounded, unlike the reference's (it reads the whole path): the newest
    :data:`SKILL_SCAN_MESSAGES` messages of the path, and of their assistant messages the newest
    that fit in :data:`SKILL_SCAN_BYTES` of stored JSON; the path is found from every message's
    id, parent and size (:func:`~projections.queries.path_stats`: one statement over the session's
    rows, no body read), and only bodies that mention ``load_context`` come back."""
    rows, unloaded = await _scanned(conn, tenant, session)
    return scan_loaded(rows, unloaded) if rows else {}


async def history_load_outputs(conn: Conn, tenant: str, session: str, label: str, key: str) -> list[tuple[str, str]]:
    """(message id, tool call id) of every ``load_context`` output of ``label``/``key`` that
    history reads still show whole, oldest first, over what :func:`history_loaded_skills` scans
    (:func:`projections.skill_scan.load_outputs`)."""
    rows, unloaded = await _scanned(conn, tenant, session)
    return load_outputs(rows, unloaded, label, key) if rows else []


async def _scanned(conn: Conn, tenant: str, session: str) -> tuple[list[tuple[str, str]], Reclaimed]:
    """The assistant messages :func:`history_loaded_skills` scans ((id, stored JSON), oldest
    first, only those mentioning ``load_context``) and the session's reclaimed outputs."""
    _, stats = await queries.path_stats(conn, tenant, session, None)
    wanted: list[str] = []
    size = 0
    for row in reversed(stats[-SKILL_SCAN_MESSAGES:]):
        if row.role != "assistant":
            continue
        size += row.bytes
        if size > SKILL_SCAN_BYTES:
            break
        wanted.append(row.id)
    if not wanted:
        return [], reclaimed_in({})
    sent_reclaimed = await send_reclaimed(conn, tenant, session)
    cur = await conn.execute(
        queries.by_ids_sql("id, content", "AND strpos(content, 'load_context') > 0"),  # unload_context too
        (wanted, tenant, session),
    )
    unloaded = reclaimed_in(await sent_reclaimed())
    found = {str(mid): str(content) for mid, content in await cur.fetchall()}
    return [(mid, found[mid]) for mid in reversed(wanted) if mid in found], unloaded


async def load_call(conn: Conn, tenant: str, session: str, label: str, key: str) -> str | None:
    """The ``load_context`` tool call id that loaded a skill, when the load said."""
    cur = await conn.execute(
        "SELECT tool_call_id FROM loaded_skills WHERE tenant = %s AND session_id = %s AND label = %s AND key = %s",
        (tenant, session, label, key),
    )
    row = await cur.fetchone()
    return str(row[0]) if row and row[0] is not None else None


async def latest_prompt(conn: Conn, tenant: str, session: str) -> PromptRow | None:
    cur = await conn.execute(
        "SELECT version, text, tokens, reason, seq FROM prompts WHERE tenant = %s AND session_id = %s "
        "ORDER BY version DESC LIMIT 1",
        (tenant, session),
    )
    row = await cur.fetchone()
    return PromptRow(int(row[0]), str(row[1]), int(row[2]), str(row[3]), int(row[4])) if row else None


async def prompts(conn: Conn, tenant: str, session: str, after: int, limit: int) -> tuple[list[PromptRow], bool]:
    """A page of the session's recorded system prompts, oldest version first: those after
    version ``after``, at most ``limit`` and ending early at :data:`~projections.pages.PAGE_BYTES`
    of text; and whether more follow."""
    cur = await conn.execute(
        pages.page_sql("version, tokens, reason, seq", "text", "prompts", "version"),
        pages.page_params(tenant, session, after, limit),
    )
    rows, more = pages.cut(await cur.fetchall(), limit)
    return [PromptRow(int(v), str(t), int(n), str(r), int(q)) for v, n, r, q, t in rows], more


async def live_session_count(conn: Conn, tenant: str) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM sessions WHERE tenant = %s AND deleted_at IS NULL AND id <> ''", (tenant,)
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def reclaimed(conn: Conn, tenant: str, session: str) -> dict[tuple[str, str], str]:
    """(message id, tool call id) -> skill key, for tool outputs shown as unloaded; message id ''
    stands for whichever message carries the call."""
    return await (await send_reclaimed(conn, tenant, session))()


async def send_reclaimed(conn: Conn, tenant: str, session: str) -> Callable[[], Awaitable[dict[tuple[str, str], str]]]:
    """:func:`reclaimed`, sent now and answered when the returned function is awaited."""
    cur = await conn.execute(
        "SELECT message_id, tool_call_id, skill_key FROM reclaimed_outputs WHERE tenant = %s AND session_id = %s",
        (tenant, session),
    )

    async def answer() -> dict[tuple[str, str], str]:
        return {(str(m), str(t)): str(k) for m, t, k in await cur.fetchall()}

    return answer


def is_load_output(part: Any, label: str, key: str) -> bool:
    """A ``load_context`` tool part with its output, for this label and key.

    Matches AI SDK static parts (``type: "tool-load_context"``) as well as parts that carry
    ``toolName`` (the reference matched only the latter; see its §7.6.2).
    """
    if not isinstance(part, dict):
        return False
    named = part.get("type") == "tool-load_context" or part.get("toolName") == "load_context"
    inp = part.get("input")
    return bool(
        named
        and part.get("state") == "output-available"
        and isinstance(inp, dict)
        and inp.get("label") == label
        and inp.get("key") == key
        and isinstance(part.get("toolCallId"), str)
    )


async def newest_load_output(conn: Conn, tenant: str, session: str, label: str, key: str) -> tuple[str, str] | None:
    """(message id, tool call id) of the newest stored ``load_context`` output for label/key."""
    cur = await conn.execute(
        "SELECT id, content FROM messages WHERE tenant = %s AND session_id = %s AND role = 'assistant' "
        "AND strpos(content, 'load_context') > 0 ORDER BY seq DESC LIMIT 200",
        (tenant, session),
    )
    for mid, content in await cur.fetchall():
        parts = json.loads(content).get("parts")  # no list: a message published straight to the log
        for part in reversed(parts) if isinstance(parts, list) else ():
            if is_load_output(part, label, key):
                return str(mid), str(part["toolCallId"])
    return None
