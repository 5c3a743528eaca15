-- Storage per message (issue #13): two index settings that cost bytes on every message row.
--
-- The full-text index no longer keeps a pending list. With fastupdate on (the default), every new
-- row's lexemes went into the GIN pending list uncompressed, one index tuple per lexeme: ~650
-- bytes per ~200-character message, against ~155 once merged into the compressed posting lists.
-- The list is merged only when it outgrows gin_pending_list_limit or by VACUUM (autovacuum may be
-- off), and its pages are recycled only by VACUUM. Inserting straight into the posting lists costs
-- Postgres ~0.1 ms more per message (measured: ~190 against ~70 µs per insert of a 200-character
-- message, 2,000 rows), and search never scans a pending list. The entries already pending are
-- merged here; the pages they leave are reused by later inserts after a VACUUM (or REINDEX).
ALTER INDEX messages_fts SET (fastupdate = off);
SELECT gin_clean_pending_list('messages_fts'::regclass);
ALTER INDEX search_entries_fts SET (fastupdate = off);
SELECT gin_clean_pending_list('search_entries_fts'::regclass);

-- Tenant-wide search walks the newest rows first. A descending B-tree fed increasing sequences
-- inserts at its leftmost leaf, which splits half and half, and the left half is never filled
-- again: pages stay half empty (61 bytes per message). Ascending, every insert goes to the
-- rightmost leaf, which splits at the fill factor (41 bytes); a backward scan serves the same
-- ORDER BY seq DESC.
DROP INDEX IF EXISTS messages_by_tenant_seq;
CREATE INDEX messages_by_tenant_seq ON messages (tenant, seq);
