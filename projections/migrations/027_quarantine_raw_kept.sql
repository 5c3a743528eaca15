-- A quarantined event keeps its first 64 KiB (`raw`) and its whole size (`size`); the whole event
-- stays in the log at its sequence (`chronicle replay`, `GET …/events`). Before, every refused
-- event's bytes (up to 1 MiB each) were copied into Postgres: a tenant publishing large junk
-- filled the database about as fast as it published, and a batch of a thousand such rows was one
-- insert parameter over Postgres's 1 GB message limit, halting every tenant's projector (found by
-- the adversarial trial). Rows recorded before are cut the same way, so a rebuild (which records
-- the same 64 KiB) still equals them.
ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS size integer;
UPDATE quarantine SET size = octet_length(raw), raw = substring(raw FROM 1 FOR 65536) WHERE size IS NULL;
ALTER TABLE quarantine ALTER COLUMN size SET NOT NULL;
