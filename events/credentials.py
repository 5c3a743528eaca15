"""A tenant's NATS identity, derived from its API key: one secret for HTTP and for publishing.

A tenant that publishes straight to JetStream connects as an NKey user whose seed is
``HMAC-SHA256(api_key, "chronicle/nats-nkey/v1")``. The server's configuration holds only the
public key (the third field of a ``tenant:sha256:nkey`` API key entry), so neither Chronicle nor
the NATS server stores anything that could sign in as the tenant. The permissions every tenant
user gets are defined here too, so the server configuration and the clients agree on them:

* publish: the tenant's own event subjects, ``<prefix>.<tenant>.p<NNN>.*``, and its own command
  subjects, ``<commands>.<tenant>.>`` (requests), and nothing else (no JetStream API: no stream
  or consumer management, no reading the log);
* subscribe: the tenant's own inbox, ``_INBOX_T.<tenant>.>``, where publish acks and command
  replies arrive. Clients
  must connect with that inbox prefix (:func:`tenant_inbox_prefix`): the default ``_INBOX`` is
  denied, so no tenant can listen to another client's replies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import nkeys

from events.ids import check_tenant, encode_token
from events.subjects import SubjectLayout

NKEY_LABEL = b"chronicle/nats-nkey/v1"
TENANT_INBOX_ROOT = "_INBOX_T"


def tenant_nkey_seed(api_key: str) -> str:
    """The NKey user seed (``SU…``) of the tenant that holds ``api_key``."""
    raw = hmac.new(api_key.encode(), NKEY_LABEL, hashlib.sha256).digest()
    return str(nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_USER).decode())


def nkey_public_key(seed: str) -> str:
    """The public key (``U…``) of an NKey user seed; raises ``ValueError`` for a bad seed."""
    try:
        pair = nkeys.from_seed(bytearray(seed.strip().encode()))
    except Exception as exc:  # nkeys raises its own error types and binascii errors
        raise ValueError(f"not an NKey seed: {exc}") from exc
    public = pair.public_key.decode()
    if not public.startswith("U"):
        raise ValueError("not a user NKey seed (it must start with 'SU')")
    return str(public)


def is_user_public_key(value: str) -> bool:
    """True for a well-formed NKey user public key (``U`` + 55 base32 characters)."""
    if len(value) != 56 or not value.startswith("U"):
        return False
    try:
        raw = base64.b32decode(value)
    except ValueError:
        return False
    return len(raw) == 35 and raw[0] == nkeys.PREFIX_BYTE_USER and nkeys.crc16_checksum(raw[:33]) == raw[33:]


def tenant_inbox_prefix(tenant: str) -> str:
    """The inbox prefix a tenant's NATS client must use (publish acks arrive under it)."""
    return f"{TENANT_INBOX_ROOT}.{encode_token(check_tenant(tenant))}"


def tenant_permissions(layout: SubjectLayout, tenant: str) -> dict[str, Any]:
    """nats-server permissions of a tenant's user: its own session subjects (one pattern per
    partition, so nothing outside the subject layout), its own command subjects, and its own
    inbox only."""
    token = encode_token(check_tenant(tenant))
    events = [f"{layout.prefix}.{token}.p{p:03d}.*" for p in range(layout.partitions)]
    return {
        "publish": {"allow": [*events, layout.command_filter(tenant)]},
        "subscribe": {"allow": [f"{tenant_inbox_prefix(tenant)}.>"]},
    }
