-- Search indexes what the reference indexes (SQLite FTS5, tokenize='porter unicode61'): every
-- word, stop words included, stemmed with the original Porter algorithm (Postgres' snowball
-- 'porter' stemmer; the 'english' configuration used Porter2 and dropped stop words, so a query
-- of common words matched nothing and "one" did not match "on" as it does in the reference).
-- Hyphenated words are indexed as their parts only (as unicode61 splits them), so positions, and
-- therefore phrases, agree; e-mail addresses, URLs, hosts, paths and numbers stay whole.
CREATE TEXT SEARCH DICTIONARY chronicle_porter (TEMPLATE = snowball, Language = porter);
CREATE TEXT SEARCH CONFIGURATION chronicle_english (COPY = simple);
ALTER TEXT SEARCH CONFIGURATION chronicle_english
    ALTER MAPPING FOR asciiword, word, numword, hword_asciipart, hword_part, hword_numpart WITH chronicle_porter;
ALTER TEXT SEARCH CONFIGURATION chronicle_english DROP MAPPING FOR asciihword, hword, numhword;

-- No stemming at all, for tenants whose language Porter would mangle.
CREATE TEXT SEARCH CONFIGURATION chronicle_simple (COPY = simple);
ALTER TEXT SEARCH CONFIGURATION chronicle_simple DROP MAPPING FOR asciihword, hword, numhword;

-- Existing rows are re-indexed here: dropping and re-adding a stored generated column rewrites
-- the table with the new expression (minutes at millions of rows; the GIN index is rebuilt once).
ALTER TABLE messages DROP COLUMN content_tsv;
ALTER TABLE messages ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('chronicle_english'::regconfig, text_content)) STORED;
CREATE INDEX IF NOT EXISTS messages_fts ON messages USING gin (content_tsv);

ALTER TABLE search_entries DROP COLUMN content_tsv;
ALTER TABLE search_entries ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('chronicle_english'::regconfig, content)) STORED;
CREATE INDEX IF NOT EXISTS search_entries_fts ON search_entries USING gin (content_tsv);
