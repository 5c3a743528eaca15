-- Only the first 100,000 characters of a text are indexed. Postgres refuses a tsvector whose
-- lexemes and positions take more than 1 MiB ("string is too long for tsvector"), and a message
-- of ~900 KB of distinct words was answered 201 by the API and then refused by the database: the
-- projector quarantined it as data_error and the message was never readable (found by the
-- pentest). The same held for a searchable context block's entry (its generated vector) and for a
-- re-index (search_languages.py). Every vector, and every query, is made from
-- chronicle_search.words, so the bound lives there: the live projector, a rebuild (which runs this
-- migration too), a change of language and the generated column of search_entries all cut the same
-- text at the same place. A query is at most 1,000 characters: the bound never reaches it.
--
-- Why 100,000 characters. What Postgres counts against its 1 MiB is, for each distinct lexeme, its
-- bytes, at most one byte of alignment, a 2-byte count and 2 bytes per position kept. A lexeme of
-- L characters takes at least L + 1 characters of input (itself and a separator) and at most 4L
-- bytes (UTF-8; lower-casing maps one character to one character, and the stemmers only shorten),
-- so each input character costs at most (4L + 5) / (L + 1) <= 4.5 bytes, the worst case being
-- distinct one-character words of 4-byte letters; another occurrence of a lexeme costs a 2-byte
-- position for at least 2 characters. 100,000 characters therefore make at most ~450 KB of the
-- 1 MiB, and the whole vector (with its 4-byte entry per lexeme) at most ~650 KB: measured, 50,000
-- distinct 4-byte letters between spaces make a 600 KB vector. The bound is in characters: left()
-- never cuts a multi-byte character.
--
-- Cost: left() of a short text is a few hundred nanoseconds, and a long text is now cut before the
-- regular expression and the parser read it (less work than before, not more).
CREATE OR REPLACE FUNCTION chronicle_search.words(content text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT regexp_replace(left(content, 100000), '[!-/:-@[-`{-~]', ' ', 'g')
$$;

-- Existing rows whose text is longer than the bound (a text of at most 100,000 bytes has at most
-- that many characters, so only those rows can change) get the vector a rebuild would give them:
-- messages from their body, search entries by rewriting their stored text (an update recomputes
-- the generated column). octet_length of a stored (TOASTed) value is read from its header,
-- without reading the value.
UPDATE messages
SET content_tsv = to_tsvector(search_config, chronicle_search.words(chronicle_search.message_text(content)))
WHERE text_bytes > 100000;
UPDATE search_entries SET content = content WHERE octet_length(content) > 100000;
