-- The reference's session registry columns that Chronicle's lacked: token usage and cost
-- (`session.usage_added`, summed in log order) and why a session ended (`session.ended`; the
-- reference's compactAndSplit sets `compaction`). Defaults fill existing rows without a rewrite.
ALTER TABLE sessions
    ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN output_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN estimated_cost double precision NOT NULL DEFAULT 0,
    ADD COLUMN end_reason text;
