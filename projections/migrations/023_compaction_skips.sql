-- A compaction the work queue asked for that recorded nothing (``compaction.skipped``): the read
-- model (audit, rebuild and verify), and in the compaction state the skipped estimate and the
-- compaction settings in force, so a session over ``compact_after`` is not asked again on every
-- append while nothing new could come of it.
CREATE TABLE IF NOT EXISTS compaction_skips (
    tenant      text NOT NULL,
    session_id  text NOT NULL,
    seq         bigint NOT NULL,
    leaf_id     text,
    estimate    bigint NOT NULL,
    reason      text NOT NULL,
    config      jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, session_id, seq)
);

ALTER TABLE compactor_sessions ADD COLUMN IF NOT EXISTS compaction jsonb;
ALTER TABLE compactor_sessions ADD COLUMN IF NOT EXISTS skipped_estimate bigint;

UPDATE compactor_sessions s SET compaction = c.config->'compaction'
FROM session_configs c WHERE c.tenant = s.tenant AND c.session_id = s.session_id AND s.compaction IS NULL;
