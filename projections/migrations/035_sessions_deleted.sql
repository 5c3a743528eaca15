-- `GET /v1/sessions?deleted=true`: a tenant's deleted sessions, newest created first, for auditors
-- (their events stay in the log; the list of live sessions leaves them out). Partial, as the live
-- list's index: a page reads only deleted rows, however many live sessions the tenant has.
CREATE INDEX IF NOT EXISTS sessions_deleted_by_tenant ON sessions (tenant, created_seq DESC) WHERE deleted_at IS NOT NULL;
