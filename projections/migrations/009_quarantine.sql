-- Events the contract refuses (events/admission.py) or a projection's database refused (data
-- errors): recorded with their raw bytes in the same transaction as the checkpoint that moves past
-- them, so one bad event never stops a projector. One row per stream sequence: the projector, its
-- partition workers and the compactor may all meet the same event; the first records it.
-- ``raw`` is bounded by the stream's max payload (1 MiB by default).
CREATE TABLE IF NOT EXISTS quarantine (
    seq bigint PRIMARY KEY,
    subject text NOT NULL,
    reason text NOT NULL,
    detail text NOT NULL,
    raw bytea NOT NULL,
    consumer text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS quarantine_reason ON quarantine (reason);
