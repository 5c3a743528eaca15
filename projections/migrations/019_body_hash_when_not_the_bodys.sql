-- A message row stores its body's SHA-256 only when it is not the stored body's own (an over-cap
-- message's hash is its original's): NULL otherwise, derived from `content` on the rare read that
-- needs it (projections/queries.py append_state). 65 bytes a row (issue #13). Rows written before
-- keep their hash; both read the same. Dropping NOT NULL changes no row (no rewrite).
-- Upgrading: stop the writers (API, commands) of the earlier release before this migration runs.
-- An earlier writer reads a row without a hash as no message, and would append an existing id again.
ALTER TABLE messages ALTER COLUMN body_sha256 DROP NOT NULL;
