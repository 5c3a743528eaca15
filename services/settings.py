"""Typed settings for every Chronicle process (``CHRONICLE_`` environment variables or ``.env``)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import SplitResult, urlsplit

import nkeys
import psycopg
import psycopg.conninfo
from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from events.context import BUCKET_RE
from events.credentials import is_user_public_key, nkey_public_key, tenant_nkey_seed
from events.ids import InvalidId, check_tenant
from events.objectstore import OBJECT_STORE_RE
from events.subjects import SubjectLayout
from projections.keystore import KEY_CACHE_SESSIONS, LocalKek
from projections.search_bound import SEARCH_TIMEOUT_S
from projections.search_languages import Language


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_api_key() -> str:
    return "chr_" + secrets.token_urlsafe(24)


_SECRET_LIKE = re.compile(r"chr_|S[A-Z][A-Z2-7]{50,}$")
"""How an API key (:func:`new_api_key`) or an NKey seed begins: not a tenant id, whatever
``check_tenant`` lets through, and never printed in a refusal."""


def new_operator_seed() -> str:
    """A fresh NKey user seed for Chronicle's own (operator) NATS identity."""
    return str(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER).decode())


class UnusableSetting(ValueError):
    """A setting Chronicle cannot use (a file that is not there, a malformed key); the message
    names the setting and what to set."""


class UnusableResource(Exception):
    """What a setting names cannot be used now (a port another process listens on); the message
    names the setting. Not the setting's form (that is :class:`UnusableSetting`): the thing it names."""


