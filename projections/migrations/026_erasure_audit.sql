-- Who erased a session and why (the auditor's question): the erasure's requester (an API key's
-- identity, or the operator's CLI), the caller's reason as given (no personal data: it outlives
-- the session) and the sequence of its ``session.erased`` event once published. The first record
-- of an erasure is kept: a rerun changes none of them (``seq`` is filled once when still null).
ALTER TABLE erasures ADD COLUMN IF NOT EXISTS requested_by text;
ALTER TABLE erasures ADD COLUMN IF NOT EXISTS reason text;
ALTER TABLE erasures ADD COLUMN IF NOT EXISTS seq bigint;
CREATE INDEX IF NOT EXISTS erasures_tenant_recent ON erasures (tenant, erased_at DESC, session_id DESC);
