"""The nats-server configuration Chronicle runs with: never open, one operator, one user per tenant key.

* No anonymous access: every connection signs the server's nonce with an NKey.
* Chronicle's own processes connect as the operator identity (``CHRONICLE_NATS_NKEY_SEED``): the
  only one allowed to use the JetStream API (create, change or delete streams and consumers, read
  the log).
* Each tenant key that carries an NKey public key (``tenant:sha256:nkey`` in ``api_keys``) becomes
  a user that may publish on its tenant's subjects and receive its publish acks, nothing else
  (:func:`events.credentials.tenant_permissions`).

A cluster node's configuration adds a ``server_name`` and a ``cluster`` block: routes to the other
nodes, authenticated with a shared route password (a route is a server-to-server connection that
bypasses client authorization, so an open route port would be a way around every rule above),
and pings: routes every 2 s, clients every 5 s (:func:`cluster_extra`).

The configuration is JSON, which nats-server's configuration parser reads as it is. Users are
listed by public key only; a cluster node's file holds the route password, and every file is
written owner-only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from events.credentials import nkey_public_key, tenant_permissions
from events.subjects import SubjectLayout
from services.settings import Settings

EVERYTHING = {"publish": {"allow": [">"]}, "subscribe": {"allow": [">"]}}
ROUTE_USER = "route"
CLUSTER_NAME = "chronicle"


class MissingOperator(ValueError):
    """No operator identity is configured, so no NATS configuration can be made."""


@dataclass(frozen=True, slots=True)
class NatsAccess:
    """Who may connect: the operator's public keys and each tenant's."""

    operators: tuple[str, ...]
    layout: SubjectLayout
    tenants: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: Settings) -> NatsAccess:
        if settings.nats_nkey_seed is None:
            raise MissingOperator(
                "CHRONICLE_NATS_NKEY_SEED is not set: make an operator identity with `chronicle keygen --operator`"
            )
        operator = nkey_public_key(settings.nats_nkey_seed.get_secret_value())
        return cls((operator,), settings.layout(), settings.tenant_nkeys())

    def users(self) -> list[dict[str, Any]]:
        users: list[dict[str, Any]] = [{"nkey": key, "permissions": EVERYTHING} for key in self.operators]
        for tenant in sorted(self.tenants):
            users += [
                {"nkey": key, "permissions": tenant_permissions(self.layout, tenant)}
                for key in sorted(set(self.tenants[tenant]))
            ]
        return users


def server_config(
    access: NatsAccess,
    *,
    host: str,
    port: int,
    store_dir: str,
    sync_interval: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A nats-server configuration with JetStream and :class:`NatsAccess`'s users only; JetStream
    fsyncs at ``sync_interval`` (``settings.nats_sync_interval``: ``always``, or a duration) where
    it is given, else at the server's default (every 2 minutes)."""
    jetstream: dict[str, Any] = {"store_dir": store_dir}
    if sync_interval is not None:
        jetstream["sync_interval"] = sync_interval
    return {
        "host": host,
        "port": port,
        "jetstream": jetstream,
        "authorization": {"users": access.users()},
        **(extra or {}),
    }


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One node of a NATS cluster: its server name and where its cluster (route) port listens."""

    name: str
    host: str
    route_port: int

    def route_url(self, password: str) -> str:
        return f"nats-route://{ROUTE_USER}:{quote(password, safe='')}@{self.host}:{self.route_port}"


ROUTE_PING_INTERVAL_S = 2
ROUTE_PING_MAX = 2
NATS_ROUTE_STALE_AFTER_S = ROUTE_PING_INTERVAL_S * (ROUTE_PING_MAX + 1) + 2
"""How long the other nodes of a generated cluster keep a node that stopped answering with its
sockets open (a frozen machine, a process stopped with SIGSTOP), and its subscriptions in their
interest: each server pings its routes every :data:`ROUTE_PING_INTERVAL_S` (the ``cluster``
block's ``ping_interval``, routes only) and closes one that leaves more than
:data:`ROUTE_PING_MAX` unanswered; a few seconds of timer slack on top. nats-server's default (a
ping every two minutes) kept a hung node's queue members, the JetStream direct-get responders of
its replica among them, taking their turn at requests that then timed out, for minutes
(tests/integration/test_hung_nats_node.py)."""

CLIENT_PING_INTERVAL_S = 5
CLIENT_PING_MAX = 2
NATS_CLIENT_DROPPED_AFTER_S = CLIENT_PING_INTERVAL_S * (CLIENT_PING_MAX + 1) + 2
"""How long a node of a generated cluster keeps a client that stopped answering (a stopped
``chronicle commands``, its turn in the queue group with it) before it closes it as stale: the
top-level ``ping_interval`` and ``ping_max``, which apply to clients only once the ``cluster``
block names its own. Above the clients' own (``services.bootstrap.NATS_STALE_AFTER_S``: a ping
every 3 s), as NATS asks: the routes' 2 s applied to clients closed any client that could not
answer for ~5 s (a process starved of CPU) before its own pings would have found a hung server;
now one is kept at least :data:`CLIENT_PING_INTERVAL_S` times :data:`CLIENT_PING_MAX` (10 s). nats-server's
default (two minutes) kept a stopped process's share of requests that long."""


def cluster_extra(
    node: ClusterNode, peers: Sequence[ClusterNode], password: str, *, listen: str | None = None
) -> dict[str, Any]:
    """What :func:`server_config` needs beyond one server for ``node`` of a cluster with ``peers``
    (the other nodes): its name, routes that only holders of ``password`` can open, and the pings
    that drop a route (:data:`NATS_ROUTE_STALE_AFTER_S`) or a client (:data:`NATS_CLIENT_DROPPED_AFTER_S`)
    that stopped answering."""
    if not password:
        raise ValueError("a NATS cluster needs a route password (CHRONICLE_NATS_ROUTE_PASSWORD)")
    return {
        "server_name": node.name,
        "ping_interval": f"{CLIENT_PING_INTERVAL_S}s",  # clients: NATS_CLIENT_DROPPED_AFTER_S
        "ping_max": CLIENT_PING_MAX,
        "cluster": {
            "name": CLUSTER_NAME,
            "host": listen or node.host,
            "port": node.route_port,
            "authorization": {"user": ROUTE_USER, "password": password},
            "routes": [peer.route_url(password) for peer in peers if peer.name != node.name],
            "ping_interval": f"{ROUTE_PING_INTERVAL_S}s",  # routes: NATS_ROUTE_STALE_AFTER_S
            "ping_max": ROUTE_PING_MAX,
        },
    }


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write ``config`` (owner-only) where nats-server's ``-c`` can read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path
