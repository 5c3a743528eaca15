-- Which event log the read models were made from: for each projector (the owner of a set of
-- checkpoints, `<name>` and `<name>.pNNN`), the JetStream stream its checkpoints count in and
-- that stream's identity as JetStream reports it (the stream's creation time, from stream info).
-- A stream deleted and made again under the same name has another creation time: every
-- component refuses to start on a mismatch (projections/logbinding.py), instead of skipping the
-- new log's first events as already applied. Recorded by the first component that starts on an
-- empty binding; rewritten by a rebuild and by `chronicle log rebind --yes`.
CREATE TABLE IF NOT EXISTS log_binding (
    projector       text PRIMARY KEY,
    stream          text NOT NULL,
    stream_created  timestamptz,          -- NULL: the server did not report it (last-seq check only)
    first_seen      timestamptz NOT NULL DEFAULT now()
);
