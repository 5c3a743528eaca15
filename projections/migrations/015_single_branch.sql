-- Whether each session's messages, in append order, are one chain (each the child of the one
-- appended before it, the first a root): then a history read of the latest leaf is every message
-- in append order, one index range scan (projections/queries.py: single_branch). The projector
-- keeps it with the latest leaf (projections/history.py: shape_changes); here it is computed from
-- the rows for every existing session.
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS single_branch boolean NOT NULL DEFAULT true;
UPDATE sessions x SET single_branch = (
    SELECT coalesce(bool_and(w.chained), true) FROM (
        SELECT m.parent_id IS NOT DISTINCT FROM lag(m.id) OVER (ORDER BY m.seq) AS chained
        FROM messages m WHERE m.tenant = x.tenant AND m.session_id = x.id) w)
WHERE EXISTS (SELECT 1 FROM messages m WHERE m.tenant = x.tenant AND m.session_id = x.id);
