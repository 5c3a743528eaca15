-- Compaction: summary overlays (every one, superseded included), failures, and the compactor's
-- own incremental token state (per-message counts, per-session running estimate).
CREATE TABLE IF NOT EXISTS overlays (
    tenant           text NOT NULL,
    session_id       text NOT NULL,
    overlay_id       text NOT NULL,
    from_message_id  text NOT NULL,
    to_message_id    text NOT NULL,
    leaf_id          text NOT NULL,
    summary          text NOT NULL,
    tokens_before    integer NOT NULL,
    tokens_after     integer NOT NULL,
    summarizer       text NOT NULL,
    model            text,
    created_at       timestamptz NOT NULL,
    seq              bigint NOT NULL,
    PRIMARY KEY (tenant, session_id, overlay_id)
);
CREATE INDEX IF NOT EXISTS overlays_by_session ON overlays (tenant, session_id, seq);

CREATE TABLE IF NOT EXISTS compaction_failures (
    tenant      text NOT NULL,
    session_id  text NOT NULL,
    seq         bigint NOT NULL,
    leaf_id     text NOT NULL,
    summarizer  text NOT NULL,
    error       text NOT NULL,
    attempt     integer NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, session_id, seq)
);

-- The compactor's own state, per compactor instance (``worker``), committed with its checkpoint.
CREATE TABLE IF NOT EXISTS compactor_messages (
    worker      text NOT NULL,
    tenant      text NOT NULL,
    session_id  text NOT NULL,
    id          text NOT NULL,
    parent_id   text,
    tokens      integer NOT NULL,
    seq         bigint NOT NULL,
    PRIMARY KEY (worker, tenant, session_id, id)
);
CREATE INDEX IF NOT EXISTS compactor_messages_by_parent ON compactor_messages (worker, tenant, session_id, parent_id);

CREATE TABLE IF NOT EXISTS compactor_overlays (
    worker          text NOT NULL,
    tenant          text NOT NULL,
    session_id      text NOT NULL,
    overlay_id      text NOT NULL,
    from_id         text NOT NULL,
    to_id           text NOT NULL,
    summary_tokens  integer NOT NULL,
    seq             bigint NOT NULL,
    PRIMARY KEY (worker, tenant, session_id, overlay_id)
);

CREATE TABLE IF NOT EXISTS compactor_sessions (
    worker         text NOT NULL,
    tenant         text NOT NULL,
    session_id     text NOT NULL,
    leaf_id        text,
    estimate       integer NOT NULL DEFAULT 0,
    prompt_tokens  integer NOT NULL DEFAULT 0,
    compact_after  integer,
    seq            bigint NOT NULL,
    PRIMARY KEY (worker, tenant, session_id)
);
