-- search_context ranks the newest matching entries of a block first.
CREATE INDEX IF NOT EXISTS search_entries_by_seq ON search_entries (tenant, session_id, label, updated_seq DESC);
