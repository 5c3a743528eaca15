-- Every projector batch updates its sessions' rows: leave room for HOT updates.
ALTER TABLE sessions SET (fillfactor = 50);
-- Tenant-wide search ranks the newest matches first.
CREATE INDEX IF NOT EXISTS messages_by_tenant_seq ON messages (tenant, seq DESC);
