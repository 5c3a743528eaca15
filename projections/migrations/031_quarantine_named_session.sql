-- The session a quarantined event's bytes name, when it is a session of the tenant whose subject
-- the event was stored on (projections/quarantine.py `named_session`): `named_tenant` is then the
-- subject's tenant and `named_session` the session; both NULL otherwise (bytes that are not a JSON
-- object naming both as strings, or that name another tenant). The projector decides it from the
-- whole event when it records the row (before `raw` is cut to 64 KiB). An erasure finds the
-- session's strays (refused on another subject of the tenant) by it, an equality lookup on
-- `quarantine_named`: before, it searched every tenant's rows' raw bytes and read from the log every
-- row cut at 64 KiB, so one tenant's flood of large refused events slowed every erasure and the
-- projector applying it; and a stray naming another tenant's session showed, by leaving that
-- tenant's quarantine, whether the session was erased. A tenant publishes only on its own session
-- subjects (`<prefix>.<tenant>.pNNN.<session>`), so another tenant's row never names this one.
ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS named_tenant text;
ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS named_session text;
CREATE INDEX IF NOT EXISTS quarantine_named ON quarantine (named_tenant, named_session);
-- An erasure deletes its session's subject's rows too: by this index, not a scan of every tenant's.
CREATE INDEX IF NOT EXISTS quarantine_subject ON quarantine (subject);
-- Rows recorded before: filled where the kept bytes are the whole event (not cut) and Postgres
-- reads them as a JSON object naming a tenant id (1-64 of [A-Za-z0-9_-], so its subject token is
-- the id itself) equal to the subject's tenant token, and a session of at most 128 characters.
-- Bytes that are not UTF-8 or not JSON leave that row NULL (the per-row handler), as does a cut row,
-- whose whole event only the log holds: a rebuild (`chronicle rebuild`) records them as the
-- projector now does, and `chronicle verify` shows such a row until then.
DO $$
DECLARE
    r record;
    body jsonb;
    token text;
BEGIN
    FOR r IN SELECT seq, subject, raw FROM quarantine WHERE named_session IS NULL AND size = octet_length(raw) LOOP
        BEGIN
            body := convert_from(r.raw, 'UTF8')::jsonb;
        EXCEPTION WHEN OTHERS THEN
            CONTINUE;
        END;
        token := (regexp_match(r.subject, '\.([A-Za-z0-9_-]{1,64})\.p[0-9]{3}\.[^.]+$'))[1];
        IF token IS NOT NULL AND jsonb_typeof(body) = 'object'
            AND jsonb_typeof(body -> 'tenant') = 'string' AND jsonb_typeof(body -> 'session') = 'string'
            AND body ->> 'tenant' = token AND char_length(body ->> 'session') <= 128 THEN
            UPDATE quarantine SET named_tenant = token, named_session = body ->> 'session' WHERE seq = r.seq;
        END IF;
    END LOOP;
END
$$;
