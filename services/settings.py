"""Typed settings for every Chronicle process (``CHRONICLE_`` environment variables or ``.env``)."""

from __future__ import annotations

import hashlib
import os
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from events.subjects import SubjectLayout


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Settings(BaseSettings):
    """Working defaults for the local stack; override with ``CHRONICLE_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="CHRONICLE_", env_file=".env", extra="ignore")

    nats_url: str = Field(
        default="nats://127.0.0.1:4222", description="user:password@ in the URL works; tls://… for TLS"
    )
    nats_creds_file: str | None = Field(default=None, description="NATS credentials file (JWT and NKey seed)")
    nats_tls_ca_file: str | None = Field(default=None, description="CA bundle that signed the NATS server's cert")
    nats_tls_cert_file: str | None = Field(default=None, description="client certificate, for mutual TLS")
    nats_tls_key_file: str | None = Field(default=None, description="the client certificate's key")
    database_url: str = "postgresql://postgres@127.0.0.1:5432/chronicle"
    stream: str = "CHRONICLE"
    subject_prefix: str = "chronicle.ev"
    partitions: int = Field(default=16, ge=1, le=1024)

    payload_limit_bytes: int = Field(default=256 * 1024, ge=1024, description="larger bodies go to object storage")
    max_message_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    blob_bucket: str = "chronicle-blobs"

    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_keys: list[str] = Field(
        default_factory=list, description="entries 'tenant:sha256-hex-of-key'; see `chronicle keygen`"
    )
    db_pool_min: int = Field(default=2, ge=0, le=1000, description="Postgres connections kept open per process")
    db_pool_max: int = Field(default=20, ge=1, le=1000, description="at most this many per process")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    read_wait_timeout_s: float = Field(default=5.0, gt=0)
    command_attempts: int = Field(default=100, ge=1)
    auto_migrate: bool = True

    projector_name: str = "projector"
    projector_batch: int = Field(default=1000, ge=1)
    projector_partitions: list[int] | None = Field(
        default=None, description="partitions this projector consumes; None = all"
    )
    projector_workers: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="`chronicle up`: projector processes, each with its share of partitions (fastest when "
        "partitions equals workers: one subject filter per consumer)",
    )

    tiktoken_encoding: str = "cl100k_base"

    s3_endpoint: str = "127.0.0.1:9000"
    s3_access_key: str = "minioadmin"
    s3_secret_key: str = "minioadmin"  # noqa: S105 - the local MinIO default, override in production
    s3_secure: bool = False
    s3_region: str | None = None

    compactor_name: str = "compactor"
    compactor_concurrency: int = Field(default=4, ge=1, le=64, description="sessions summarised at once")
    summarizer: Literal["offline", "openai"] = "offline"
    summarizer_base_url: str = "http://127.0.0.1:11434/v1"
    summarizer_model: str | None = None
    summarizer_api_key: str | None = None
    summarizer_timeout_s: float = Field(default=60.0, gt=0)
    summarizer_attempts: int = Field(default=3, ge=1)

    originals_bucket: str = "chronicle-originals"
    row_cap_bytes: int = Field(default=1_800_000, ge=10_000, description="larger messages are stored capped")

    data_dir: str = ".chronicle"

    def layout(self) -> SubjectLayout:
        return SubjectLayout(stream=self.stream, prefix=self.subject_prefix, partitions=self.partitions)

    def tenants_by_key_hash(self) -> dict[str, str]:
        table: dict[str, str] = {}
        for entry in self.api_keys:
            tenant, _, digest = entry.partition(":")
            if not tenant or len(digest) != 64:
                raise ValueError(f"api_keys entry {entry!r} is not 'tenant:sha256hex'")
            table[digest.lower()] = tenant
        return table


def load_settings() -> Settings:
    """The process's settings: environment (and ``.env``), then files in ``CHRONICLE_SECRETS_DIR``,
    one per setting, named like its variable in lower case (``/run/secrets/chronicle_database_url``);
    environment variables take precedence."""
    return Settings(_secrets_dir=os.environ.get("CHRONICLE_SECRETS_DIR"))
