-- The compaction work queue's attempt series of a session: every failed attempt of a request is
-- recorded (``compaction.failed``), and the compaction state keeps the latest one's attempt
-- number and time, so a newer request of the session continues that series (its next attempt,
-- after the backoff) instead of starting its own: an outage costs one series of attempts.
ALTER TABLE compactor_sessions ADD COLUMN IF NOT EXISTS failed_attempt integer;
ALTER TABLE compactor_sessions ADD COLUMN IF NOT EXISTS failed_at timestamptz;
