-- A session's messages named by id, each found through the primary key whatever the planner knows.
-- Asked `id = x`, a planner without statistics on `messages` (autovacuum off, or a table too small
-- for its next analysis) costs `messages_by_seq` (tenant, session, seq: the smaller index) the
-- same as the key, and takes it, filtering every row of the session for each id: the latest
-- leaf of a 3,000-message session read 3,000 rows; 40 ids of a 20,000-message session took 1 s.
-- Asked as a range of one id in key order, with sorts off, only the key serves it without a
-- sort; each id is its own statement (in key order, a `= ANY(...)` is a filter, not a condition,
-- before Postgres 17).
-- Its columns are named (not `SETOF messages`: a function of the table's row type would be dropped
-- with the table a rebuild swaps out).
CREATE OR REPLACE FUNCTION chronicle_messages_by_ids(ids text[], t text, s text)
RETURNS TABLE (
    id text, parent_id text, role text, content text, body_sha256 text, created_at timestamptz, seq bigint,
    original_ref jsonb
)
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off SET enable_sort = off SET enable_seqscan = off
AS $$
DECLARE
    q text;
BEGIN
    FOREACH q IN ARRAY ids LOOP
        RETURN QUERY SELECT m.id, m.parent_id, m.role, m.content, m.body_sha256, m.created_at, m.seq, m.original_ref
            FROM messages m
            WHERE m.tenant = t AND m.session_id = s AND m.id >= q AND m.id <= q ORDER BY m.id;
    END LOOP;
END
$$;
