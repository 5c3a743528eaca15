-- Message history read models: sessions registry, message tree with FTS, projection checkpoints.
CREATE TABLE IF NOT EXISTS checkpoints (
    name        text PRIMARY KEY,
    seq         bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS sessions (
    tenant             text NOT NULL,
    id                 text NOT NULL,
    name               text NOT NULL DEFAULT '',
    parent_session_id  text,
    metadata           jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    deleted_at         timestamptz,
    created_seq        bigint NOT NULL,
    last_seq           bigint NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS sessions_by_tenant ON sessions (tenant, created_seq DESC) WHERE deleted_at IS NULL;

CREATE TABLE IF NOT EXISTS messages (
    tenant        text NOT NULL,
    session_id    text NOT NULL,
    id            text NOT NULL,
    parent_id     text,
    role          text NOT NULL,
    content       text NOT NULL,
    body_sha256   text NOT NULL,
    text_content  text NOT NULL DEFAULT '',
    content_tsv   tsvector GENERATED ALWAYS AS (to_tsvector('english', text_content)) STORED,
    created_at    timestamptz NOT NULL,
    seq           bigint NOT NULL,
    updated_seq   bigint NOT NULL,
    PRIMARY KEY (tenant, session_id, id)
);
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages (tenant, session_id, parent_id);
CREATE INDEX IF NOT EXISTS messages_by_seq ON messages (tenant, session_id, seq DESC);
CREATE INDEX IF NOT EXISTS messages_fts ON messages USING gin (content_tsv);
