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
