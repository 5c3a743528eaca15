-- CPU per message (issue #13): the full-text indexes keep a small pending list again.
--
-- Without one (migration 016, fastupdate off) every new row's ~30 lexemes were each inserted into
-- their posting tree: ~250 µs of Postgres CPU per ~200-character message, more than half of what
-- the projector's transaction costs Postgres. With the default list (fastupdate on, 4 MB) rows go
-- to the list cheaply, but a list that large is merged rarely (~6,000 messages) and meanwhile holds
-- each row's lexemes uncompressed (~650 bytes a message). A list of 128 kB is merged by the insert
-- that fills it, every ~190 messages: one pass that sorts the pending entries and updates each
-- posting tree once for all of them, and the pages it empties are recorded as free and reused by
-- the list at once (no VACUUM needed: autovacuum may be off). Measured on 6,000 messages in the
-- projector's batches of 30: Postgres CPU per message 435-527 µs off, 207-213 µs with this list,
-- storage +15 bytes a message. Search reads the list as well (at most 16 pages): no difference
-- measured.
ALTER INDEX messages_fts SET (fastupdate = on, gin_pending_list_limit = 128);
ALTER INDEX search_entries_fts SET (fastupdate = on, gin_pending_list_limit = 128);
