-- Storage per message (issue #13): a message's text is no longer stored twice. The row kept the
-- body as stored JSON and, beside it, the indexed text (its text parts joined by newlines, ~205
-- bytes of a ~1,060-byte row for a ~200-character message) from which the stored tsvector was
-- generated. Now the projector computes the tsvector from the text it derives from the event and
-- stores the vector (search ranks with it, so it stays stored) and the text's length in bytes
-- (BM25's document length); the text itself is derived from the body where search shows it, for
-- the hits it returns only (message_text below, the same text as events/messages.py text_of, on
-- which it is tested).
--
-- message_text lives in chronicle_search with the configurations (migration 010): a rebuild
-- migrates a shadow schema and drops it. IMMUTABLE: it reads nothing but its argument. Every stored
-- body is one jsonb accepts: admission refuses NaN/Infinity, NUL and lone surrogates.
CREATE OR REPLACE FUNCTION chronicle_search.message_text(content text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(string_agg(p ->> 'text', E'\n' ORDER BY i), '')
    FROM (SELECT content::jsonb -> 'parts' AS parts) b,
         jsonb_array_elements(CASE jsonb_typeof(b.parts) WHEN 'array' THEN b.parts ELSE '[]'::jsonb END)
             WITH ORDINALITY AS e(p, i)
    WHERE jsonb_typeof(p) = 'object' AND p -> 'type' = '"text"'::jsonb AND jsonb_typeof(p -> 'text') = 'string'
$$;

-- The vector keeps its values (no longer generated: written by the projector, with the row's
-- configuration, which it now takes from search_languages itself: the insert trigger of migration
-- 010 stays on search_entries only).
ALTER TABLE messages ALTER COLUMN content_tsv DROP EXPRESSION;
DROP TRIGGER IF EXISTS messages_search_config ON messages;
ALTER TABLE messages DROP COLUMN text_content;
-- Existing rows get their length from their body (the text the dropped column held). The update
-- writes each row once more, without the dropped column's bytes; the old versions' space is reused
-- by new rows after a VACUUM (autovacuum, or by hand where it is off).
ALTER TABLE messages ADD COLUMN text_bytes integer;
UPDATE messages SET text_bytes = octet_length(chronicle_search.message_text(content));
ALTER TABLE messages ALTER COLUMN text_bytes SET NOT NULL;
