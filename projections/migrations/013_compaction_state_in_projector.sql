-- The compaction state is kept by the projector now (rows keyed by the projector's name, backfilled
-- from the read models for every session with compaction configured at its first batch): the
-- compactor's own state and checkpoint, under its default name, are dropped.
DELETE FROM compactor_messages WHERE worker = 'compactor';
DELETE FROM compactor_overlays WHERE worker = 'compactor';
DELETE FROM compactor_sessions WHERE worker = 'compactor';
DELETE FROM checkpoints WHERE name = 'compactor';
