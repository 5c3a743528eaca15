-- Words joined by punctuation are indexed as their parts, as the reference's FTS5 unicode61
-- tokenizer indexes them (it splits at every character that is not a letter or digit). Postgres'
-- default parser kept `client/server`, `config.yaml`, `report_final.pdf`, `3.14`, e-mail
-- addresses, URLs and host names whole (its file, host, email, url, float and version tokens),
-- so a search for `client`, `yaml` or `final` did not find them. Every text is now indexed, and
-- every query parsed, through chronicle_search.words: the text with each ASCII character that is
-- not a letter or digit made a space. The parser then only sees words between blanks; positions
-- are unchanged for text that had none of those tokens (hyphenated words and apostrophes were
-- already split). Characters beyond ASCII are left to the parser, which splits at those that are
-- not letters or digits of the database's locale, as before.
--
-- The functions live in chronicle_search with the configurations (migration 010): a rebuild
-- migrates a shadow schema and drops it. IMMUTABLE: each reads nothing but its arguments (the
-- ranges are code points: no locale).
--
-- Cost on the append path: ~6 µs of Postgres CPU per ~200-character message (regexp_replace;
-- to_tsvector itself is ~30 µs).
--
-- Only the first 100,000 characters (migration 028, which added the bound later, says why: a
-- vector over 1 MiB is refused). The bound is here too so that this migration's re-index of a
-- database upgraded from before it cannot be refused: a text whose vector fitted as the old parser
-- read it (`q1.z1` one word) can make one over 1 MiB as its words (two).
CREATE OR REPLACE FUNCTION chronicle_search.words(content text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT regexp_replace(left(content, 100000), '[!-/:-@[-`{-~]', ' ', 'g')
$$;

-- The snippet of a search hit, with the query's words in **...**: ts_headline over the text with a
-- space after each of those characters (the parser sees the words words() gives it), and the
-- spaces taken out again. The highlight and fragment marks are noncharacters while the spaces are
-- taken out (a mark is never mistaken for the text's own punctuation); noncharacters in the text
-- itself are shown as U+FFFD.
CREATE OR REPLACE FUNCTION chronicle_search.snippet(config regconfig, content text, query tsquery) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT replace(replace(replace(regexp_replace(
        ts_headline(config,
                    regexp_replace(translate(content, U&'\FDD0\FDD1\FDD2', U&'\FFFD\FFFD\FFFD'),
                                   '([!-/:-@[-`{-~])', '\1 ', 'g'),
                    query,
                    U&'MaxWords=24, MinWords=8, MaxFragments=2, StartSel=\FDD0, StopSel=\FDD1, FragmentDelimiter=\FDD2'),
        '([!-/:-@[-`{-~]) ', '\1', 'g'), U&'\FDD0', '**'), U&'\FDD1', '**'), U&'\FDD2', ' ... ')
$$;

-- Existing messages: the vector of each row whose text had such a token is recomputed from its
-- body (the same text the projector indexes; the length in bytes is unchanged). Every row's text
-- is derived and parsed once to compare (twice for a row that changes), and only the rows whose vector changes are written (with their
-- index entries); a VACUUM (autovacuum, or by hand where it is off) lets new rows reuse the old
-- versions' space. Measured (2 shared cores, load ~5): 100,000 messages of ~200 characters, a
-- fifth of them changed, took 14 s: 3.7 s to compute every vector, the rest to write the changed
-- rows (~0.5 ms each). A million such messages: about 2-3 minutes, during which messages stay
-- readable (a writer of a changed row waits for the migration's commit).
UPDATE messages
SET content_tsv = to_tsvector(search_config, chronicle_search.words(chronicle_search.message_text(content)))
WHERE content_tsv IS DISTINCT FROM
      to_tsvector(search_config, chronicle_search.words(chronicle_search.message_text(content)));

-- Search entries: their vector is generated from the stored text; dropping and re-adding the
-- column rewrites the table with the new expression and rebuilds its index once (as migration 010
-- did), with the pending list of migration 018. It comes last: the table is locked, reads
-- included, from here to the migration's commit.
ALTER TABLE search_entries DROP COLUMN content_tsv;
ALTER TABLE search_entries ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector(search_config, chronicle_search.words(content))) STORED;
CREATE INDEX IF NOT EXISTS search_entries_fts ON search_entries USING gin (content_tsv)
    WITH (fastupdate = on, gin_pending_list_limit = 128);
