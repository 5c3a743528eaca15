-- The latest leaf of every session, kept by the projector: an append needs it, and finding it by
-- an anti-join over the session's messages costs O(messages) at best and whatever the planner's
-- statistics make of it at worst (with autovacuum off, 3 -> 7 ms per append over 10,000 messages).
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS leaf_id text;
UPDATE sessions x SET leaf_id = (
    SELECT m.id FROM messages m WHERE m.tenant = x.tenant AND m.session_id = x.id
      AND NOT EXISTS (SELECT 1 FROM messages c WHERE c.tenant = m.tenant AND c.session_id = m.session_id
                      AND c.parent_id = m.id)
    ORDER BY m.seq DESC LIMIT 1)
WHERE EXISTS (SELECT 1 FROM messages m WHERE m.tenant = x.tenant AND m.session_id = x.id);

-- The compactor now tracks only sessions with compaction configured: drop what it kept for others.
DELETE FROM compactor_messages m WHERE NOT EXISTS (
    SELECT 1 FROM compactor_sessions s WHERE s.worker = m.worker AND s.tenant = m.tenant
      AND s.session_id = m.session_id AND s.compact_after IS NOT NULL);
DELETE FROM compactor_overlays o WHERE NOT EXISTS (
    SELECT 1 FROM compactor_sessions s WHERE s.worker = o.worker AND s.tenant = o.tenant
      AND s.session_id = o.session_id AND s.compact_after IS NOT NULL);
DELETE FROM compactor_sessions WHERE compact_after IS NULL;
