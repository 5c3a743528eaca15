-- An erasure deletes the quarantined events of its session's ids under any partition token, and a
-- tenant's erasure every one under the tenant's prefix (projections/quarantine.py `owned`,
-- `tenant_sessions`): ranges of subjects compared byte by byte (`~>=~`, `~<~`), never a `LIKE`
-- pattern, whose wildcards (`_`) tenant ids hold. `quarantine_subject_pattern` serves the range of
-- a tenant's prefix whatever the database's collation (a plain index serves it only under "C"),
-- and equality too, so it replaces `quarantine_subject` (migration 031);
-- `quarantine_subject_reversed` serves the rows ending in one session's token (its ids under any
-- partition token), so that a session's erasure does not read every row of its tenant.
CREATE INDEX IF NOT EXISTS quarantine_subject_pattern ON quarantine (subject text_pattern_ops);
CREATE INDEX IF NOT EXISTS quarantine_subject_reversed ON quarantine (reverse(subject) text_pattern_ops);
DROP INDEX IF EXISTS quarantine_subject;
