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
DECLARE
    lang text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_ts_config c JOIN pg_namespace n ON n.oid = c.cfgnamespace
                   WHERE n.nspname = 'chronicle_search' AND c.cfgname = 'english') THEN
        -- english: the original Porter stemmer, as the reference; the others: Snowball stemmers
        FOREACH lang IN ARRAY ARRAY['english', 'german', 'french', 'spanish', 'italian', 'portuguese', 'dutch',
                                    'swedish', 'russian'] LOOP
            EXECUTE format('CREATE TEXT SEARCH DICTIONARY chronicle_search.%I (TEMPLATE = pg_catalog.snowball, '
                           'Language = %s)', lang || '_stem', CASE lang WHEN 'english' THEN 'porter' ELSE lang END);
            EXECUTE format('CREATE TEXT SEARCH CONFIGURATION chronicle_search.%I (COPY = pg_catalog.simple)', lang);
            EXECUTE format('ALTER TEXT SEARCH CONFIGURATION chronicle_search.%I ALTER MAPPING FOR asciiword, word, '
                           'numword, hword_asciipart, hword_part, hword_numpart WITH chronicle_search.%I',
                           lang, lang || '_stem');
            EXECUTE format('ALTER TEXT SEARCH CONFIGURATION chronicle_search.%I DROP MAPPING FOR asciihword, hword, '
                           'numhword', lang);
        END LOOP;
        -- simple: no stemming at all
        CREATE TEXT SEARCH CONFIGURATION chronicle_search.simple (COPY = pg_catalog.simple);
        ALTER TEXT SEARCH CONFIGURATION chronicle_search.simple DROP MAPPING FOR asciihword, hword, numhword;
    END IF;
END
$$;

-- The language of each tenant that is not English (services write it from the settings:
-- projections/search_languages.py). While any tenant has one, an insert trigger on the two tables
-- takes a new row's configuration from here (no trigger, and no cost, while every tenant is English).
CREATE TABLE IF NOT EXISTS search_languages (
    tenant  text PRIMARY KEY,
    config  regconfig NOT NULL
);
CREATE OR REPLACE FUNCTION chronicle_search.tenant_config() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    c regconfig;
BEGIN
    SELECT l.config INTO c FROM search_languages l WHERE l.tenant = NEW.tenant;
    IF FOUND THEN
        NEW.search_config := c;
    END IF;
    RETURN NEW;
END
$$;

-- Existing rows are re-indexed here: dropping and re-adding a stored generated column rewrites
-- the table with the new expression (minutes at millions of rows; the GIN index is rebuilt once).
ALTER TABLE messages DROP COLUMN content_tsv;
ALTER TABLE messages ADD COLUMN search_config regconfig NOT NULL DEFAULT 'chronicle_search.english';
ALTER TABLE messages ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector(search_config, text_content)) STORED;
CREATE INDEX IF NOT EXISTS messages_fts ON messages USING gin (content_tsv);

ALTER TABLE search_entries DROP COLUMN content_tsv;
ALTER TABLE search_entries ADD COLUMN search_config regconfig NOT NULL DEFAULT 'chronicle_search.english';
ALTER TABLE search_entries ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector(search_config, content)) STORED;
CREATE INDEX IF NOT EXISTS search_entries_fts ON search_entries USING gin (content_tsv);
