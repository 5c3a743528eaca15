-- One session's messages in sequence order from one end, as many as asked: the plan of these
-- reads is fixed (a walk of `messages_by_seq` in that order that stops at the count), never the
-- planner's guess from statistics. With none on `messages` (autovacuum off), or with a session
-- far larger than the tenant's average one, Postgres took a session for a few rows and read every
-- row of it through its bitmap, then sorted them: 20-45 ms for any read of a 50,000-message
-- session that needs a few of its rows (`history?limit=50`, a path page). PL/pgSQL keeps each
-- function's plan for the connection; the settings hold only while the function runs.

-- The newest `n` message bodies of a session, newest first (a single-branch history's recent end).
CREATE OR REPLACE FUNCTION chronicle_newest_messages(t text, s text, n int)
RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off SET enable_sort = off SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY SELECT m.content FROM messages m WHERE m.tenant = t AND m.session_id = s ORDER BY m.seq DESC LIMIT n;
END
$$;

-- The newest `n` messages of a session below sequence `below`, newest first (a page of a path).
CREATE OR REPLACE FUNCTION chronicle_messages_below(t text, s text, below bigint, n int)
RETURNS TABLE (id text, parent_id text, content text, seq bigint)
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off SET enable_sort = off SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY SELECT m.id, m.parent_id, m.content, m.seq FROM messages m
        WHERE m.tenant = t AND m.session_id = s AND m.seq < below ORDER BY m.seq DESC LIMIT n;
END
$$;
