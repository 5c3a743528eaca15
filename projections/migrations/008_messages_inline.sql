-- Message rows are read far more often than written: every history read returns their bodies.
-- With the default target (2,032 bytes) a row of a ~1 KB message (body, its text and tsvector)
-- is compressed, and every read pays pglz decompression (about 2.3 ms of 1,000 rows' ~5 ms read
-- here) for ~10% less space. Rows up to a page now stay inline and uncompressed; larger ones are
-- still compressed and moved out of line as before. Applies to rows written from now on (a
-- rebuild rewrites them all).
ALTER TABLE messages SET (toast_tuple_target = 8160);