class Settings(BaseSettings):
    """Working defaults for the local stack; override with ``CHRONICLE_<NAME>``."""

    # a refused value is never printed back (a raw API key pasted into CHRONICLE_API_KEYS, say)
    model_config = SettingsConfigDict(
        env_prefix="CHRONICLE_", env_file=".env", extra="ignore", hide_input_in_errors=True
    )
    _file_entries: tuple[ApiKeyEntry, ...] | None = PrivateAttr(default=None)
    """The entries of ``api_keys_file`` as last read (by the first use of the keys, or by
    :meth:`with_keys_file_read`); None until then: a process that uses no tenant key never reads it."""
    _encryption_record: Path | None = PrivateAttr(default=None)
    """The ``stack.json`` that ``encryption`` was taken from (:meth:`with_local_stack`); None when
    it is set here or left at its default."""

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        description="one URL, or several comma-separated (the nodes of a cluster: a client reconnects to another "
        "when its node goes), each nats://host:port (a bare host:port is taken as nats://host:port); "
        "user:password@ in the URL works; tls://… for TLS",
    )
    nats_nkey_seed: SecretStr | None = Field(
        default=None,
        description="NKey user seed of Chronicle's own (operator) NATS identity; `chronicle keygen --operator`",
    )
    nats_route_password: SecretStr | None = Field(
        default=None,
        description="a NATS cluster's route password (`chronicle nats-config --cluster-port`): nodes open routes "
        "to each other with it",
    )
    nats_creds_file: str | None = Field(default=None, description="NATS credentials file (JWT and NKey seed)")
    nats_tls_ca_file: str | None = Field(default=None, description="CA bundle that signed the NATS server's cert")
    nats_tls_cert_file: str | None = Field(default=None, description="client certificate, for mutual TLS")
    nats_tls_key_file: str | None = Field(default=None, description="the client certificate's key")
    nats_sync_interval: str | None = Field(
        default=None,
        description="how often the nats-server that `chronicle up` runs, or that `chronicle nats-config` "
        "configures, writes JetStream to disk (fsync): `always` (every write, before it is acknowledged; "
        "fewer writes a second) or a duration such as `10s` or `1m30s`; unset: the server's default, 2m (a "
        "power loss of a lone NATS host can lose up to that much acknowledged writes: README, Guarantees)",
    )
    database_url: str = Field(
        default="postgresql://postgres@127.0.0.1:5432/chronicle",
        description="postgresql://user[:password]@host[:port]/dbname (postgres:// too), or a libpq key=value "
        "string (host=… dbname=…); anything else stops every process at start",
    )
    stream: str = "CHRONICLE"
    subject_prefix: str = "chronicle.ev"
    command_workers: int = Field(
        default=64, ge=1, le=4096, description="`chronicle commands`: requests one process answers at a time"
    )
    follow_streams_per_tenant: PositiveInt = Field(
        default=64,
        description="followed event answers (`GET …/events?follow=true`) one tenant may hold open in one API "
        "process at once with its full keys, and as many with its read-only keys; past it: 429 too_many_streams",
    )
    rate_limit: NonNegativeFloat = Field(
        default=0,
        description="requests a second each tenant may make to one API or `chronicle commands` process (a token "
        "bucket per tenant; over it: 429 rate_limited with Retry-After, nothing done); 0: no limit. A request counts "
        "once per event it publishes (a messages:batch of N messages N, a fork copying N events N + 1), or once per "
        "`rate_limit_token_bytes` of its body when that is more, charged "
        "before it publishes (what it then does not publish given back) and taking the bucket into debt that the "
        "tenant's next requests wait out. With N "
        "processes a tenant's ceiling is N times this",
    )
    rate_limit_burst: NonNegativeInt = Field(
        default=0,
        description="requests (events: a batch or fork counts each one) a tenant may make at once before "
        "`rate_limit` applies; 0: one second's worth",
    )
    rate_limit_token_bytes: NonNegativeInt = Field(
        default=64 * 1024,
        description="under a request limit, the body bytes one token pays for: a request counts at least one token "
        "per this many bytes of its body begun (HTTP and commands), the larger of that and the events it publishes, "
        "taken before the body is read (a chunked one as it arrives); 0: bodies are not weighed",
    )
    rate_limits: dict[str, NonNegativeFloat] = Field(
        default_factory=dict,
        description="tenant -> requests (events) a second, instead of `rate_limit` for that tenant (0: no limit "
        "for it, and nothing charged)",
    )
    command_prefix: str = Field(
        default="chronicle.cmd",
        description="where tenants send commands over NATS request/reply: <command_prefix>.<tenant>.<command> "
        "(`chronicle commands` answers them); outside the stream's subjects",
    )
    partitions: int = Field(default=16, ge=1, le=1024)
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="copies of the event stream (and the blob bucket) on a NATS cluster: 3 in production; at "
        "start a process refuses a count the cluster cannot hold, or a stream that has fewer (move it with "
        "`chronicle stream-replicas N`)",
    )
    consumer_replicas: int = Field(
        default=1,
        ge=0,
        le=5,
        description="copies of each projector's consumer; 0: the stream's. One is enough: "
        "a runner's position is its checkpoint in Postgres, and it makes its consumer anew at every start or "
        "failure, so a consumer lost with its node costs a re-position, not data",
    )

    payload_limit_bytes: int = Field(default=256 * 1024, ge=1024, description="larger bodies go to object storage")
    max_message_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    max_request_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="bodies over this many bytes are refused before they are read (`413 payload_too_large`; "
        "services/api/guards.py); unset: 3 times `max_message_bytes` + 1 MiB, enough for any one message at its "
        "limit even with every non-ASCII character \\u-escaped. A batch larger than this must be split",
    )
    max_skill_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="the largest skill document (UTF-8 bytes) a skill put (`chronicle skills put`, the "
        "`set_context` tool on a skills block) stores, else refused (`413 skill_too_large`, nothing stored), and "
        "that `load_context` loads: one stored larger (before this bound, or uploaded out of band) is answered "
        "`Error: …` and not loaded (its whole text was the tool's result, for the LLM's context)",
    )
    blob_bucket: str = "chronicle-blobs"

    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_hot_paths: bool = Field(
        default=True,
        description="serve a plain append and a plain history read without FastAPI's routing (services/api/hot.py; "
        "same answers, less CPU); off: every request through the routes",
    )
    api_reuse_port: bool = Field(
        default=False,
        description="listen with SO_REUSEPORT, so several `chronicle api` processes share the port and the kernel "
        "spreads connections over them (`chronicle up --api-processes N`)",
    )
    api_max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="the largest request head (request line and headers) the API reads: past it, `431 "
        "header_too_large` and the connection closes; nothing reaches the app (services/api/http_head.py)",
    )
    api_header_timeout_s: PositiveFloat = Field(
        default=10.0,
        description="how long the API waits for a request's headers, from its first byte (or from the "
        "connection's opening): past it the connection is closed (slow clients cannot hold connections)",
    )
    api_body_timeout_s: PositiveFloat = Field(
        default=30.0,
        le=3600,
        description="how long the API waits for a request's whole body, from when its headers are read, plus the "
        "time its bytes take at `api_body_min_bytes_per_s`: past it, `408 request_timeout` and the connection "
        "closes; nothing of the request is done (services/api/body_timeout.py)",
    )
    api_body_min_bytes_per_s: NonNegativeInt = Field(
        default=64 * 1024,
        le=1024 * 1024 * 1024,
        description="each byte of a body that has arrived gives it 1/this many seconds more than "
        "`api_body_timeout_s` (a large body over a slow link still arrives; one that trickles does not); "
        "0: the whole body within `api_body_timeout_s`, whatever its size",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="entries 'tenant:sha256-hex-of-key[:nkey-public-key]' (a full key) or "
        "'tenant:sha256-hex-of-key:read-only' (reads only: every other method, and `GET …/data-key`, is 403 "
        "read_only_key; no NATS identity); see `chronicle keygen`. A full key's third field lets the tenant "
        "publish to NATS directly (its credentials are derived from the same key)",
    )
    api_keys_file: str | None = Field(
        default=None,
        description="a file of more `api_keys` entries, one a line (blank lines and lines starting with '#' "
        "skipped), used with `api_keys` (both count), read by the processes that use the keys (`api`, "
        "`nats-config`, `up`, `erase`): a file that does not read, an empty one or a bad line stops those at "
        "start, naming the file and the line; the others never read it. Edit it and send SIGHUP to `chronicle "
        "api` (or `chronicle up`): the keys change for the next requests, without a restart "
        "(docs/security.md, Rotate credentials)",
    )
    ops_key: SecretStr | None = Field(
        default=None,
        description="when set, /metrics, /readyz, /docs, /redoc and /openapi.json need 'Authorization: Bearer "
        "<ops key>' (they show every tenant's totals); /healthz stays open",
    )
    db_pool_min: int = Field(default=2, ge=0, le=1000, description="Postgres connections kept open per process")
    db_pool_max: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="at most this many per process (`chronicle up` caps it, unless set, so that its processes "
        "fit the server's max_connections)",
    )
    key_cache_sessions: int = Field(
        default=KEY_CACHE_SESSIONS,
        ge=1_000,
        le=100_000_000,
        description="sessions whose data key (or its absence) a process keeps in memory, the least recently "
        "used evicted first (about 2.5 KB each; an evicted one is read from Postgres again when next needed). "
        "Erased sessions are kept apart, all of them; a rebuild or verify holds every key",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    read_wait_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="how long a read (`min_seq`) or a write waits for the projection to apply the session's "
        "events, and how long a write waits for its turn behind the same session's other writes in this "
        "process (past it: `503 projection_timeout`, or `503 contention` for the turn)",
    )
    search_timeout_s: float = Field(
        default=SEARCH_TIMEOUT_S,
        gt=0,
        le=3600,
        description="how long one search's statements may run in Postgres (`GET …/search`, the search tools); "
        "past it the search is cancelled: `503 search_timeout` (a tool answers `Error: …`)",
    )
    search_slots: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="searches one process runs at once (`GET …/search`, the search tools): a search past it "
        "waits for one to end, up to `search_timeout_s`, then `429 search_busy`; default half of `db_pool_max`",
    )
    search_slots_per_tenant: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="searches one tenant runs at once in one process; one more is `429 search_busy` at once "
        "(`Retry-After`); default half of `search_slots`",
    )
    as_of_slots: int = Field(
        default=4,
        ge=1,
        le=1000,
        description="time-travel reads (`as_of_seq` on `GET …/history` and `GET …/context`) one process folds "
        "from the log at once: one past it waits for one to end, up to 10 s, then `429 as_of_busy`",
    )
    as_of_slots_per_tenant: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="time-travel reads one tenant has folded at once in one process; one more is "
        "`429 as_of_busy` at once (`Retry-After`)",
    )
    readiness_stall_s: float = Field(
        default=60.0, ge=0, description="readyz is 503 when a projector has not advanced this long while events wait"
    )
    readiness_max_lag: int = Field(default=100_000, ge=0, description="readyz is 503 past this many unapplied events")
    readiness_compactor: bool = Field(
        default=True,
        description="readyz is 503 while no `chronicle compactor` runs (compaction requests would wait); false "
        "for a deployment that runs none on purpose",
    )
    readiness_compaction_wait_s: float = Field(
        default=300.0,
        ge=0,
        description="readyz is 503 when the oldest compaction request has waited this long while no compactor "
        "took, finished or asked for one (a compactor that hangs keeps its presence); longer than one summary "
        "may take (`summarizer_timeout_s` times `summarizer_attempts`); 0: not checked; not checked either "
        "with `readiness_compactor` false",
    )
    readiness_commands: bool = Field(
        default=True,
        description="readyz is 503 while no `chronicle commands` answers a ping on the operator's own subject "
        "within 2 s (none runs, or it hangs); false for a deployment that answers no commands over NATS on "
        "purpose (HTTP only)",
    )
    command_attempts: int = Field(
        default=100,
        ge=1,
        description="attempts of a state-dependent write whose publish conflicts (another process wrote to the "
        "session first) before `503 contention`",
    )
    auto_migrate: bool = True

    projector_name: str = "projector"
    projector_batch: int = Field(default=1000, ge=1)
    projector_partitions: list[int] | None = Field(
        default=None, description="partitions this projector consumes; None = all"
    )
    api_processes: int = Field(
        default=1, ge=1, le=64, description="`chronicle up`: API processes on the one port (SO_REUSEPORT)"
    )
    projector_workers: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="`chronicle up`: projector processes, each with its share of partitions (fastest when "
        "partitions equals workers: one subject filter per consumer)",
    )

    tiktoken_encoding: str = "cl100k_base"
    search_languages: dict[str, Language] = Field(
        default_factory=dict,
        description="tenant -> search language (english, simple, german, french, spanish, italian, portuguese, "
        "dutch, swedish, russian); tenants not named are english (Porter, as the reference). The database keeps "
        "the languages in force: `chronicle migrate` makes them these (re-indexing the tenants whose language "
        "changed); a service started with other ones logs so and keeps the stored ones",
    )

    s3_endpoint: str = Field(
        default="127.0.0.1:9000",
        description="host:port of S3/MinIO (no port: 80, or 443 with `s3_secure`); http://host:port or "
        "https://host:port is taken too, its scheme setting `s3_secure` (one that says otherwise is refused). "
        "No path, no credentials (`s3_access_key`, `s3_secret_key`)",
    )
    s3_access_key: str = "minioadmin"
    s3_secret_key: str = "minioadmin"  # noqa: S105 - the local MinIO default, override in production
    s3_secure: bool = Field(default=False, description="HTTPS to `s3_endpoint` (an https:// endpoint sets it)")
    s3_region: str | None = None

    compactor_name: str = Field(
        default="compactor",
        description="the name under which compactors consumed the log before the projector kept the compaction "
        "state: its durable consumer is deleted when a compactor starts",
    )
    compactor_concurrency: int = Field(
        default=4,
        ge=1,
        le=64,
        description="sessions one compactor process summarises at once; also the manual compactions "
        "(POST …/compact) one API or command process runs at once (more are 429 rate_limited)",
    )
    compaction_queue: str = Field(
        default="compaction",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the one durable consumer every compactor takes compaction requests from",
    )
    compaction_attempts: int = Field(
        default=4, ge=1, le=20, description="summaries tried for one request before compaction.failed is recorded"
    )
    compaction_backoff_s: tuple[PositiveFloat, ...] = Field(
        default=(10.0, 60.0, 300.0),
        min_length=1,
        description="redelivery delays of a request after its 1st, 2nd, … failed attempt (the last repeats); "
        "the first is also how long a compactor that stopped answering (killed) holds a request",
    )
    summarizer: Literal["offline", "openai"] = "offline"
    summarizer_base_url: str = "http://127.0.0.1:11434/v1"
    summarizer_model: str | None = None
    summarizer_api_key: str | None = None
    summarizer_timeout_s: float = Field(default=60.0, gt=0)
    summarizer_attempts: int = Field(default=3, ge=1)

    originals_bucket: str = "chronicle-originals"
    claim_check_store: Literal["nats", "s3"] = Field(
        default="nats",
        description="where bodies over `payload_limit_bytes` go (the event carries a reference): the JetStream "
        "object store (`blob_bucket`, replicated as the stream is) or S3/MinIO (`claim_check_bucket`). Either way "
        "bodies written before a change keep reading from where they are",
    )
    claim_check_bucket: str = "chronicle-bodies"
    archive_bucket: str = Field(
        default="chronicle-archive", description="`chronicle archive`: where the log is copied for auditors (S3/MinIO)"
    )
    row_cap_bytes: int = Field(default=1_800_000, ge=10_000, description="larger messages are stored capped")

    data_dir: str = Field(
        default=".chronicle",
        description="`chronicle up`'s state (its NATS and embedded Postgres data, operator seed, key-encryption "
        "key, API key) and its record of the stack it runs (`stack.json`): a command run with the same data dir "
        "and no CHRONICLE_NATS_URL reaches that stack's NATS, with its operator identity, key-encryption key, "
        "database (unless CHRONICLE_DATABASE_URL is set) and encryption (unless CHRONICLE_ENCRYPTION is set)",
    )

    encryption: bool = Field(
        default=False,
        description="seal the personal fields of new events, claim-checked bodies and originals with per-session "
        "data keys (erasure by crypto-shredding; docs/security.md); needs a key-encryption key. `chronicle up` and "
        "compose.yaml turn it on; off by default here so that a deployment upgraded in place keeps running "
        "without a key it does not have yet",
    )
    kek: SecretStr | None = Field(
        default=None,
        description="key-encryption keys that wrap the data keys: 'id:base64 of 32 bytes', several comma-separated, "
        "the newest (current) first; `chronicle keys new-kek` makes one",
    )
    kek_file: str | None = Field(default=None, description="a file holding `kek` (a secrets mount)")

    def key_wrapper(self) -> LocalKek | None:
        """The key-encryption keys (setting, else file); None when neither is set."""
        new = "`chronicle keys new-kek` makes one"
        if self.kek is not None:
            try:
                return LocalKek.parse(self.kek.get_secret_value())
            except ValueError as exc:
                raise UnusableSetting(f"CHRONICLE_KEK is not a key-encryption key: {exc} ({new})") from None
        if self.kek_file:
            try:
                text = Path(self.kek_file).read_text()
            except OSError as exc:
                raise UnusableSetting(
                    f"CHRONICLE_KEK_FILE {self.kek_file!r} cannot be read ({exc.strerror or type(exc).__name__}): set "
                    "it to the stack's key-encryption key file (`make up`'s is .chronicle/kek)"
                ) from None
            try:
                return LocalKek.parse(text)
            except ValueError as exc:
                raise UnusableSetting(
                    f"CHRONICLE_KEK_FILE {self.kek_file!r} holds no key-encryption key: {exc} ({new})"
                ) from None
        return None

    def sealing_key_wrapper(self) -> LocalKek | None:
        """:meth:`key_wrapper`, for a process that seals with ``encryption`` on:
        :class:`UnusableSetting` when it is on and no key-encryption key is set, naming where it
        was turned on (a command beside ``chronicle up`` takes it from the stack's ``stack.json``,
        never from a setting the user made)."""
        wrapper = self.key_wrapper()
        if not self.encryption or wrapper is not None:
            return wrapper
        if self._encryption_record is not None:
            raise UnusableSetting(
                f"{self._encryption_record} (`chronicle up`'s record of its stack) says the stack seals "
                "(CHRONICLE_ENCRYPTION on there) and records no key-encryption key file: it was given "
                "CHRONICLE_KEK or CHRONICLE_KEK_FILE; set the same here, or CHRONICLE_ENCRYPTION=false"
            )
        raise UnusableSetting(
            "CHRONICLE_ENCRYPTION is on and no key-encryption key is set (CHRONICLE_KEK or CHRONICLE_KEK_FILE)"
        )

    def with_local_stack(self) -> Settings:
        """These settings, completed by what ``chronicle up`` recorded in ``data_dir``
        (:class:`LocalStack`): its NATS address when ``nats_url`` is not set (environment, ``.env``
        or secrets file: a setting always wins), and with the stack's address its operator seed
        and key-encryption key file when no identity (seed, credentials file) or key is set. No
        record: these settings as they are. With the stack's address goes its database too, unless
        ``database_url`` is set: ``up`` may run on embedded Postgres, which no default reaches; and
        its S3 endpoint unless ``s3_endpoint`` is set (``up --s3-port`` moves its local S3), and its
        ``encryption`` unless that is set (a command that writes beside a sealing stack seals)."""
        stack = LocalStack.read(Path(self.data_dir))
        if stack is None:
            return self
        update: dict[str, object] = {}
        if "nats_url" not in self.model_fields_set:
            update["nats_url"] = stack.nats_url
        if update.get("nats_url", self.nats_url) != stack.nats_url:
            return self  # another server than the stack's: nothing of the stack's goes with it
        if self.nats_nkey_seed is None and not self.nats_creds_file and stack.nats_nkey_seed_file:
            update["nats_nkey_seed"] = SecretStr(_stack_file(stack.nats_nkey_seed_file, "operator seed"))
        if self.kek is None and not self.kek_file and stack.kek_file:
            update["kek_file"] = stack.kek_file
        if "database_url" not in self.model_fields_set and stack.database_url:
            update["database_url"] = stack.database_url
        if "s3_endpoint" not in self.model_fields_set and stack.s3_endpoint:  # `up --s3-port` moves it
            endpoint, secure = s3_endpoint(stack.s3_endpoint)
            update["s3_endpoint"] = endpoint
            if "s3_secure" not in self.model_fields_set:
                update["s3_secure"] = bool(secure)
        taken = "encryption" not in self.model_fields_set and stack.encryption is not None
        if taken:
            update["encryption"] = stack.encryption
        completed = self.model_copy(update=update)
        if taken:
            completed._encryption_record = Path(self.data_dir) / STACK_RECORD
        return completed

    def request_bytes_limit(self) -> int:
        """The largest request body the API reads (``max_request_bytes``, or its default)."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        return 3 * self.max_message_bytes + 1024 * 1024

    def nats_servers(self) -> list[str]:
        """The NATS URLs of ``nats_url``, in order (a cluster's nodes, or one server)."""
        servers = [url.strip() for url in self.nats_url.split(",") if url.strip()]
        if not servers:
            raise ValueError("CHRONICLE_NATS_URL names no server")
        return servers

    def s3_address(self) -> tuple[str, int]:
        """The host and port of ``s3_endpoint`` (no port given: 443 with ``s3_secure``, else 80)."""
        parts = urlsplit("//" + self.s3_endpoint)
        return parts.hostname or "", parts.port or (443 if self.s3_secure else 80)

    def layout(self) -> SubjectLayout:
        return SubjectLayout(
            stream=self.stream, prefix=self.subject_prefix, partitions=self.partitions, commands=self.command_prefix
        )

    @field_validator("database_url")
    @classmethod
    def _database_url_parses(cls, url: str) -> str:
        """A connection string psycopg reads, so that a malformed one stops every process at start
        in one line naming it, never printed (it may hold a password), instead of a traceback in each
        (and ``chronicle up`` starting an empty embedded Postgres in its place)."""
        return check_database_url(url)

    @field_validator("nats_url")
    @classmethod
    def _nats_urls_parse(cls, value: str) -> str:
        """Each server a URL nats-py connects to; a bare ``host:port`` is taken as
        ``nats://host:port`` (the form ``chronicle up`` records, so it still finds its stack)."""
        return nats_urls(value)

    @field_validator("nats_sync_interval")
    @classmethod
    def _sync_interval_parses(cls, value: str | None) -> str | None:
        """``always`` or a duration nats-server reads; empty is unset (compose's
        ``${CHRONICLE_NATS_SYNC_INTERVAL:-}``)."""
        return sync_interval(value) if value and value.strip() else None

    @field_validator("originals_bucket", "claim_check_bucket", "archive_bucket")
    @classmethod
    def _s3_bucket_named(cls, bucket: str) -> str:
        if not BUCKET_RE.fullmatch(bucket):
            raise ValueError(
                "not an S3 bucket name (3 to 63 characters: lower-case letters, digits, '.' and '-', starting "
                "and ending with a letter or digit)"
            )
        return bucket

    @field_validator("blob_bucket")
    @classmethod
    def _object_store_named(cls, bucket: str) -> str:
        """A JetStream object store's name as nats-py and the server take it (its stream is
        ``OBJ_<bucket>``), so a bad one stops every process at start in one line, not in a
        traceback of the first claim-checked body."""
        if not OBJECT_STORE_RE.fullmatch(bucket):
            raise ValueError("not a JetStream object store name (1 to 251 characters: letters, digits, '-' and '_')")
        return bucket

    @field_validator("s3_endpoint")
    @classmethod
    def _s3_endpoint_parses(cls, endpoint: str) -> str:
        s3_endpoint(endpoint)
        return endpoint

    @model_validator(mode="after")
    def _s3_endpoint_is_host_port(self) -> Settings:
        """``s3_endpoint`` as the S3 client takes it, ``host[:port]``; ``http://`` or ``https://``
        before it sets ``s3_secure`` (refused when ``s3_secure`` is set to say otherwise)."""
        endpoint, secure = s3_endpoint(self.s3_endpoint)
        if secure is not None:
            if "s3_secure" in self.model_fields_set and self.s3_secure != secure:
                raise ValueError(
                    f"CHRONICLE_S3_ENDPOINT says {'https' if secure else 'http'}:// and CHRONICLE_S3_SECURE says "
                    f"{str(self.s3_secure).lower()}: drop the scheme or the setting"
                )
            self.s3_secure = secure
        if endpoint != self.s3_endpoint:
            self.s3_endpoint = endpoint
        return self

    @field_validator("ops_key")
    @classmethod
    def _ops_key_given(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not key.get_secret_value().strip():
            raise ValueError(
                "a blank ops key: give one (`Authorization: Bearer <ops key>`), "
                "or leave CHRONICLE_OPS_KEY unset for open operator routes"
            )
        if key is not None and key.get_secret_value() != key.get_secret_value().strip():
            # an HTTP server strips a header's surrounding blanks: no client could send this key
            raise ValueError("the ops key starts or ends with whitespace, which no request can carry: remove it")
        return key

    @field_validator("api_keys")
    @classmethod
    def _entries_parse(cls, entries: list[str]) -> list[str]:
        """Each entry parses as every process reads it, so a typo stops all of them at start, in one
        line naming the entry by its place and tenant, never by its text (a raw key pasted there by
        mistake would be in every process's log)."""
        for index, entry in enumerate(entries):
            try:
                ApiKeyEntry.parse(entry)
            except ValueError as exc:
                raise ValueError(f"api_keys entry {index} (counting from 0): {exc}") from None
        return entries

    @field_validator("api_keys_file")
    @classmethod
    def _key_file_absolute(cls, path: str | None) -> str | None:
        """Kept as an absolute path, so that a child process in another directory reads the same
        file; not read here (:meth:`api_key_entries` reads it): a process that uses no tenant key
        (a projector, ``migrate``) starts whatever the file holds. Empty is unset (compose's
        ``${CHRONICLE_API_KEYS_FILE:-}``)."""
        if not path:
            return None
        return str(Path(path).resolve())

    @field_validator("rate_limits", "search_languages")
    @classmethod
    def _tenants_named(cls, by_tenant: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        for tenant in by_tenant:
            try:
                check_tenant(tenant)
            except InvalidId as exc:
                raise ValueError(f"{info.field_name} names {tenant!r}, not a tenant: {exc}") from exc
        return by_tenant

    def as_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (an environment) with exactly these settings as ``CHRONICLE_*`` variables, for
        a child process: a setting that is None is removed."""
        env = dict(base)
        for name, value in self.model_dump().items():
            key = f"CHRONICLE_{name.upper()}"
            if value is None:
                env.pop(key, None)
            elif isinstance(value, SecretStr):
                env[key] = value.get_secret_value()
            else:
                env[key] = json.dumps(value) if isinstance(value, list | tuple | dict) else str(value)
        return env

    def api_key_entries(self) -> list[ApiKeyEntry]:
        """Every key entry: ``api_keys``'s, then ``api_keys_file``'s as it was last read (read
        now, the first time: a file that does not read or parse is an :class:`UnusableSetting`
        naming the file and the line, and is read again at the next call)."""
        return [*(ApiKeyEntry.parse(entry) for entry in self.api_keys), *self._read_file_entries()]

    def file_entry_count(self) -> int:
        """How many entries ``api_keys_file`` held when last read."""
        return len(self._read_file_entries())

    def _read_file_entries(self) -> tuple[ApiKeyEntry, ...]:
        if self._file_entries is None:
            self._file_entries = tuple(read_api_keys_file(self.api_keys_file)) if self.api_keys_file else ()
        return self._file_entries

    def with_keys_file_read(self) -> Settings:
        """These settings with ``api_keys_file`` read again (``api_keys`` kept): what a reload
        (SIGHUP) serves. A file that does not read, or a bad line, is an :class:`UnusableSetting`
        naming the file (and the line), and these settings are left as they are."""
        entries = tuple(read_api_keys_file(self.api_keys_file)) if self.api_keys_file else ()
        copy = self.model_copy()
        copy._file_entries = entries
        return copy

    def grants_by_key_hash(self) -> dict[str, KeyGrant]:
        """What each key (by its SHA-256) may do: its tenant, and whether it only reads."""
        return {e.digest: KeyGrant(e.tenant, e.read_only) for e in self.api_key_entries()}

    def tenant_nkeys(self) -> dict[str, list[str]]:
        """The NKey public keys each tenant may publish with (entries that carry one)."""
        table: dict[str, list[str]] = {}
        for e in self.api_key_entries():
            if e.nkey is not None and not e.read_only:
                table.setdefault(e.tenant, []).append(e.nkey)
        return table


DATABASE_URL_FORM = "postgresql://user[:password]@host[:port]/dbname, or libpq's host=… dbname=…"
DATABASE_SCHEMES = ("postgresql", "postgres")


def check_database_url(url: str) -> str:
    """``url`` when psycopg reads it as a PostgreSQL connection string (a ``postgresql://`` or
    ``postgres://`` URL, or libpq's ``key=value`` form); else a :class:`ValueError` that says why
    without the string (it may hold a password) and the form expected."""
    if not url.strip():
        raise ValueError(f"empty: set it to {DATABASE_URL_FORM}")
    scheme, has_scheme, _ = url.partition("://")
    if has_scheme and scheme.lower() not in DATABASE_SCHEMES:
        shown = f"{scheme[:20]!r}" if scheme.isascii() and scheme.replace("+", "").isalnum() else "another"
        raise ValueError(f"scheme {shown} is not PostgreSQL's: set it to {DATABASE_URL_FORM}")
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise ValueError(f"not a PostgreSQL connection string: set it to {DATABASE_URL_FORM}") from None
    return url


def database_address(url: str) -> str:
    """Where ``url`` points (never its password): ``host:port/dbname``, or for a ``host`` that is
    a directory the Unix socket in it and the database (no host: libpq's default socket)."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "not a connection string"
    host, port, dbname = str(parts.get("host") or ""), parts.get("port") or 5432, parts.get("dbname") or ""
    if host and not host.startswith("/"):
        return f"{host}:{port}/{dbname}"
    socket = f"the Unix socket {host.rstrip('/')}/" if host else "the default Unix socket "
    return f"{socket}.s.PGSQL.{port}, database {dbname or parts.get('user') or 'named as the login user'}"


NATS_SCHEMES = ("nats", "tls")
"""What nats-py connects to as installed (ws:// and wss:// need its aiohttp extra, not installed)."""


def shown_nats_url(value: str) -> str:
    """``value`` (comma-separated NATS URLs) as a message may print it: without the user and
    password any URL holds (``nats://user:password@host`` is how one is given)."""
    shown = []
    for entry in value.split(","):
        scheme, sep, rest = entry.strip().rpartition("://")
        host = rest.rpartition("@")[2]
        shown.append(f"{scheme}{sep}{host}")
    return ",".join(shown)


def nats_urls(value: str) -> str:
    """``value`` (comma-separated NATS URLs) with ``nats://`` before each bare ``host:port``;
    a :class:`ValueError` naming the entry's place (never its text: it may hold a password) when
    one is no URL of a NATS server."""
    entries = [entry.strip() for entry in value.split(",")]
    if not any(entries):
        raise ValueError("names no server: set it to nats://host:port")
    fixed = []
    for place, entry in enumerate(entries):
        if not entry:
            continue
        url = entry if "://" in entry else "nats://" + entry
        of = f"entry {place} (counting from 0): " if len(entries) > 1 else ""
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - parsing the port raises for one that is no number
        except ValueError:
            raise ValueError(f"{of}not nats://host:port (its port is not a number from 0 to 65535)") from None
        if parts.scheme.lower() not in NATS_SCHEMES or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(f"{of}not nats://host:port (or tls://host:port; host:port alone is taken as nats://)")
        fixed.append(url)
    return value if fixed == [e for e in entries if e] and "://" in value else ",".join(fixed)


SYNC_ALWAYS = "always"
_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
"""A duration as nats-server reads one (Go's ``time.ParseDuration``, unsigned): ``10s``, ``1m30s``, ``500ms``."""


def sync_interval(value: str) -> str:
    """``value`` as nats-server's ``jetstream.sync_interval`` takes it: ``always`` (any case), or a
    duration above zero; a :class:`ValueError` saying what is taken otherwise (nats-server itself
    refuses to start on a bad one, after ``chronicle up`` started its other parts)."""
    given = value.strip()
    if given.lower() == SYNC_ALWAYS:
        return SYNC_ALWAYS
    if not _DURATION.fullmatch(given) or not re.search(r"[1-9]", given):
        raise ValueError(
            "not a NATS sync interval: `always` (fsync every write before it is acknowledged) or a duration "
            "above zero with its unit, such as 10s, 500ms or 1m30s; unset for the server's default (2m)"
        )
    return given


def s3_endpoint(value: str) -> tuple[str, bool | None]:
    """``value`` as the S3 client takes it, ``host[:port]``, and whether a scheme before it said
    HTTPS (None: no scheme); a :class:`ValueError` saying the form expected for anything else."""
    form = "set it to host:port (or http://host:port, https://host:port)"
    scheme, has_scheme, rest = value.strip().partition("://")
    secure: bool | None = None
    if has_scheme:
        if scheme.lower() not in ("http", "https"):
            raise ValueError(f"a scheme other than http:// or https://: {form}")
        secure = scheme.lower() == "https"
    else:
        rest = value.strip()
    try:
        parts: SplitResult = urlsplit("//" + rest)
        port = 1 if parts.port is None else parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"its port is not a number from 1 to 65535: {form}")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "it holds credentials: set host:port there, and CHRONICLE_S3_ACCESS_KEY and CHRONICLE_S3_SECRET_KEY"
        )
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"not an address (a host, a port; no path): {form}")
    return parts.netloc, secure


STACK_RECORD = "stack.json"
"""The file in ``data_dir`` where ``chronicle up`` records the stack it runs (:class:`LocalStack`)."""


@dataclass(frozen=True, slots=True)
class LocalStack:
    """What ``chronicle up`` serves, recorded in its data dir (``stack.json``) for the commands run
    beside it: its NATS address (a cluster's nodes comma-separated), the files of its operator
    seed and key-encryption key (None: the stack was given them by its environment, and records no
    secret), and the database it uses (embedded Postgres' socket, or the one configured), without
    a password it may hold (None: a record of an earlier release), the S3 endpoint it uses,
    with its scheme (``up --s3-port`` moves it; None: a record of an earlier release), and whether
    its processes seal (``encryption``: on unless ``up`` was given it; a record of an earlier
    release has none: True when it names a key file, as that ``up`` made its own key and sealed
    by default, else None). A command beside it that writes (``skills put|sync``) seals as the stack does: without
    it, it wrote its events unsealed, in the log for good, whatever an erasure destroys.
    ``api_key_file``: the file of the key ``up`` made for tenant ``default`` and serves (None: it
    made none, the keys being configured, or a record of an earlier release); ``chronicle erase
    --tenant default`` beside it warns that the tenant can still write, as for a configured key."""

    nats_url: str
    nats_nkey_seed_file: str | None = None
    kek_file: str | None = None
    database_url: str | None = None
    s3_endpoint: str | None = None
    encryption: bool | None = None
    api_key_file: str | None = None

    @classmethod
    def read(cls, data_dir: Path) -> LocalStack | None:
        """The record in ``data_dir``; None when there is none. One that is not a record is an
        :class:`UnusableSetting` naming the file."""
        path = data_dir / STACK_RECORD
        try:
            info = path.stat()
            text = path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UnusableSetting(
                f"{path} (`chronicle up`'s record of its stack) cannot be read ({exc.strerror or type(exc).__name__}): "
                "set CHRONICLE_NATS_URL, or CHRONICLE_DATA_DIR to another stack's data dir"
            ) from None
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            # it sends the operator's identity to the server it names: only a record the user
            # wrote (as `chronicle up` does, 0600) is followed, never one others could have put there
            raise UnusableSetting(
                f"{path} is not followed: it belongs to another user or others may write it (a record "
                "`chronicle up` wrote is the user's own and only the user may write it): remove it, or set "
                "CHRONICLE_NATS_URL"
            )
        try:
            record = json.loads(text)
            files = record.get("nats_nkey_seed_file"), record.get("kek_file")
            stack = cls(
                record["nats_url"],
                *files,
                record.get("database_url"),
                record.get("s3_endpoint"),
                record.get("encryption", True if files[1] else None),
                record.get("api_key_file"),
            )
            fields = (
                stack.nats_nkey_seed_file,
                stack.kek_file,
                stack.database_url,
                stack.s3_endpoint,
                stack.api_key_file,
            )
            if (
                not (isinstance(stack.nats_url, str) and stack.nats_url.strip())
                or not all(isinstance(f, str | None) for f in fields)
                or not isinstance(stack.encryption, bool | None)
            ):
                raise TypeError(stack)
            if stack.database_url is not None:
                check_database_url(stack.database_url)
            if stack.s3_endpoint is not None:
                s3_endpoint(stack.s3_endpoint)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise UnusableSetting(
                f"{path} is not `chronicle up`'s record of its stack (JSON with its nats_url): remove it (the next "
                "`chronicle up` writes it again) or set CHRONICLE_NATS_URL"
            ) from None
        return stack

    def write(self, data_dir: Path) -> Path:
        """Record this stack in ``data_dir`` (replacing a record at once: never half written)."""
        path = data_dir / STACK_RECORD
        part = path.with_name(path.name + ".part")
        part.write_text(json.dumps(asdict(self), indent=2) + "\n")
        part.replace(path)
        return path


def _stack_file(path: str, what: str) -> str:
    """The content of a file ``chronicle up`` recorded (its ``what``), stripped."""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise UnusableSetting(
            f"the local stack's {what} {path!r} (recorded in its {STACK_RECORD}) cannot be read "
            f"({exc.strerror or type(exc).__name__}): set CHRONICLE_NATS_URL and CHRONICLE_NATS_NKEY_SEED"
        ) from None


READ_ONLY = "read-only"
"""The third field of a read-only key's ``api_keys`` entry (``tenant:sha256hex:read-only``)."""


class KeyGrant(NamedTuple):
    """What an API key may do: its tenant's reads, and its writes unless ``read_only``."""

    tenant: str
    read_only: bool = False


def grants_fingerprint(grants: Mapping[str, KeyGrant]) -> str:
    """A short fingerprint of the keys in force: the first 12 hex digits of the SHA-256 of their
    ``digest:tenant:ro|rw`` lines, sorted. Equal in two processes that serve the same keys (a
    reload that reached one and not another shows), different when one key, its tenant or its
    read-only flag differs; it gives no key, nor any key's digest, away."""
    lines = sorted(f"{digest}:{g.tenant}:{'ro' if g.read_only else 'rw'}" for digest, g in grants.items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class ApiKeyEntry:
    """One ``tenant:sha256hex[:nkey]`` entry (a full key: a key's digest and, optionally, its NKey
    public key) or ``tenant:sha256hex:read-only`` (a key that only reads, and has no NATS identity)."""

    tenant: str
    digest: str
    nkey: str | None = None
    read_only: bool = False

    @classmethod
    def parse(cls, entry: str) -> ApiKeyEntry:
        tenant, has_tail, tail = entry.partition(":")
        digest, has_nkey, nkey = tail.partition(":")
        read_only = nkey == READ_ONLY
        problem = None
        try:
            check_tenant(tenant)
            named = bool(has_tail)  # an entry with no ':' may be a raw key, not a tenant
        except InvalidId as exc:
            problem, named = str(exc), False
        if _SECRET_LIKE.match(tenant):  # fields pasted in the wrong order: never named, never taken
            problem, named = "its first field looks like an API key or an NKey seed, not a tenant id", False
        if len(digest) != 64 or any(ch not in "0123456789abcdefABCDEF" for ch in digest):
            problem = "the digest is not 64 hex digits"
        if has_nkey and not read_only and not is_user_public_key(nkey):
            problem = f"the third field is neither an NKey user public key nor {READ_ONLY!r}"
        if problem:  # the entry's tenant, when it is one: the rest of an entry may be a secret
            of = f"of tenant {tenant!r}" if named else "(no tenant id before a ':')"
            raise ValueError(f"an entry {of} is not 'tenant:sha256hex[:nkey|:{READ_ONLY}]': {problem}")
        if read_only:
            return cls(tenant, digest.lower(), None, read_only=True)
        return cls(tenant, digest.lower(), nkey or None)


def read_api_keys_file(path: str) -> list[ApiKeyEntry]:
    """The entries of an ``api_keys_file``: one a line, blank lines and ``#`` comments skipped. A
    file that cannot be read, an empty one, or a line that is not an entry, is an
    :class:`UnusableSetting` that names the file and the line number, never the line's text (it may
    be a raw key pasted there)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UnusableSetting(f"{path} cannot be read ({exc.strerror or type(exc).__name__})") from None
    except UnicodeDecodeError:
        raise UnusableSetting(f"{path} is not UTF-8 text") from None
    if not text:  # mid-write (`>` truncates first): read on a SIGHUP, it revoked every key and NATS user
        raise UnusableSetting(
            f"{path} is empty (being written? write another file and rename it over this one); to configure no key "
            "from it, give it a comment line"
        )
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        try:
            entries.append(ApiKeyEntry.parse(entry))
        except ValueError as exc:
            raise UnusableSetting(f"{path} line {number}: {exc}") from None
    return entries


def api_key_entry(tenant: str, key: str, *, read_only: bool = False) -> str:
    """The ``api_keys`` entry of ``key``: its digest and the public key of its NATS identity; a
    read-only key's has no NATS identity (it can neither publish events nor send commands)."""
    if read_only:
        return f"{tenant}:{hash_key(key)}:{READ_ONLY}"
    return f"{tenant}:{hash_key(key)}:{nkey_public_key(tenant_nkey_seed(key))}"


def load_settings() -> Settings:
    """The process's settings: environment (and ``.env``), then files in ``CHRONICLE_SECRETS_DIR``,
    one per setting, named like its variable in lower case (``/run/secrets/chronicle_database_url``);
    environment variables take precedence."""
    return Settings(_secrets_dir=os.environ.get("CHRONICLE_SECRETS_DIR"))
