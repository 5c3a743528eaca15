-- Context memory read models: session config, writable blocks, search entries, skills index,
-- loaded skills, reclaimed tool outputs, and every rendered system prompt.
CREATE TABLE IF NOT EXISTS session_configs (
    tenant      text NOT NULL,
    session_id  text NOT NULL,
    config      jsonb NOT NULL,
    seq         bigint NOT NULL,
    PRIMARY KEY (tenant, session_id)
);

CREATE TABLE IF NOT EXISTS context_blocks (
    tenant      text NOT NULL,
    session_id  text NOT NULL,
    label       text NOT NULL,
    content     text NOT NULL,
    tokens      integer NOT NULL,
    seq         bigint NOT NULL,
    PRIMARY KEY (tenant, session_id, label)
);

CREATE TABLE IF NOT EXISTS search_entries (
    tenant       text NOT NULL,
    session_id   text NOT NULL,
    label        text NOT NULL,
    key          text NOT NULL,
    content      text NOT NULL,
    content_tsv  tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    created_seq  bigint NOT NULL,
    updated_seq  bigint NOT NULL,
    PRIMARY KEY (tenant, session_id, label, key)
);
CREATE INDEX IF NOT EXISTS search_entries_fts ON search_entries USING gin (content_tsv);

CREATE TABLE IF NOT EXISTS skills_index (
    tenant       text NOT NULL,
    bucket       text NOT NULL,
    key          text NOT NULL,
    description  text,
    etag         text NOT NULL,
    size         bigint NOT NULL,
    seq          bigint NOT NULL,
    PRIMARY KEY (tenant, bucket, key)
);

CREATE TABLE IF NOT EXISTS loaded_skills (
    tenant      text NOT NULL,
    session_id  text NOT NULL,
    label       text NOT NULL,
    key         text NOT NULL,
    seq         bigint NOT NULL,
    PRIMARY KEY (tenant, session_id, label, key)
);

CREATE TABLE IF NOT EXISTS reclaimed_outputs (
    tenant        text NOT NULL,
    session_id    text NOT NULL,
    message_id    text NOT NULL,
    tool_call_id  text NOT NULL,
    skill_key     text NOT NULL,
    seq           bigint NOT NULL,
    PRIMARY KEY (tenant, session_id, message_id, tool_call_id)
);

CREATE TABLE IF NOT EXISTS prompts (
    tenant      text NOT NULL,
    session_id  text NOT NULL,
    version     integer NOT NULL,
    text        text NOT NULL,
    tokens      integer NOT NULL,
    reason      text NOT NULL,
    seq         bigint NOT NULL,
    PRIMARY KEY (tenant, session_id, version)
);
