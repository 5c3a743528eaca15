-- Erasure by crypto-shredding (events/sealing.py): one data key per session, wrapped by a
-- key-encryption key, kept here and never in the event log. Erasing a session deletes its key
-- (what the log holds sealed with it can never be read again) and records the erasure, which
-- readers of the log consult to show the session's events as tombstones.
CREATE TABLE IF NOT EXISTS data_keys (
    tenant text NOT NULL,
    session_id text NOT NULL,
    kid text NOT NULL,
    kek_id text NOT NULL,
    wrapped bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, session_id)
);
CREATE TABLE IF NOT EXISTS erasures (
    tenant text NOT NULL,
    session_id text NOT NULL,
    erased_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, session_id)
);
