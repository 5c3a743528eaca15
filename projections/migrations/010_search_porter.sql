-- Search indexes what the reference indexes (SQLite FTS5, tokenize='porter unicode61'): every
-- word, stop words included, stemmed with the original Porter algorithm (Postgres' snowball
-- 'porter' stemmer; the 'english' configuration used Porter2 and dropped stop words, so a query
-- of common words matched nothing and "one" did not match "on" as it does in the reference).
-- Hyphenated words are indexed as their parts only (as unicode61 splits them), so positions, and
-- therefore phrases, agree; e-mail addresses, URLs, hosts, paths and numbers stay whole.
-- The dictionary and configurations live in a schema of their own, shared by every schema this
-- migration runs in: a rebuild migrates a shadow schema, swaps its tables into place and drops it,
-- and a configuration dropped with it would take the tables' generated columns along.
CREATE SCHEMA IF NOT EXISTS chronicle_search;
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_ts_config c JOIN pg_namespace n ON n.oid = c.cfgnamespace
                   WHERE n.nspname = 'chronicle_search' AND c.cfgname = 'english') THEN
        CREATE TEXT SEARCH DICTIONARY chronicle_search.porter (TEMPLATE = pg_catalog.snowball, Language = porter);
        CREATE TEXT SEARCH CONFIGURATION chronicle_search.english (COPY = pg_catalog.simple);
        ALTER TEXT SEARCH CONFIGURATION chronicle_search.english ALTER MAPPING
            FOR asciiword, word, numword, hword_asciipart, hword_part, hword_numpart WITH chronicle_search.porter;
        ALTER TEXT SEARCH CONFIGURATION chronicle_search.english DROP MAPPING FOR asciihword, hword, numhword;
    END IF;
END
$$;

-- Existing rows are re-indexed here: dropping and re-adding a stored generated column rewrites
-- the table with the new expression (minutes at millions of rows; the GIN index is rebuilt once).
ALTER TABLE messages DROP COLUMN content_tsv;
ALTER TABLE messages ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('chronicle_search.english'::regconfig, text_content)) STORED;
CREATE INDEX IF NOT EXISTS messages_fts ON messages USING gin (content_tsv);

ALTER TABLE search_entries DROP COLUMN content_tsv;
ALTER TABLE search_entries ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('chronicle_search.english'::regconfig, content)) STORED;
CREATE INDEX IF NOT EXISTS search_entries_fts ON search_entries USING gin (content_tsv);
