-- `GET /v1/sessions?order=recent` (the reference's `list()`: most recently active first) without
-- an index on `last_seq`, which every event of a session changes: indexed, every projector
-- touch of a session's row would be a non-HOT update (a new entry in each of the table's
-- indexes, on the hot write path, where autovacuum may be off). `activity` is the coarse part of
-- `last_seq`: its bucket of 65,536 stream sequences. A touch changes it only when the session's
-- new last event is in another bucket than its previous one, at most once per 65,536 events of
-- the whole log, so nearly every touch stays HOT. A generated column: derived from `last_seq`
-- alone, so a rebuild equals the live read model by construction. The list walks this index a
-- bucket at a time and orders each bucket by the exact `last_seq` (projections/queries.py,
-- `list_sessions_recent`; the shift there must stay 16). Adding the column rewrites the table
-- once (one row per session).
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS activity bigint GENERATED ALWAYS AS (last_seq >> 16) STORED;
-- Ascending: buckets only grow, so inserts go to the rightmost leaf; a backward scan serves DESC.
CREATE INDEX IF NOT EXISTS sessions_by_activity ON sessions (tenant, activity) WHERE deleted_at IS NULL;
