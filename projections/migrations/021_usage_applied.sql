-- The `session.usage_added` events the history projection applied, by event id: a usage event
-- whose id was applied before (a client's retry published after JetStream's duplicate window,
-- the same event published twice) adds nothing again, live and in a rebuild. Written in the
-- transaction that adds the event's amounts to the session's counters; the amounts and the
-- sequence are kept so that a retry with the same Idempotency-Key is answered from here (the
-- first answer, or `422 idempotency_key_reused` for other amounts). A deleted or erased
-- session's rows go with it.
CREATE TABLE IF NOT EXISTS usage_applied (
    tenant text NOT NULL,
    session_id text NOT NULL,
    event_id text NOT NULL,
    seq bigint NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cost double precision NOT NULL,
    PRIMARY KEY (tenant, session_id, event_id)
);

-- Usage events applied before this migration were not recorded: their ids are in the log only. A
-- rebuild records them where the live table does not, so a comparison of the two (verify) looks
-- at the rows past this mark only (projections/rebuild.py, `compared_rows`). The mark is the
-- furthest checkpoint when the migration ran: 0 on a new database, and a rebuild's own schema.
CREATE TABLE IF NOT EXISTS usage_applied_since (seq bigint NOT NULL);
INSERT INTO usage_applied_since (seq)
SELECT coalesce(max(seq), 0) FROM checkpoints WHERE NOT EXISTS (SELECT 1 FROM usage_applied_since);
