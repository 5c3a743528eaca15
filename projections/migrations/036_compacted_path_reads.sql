-- Two more reads of one session's messages whose plan is fixed, as migration 034's are.

-- The newest `n` messages of a session below sequence `below`, newest first, without their bodies:
-- the links a compacted history walks (its summaries stand over most of the path; only the
-- bodies of what shows are read, by sequence).
CREATE OR REPLACE FUNCTION chronicle_message_links_below(t text, s text, below bigint, n int)
RETURNS TABLE (id text, parent_id text, seq bigint)
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off SET enable_sort = off SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY SELECT m.id, m.parent_id, m.seq FROM messages m
        WHERE m.tenant = t AND m.session_id = s AND m.seq < below ORDER BY m.seq DESC LIMIT n;
END
$$;

-- A session's messages at the given sequences (the bodies of a compacted path's rows that show,
-- whose sequences its walk read, where they are not the session's newest rows below the newest of
-- them), each read by its own equality on `seq`, which only the indexes holding `seq` serve as a
-- condition. Asked as one `seq = ANY(...)` (or by id), a planner without statistics takes the
-- session for one row and filters the whole session instead (measured on 20,000 messages: 19 ms
-- for 40 sequences, 1.2 s for 10,000; 1 s for 40 ids).
CREATE OR REPLACE FUNCTION chronicle_messages_at(t text, s text, seqs bigint[])
RETURNS TABLE (seq bigint, content text)
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off SET enable_seqscan = off
AS $$
DECLARE
    q bigint;
BEGIN
    FOREACH q IN ARRAY seqs LOOP
        RETURN QUERY SELECT m.seq, m.content FROM messages m WHERE m.tenant = t AND m.session_id = s AND m.seq = q;
    END LOOP;
END
$$;
