-- Appends of a compaction summary's id (`compaction_<overlay id>`) that the history projection
-- left out because an overlay of the session recorded before them reads under that id
-- (projections/history.py `summaries_in`): an earlier release stored such a summary, sent back by
-- a client, as a message, and the messages appended after it name it as their parent. The parent
-- a left-out summary was appended under (already resolved through a chain of such summaries) is
-- kept here, the first append's, so that a message appended under the summary is stored under
-- that parent instead: its branch's history stays whole, in the live projection and a rebuild
-- alike. Cleared with the session's messages.
CREATE TABLE IF NOT EXISTS left_out_summaries (
    tenant text NOT NULL,
    session_id text NOT NULL,
    id text NOT NULL,
    parent_id text,
    seq bigint NOT NULL,
    PRIMARY KEY (tenant, session_id, id)
);
