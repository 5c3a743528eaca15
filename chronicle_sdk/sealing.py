"""Sealing on the SDK's direct path: a session's data key, asked of Chronicle once per session.

An agent service that publishes straight to JetStream seals its events as Chronicle's own writers
do (``events.sealing``): the ``events`` publisher calls :meth:`ServerKeys.for_writing`, which asks
``GET /v1/sessions/{sid}/data-key`` with the client's API key (Chronicle answers only for that
key's tenant, and logs every read) and keeps the key for the client's life. A deployment that does
not seal answers ``404 encryption_off``: nothing is sealed. An erased session answers ``410
session_erased``, raised as :class:`~chronicle_sdk.SessionErased`, and nothing is published.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from events.sealing import DataKey, StaticKeys

Ask = Callable[[str], Awaitable[dict[str, Any]]]
"""GET a path of the API with the client's key; raises the SDK's errors."""


class ServerKeys:
    """Data keys of one tenant's sessions, from the API (``events.sealing.DataKeys``)."""

    def __init__(self, ask: Ask) -> None:
        self._ask = ask
        self._held = StaticKeys()
        self._keys: dict[tuple[str, str], DataKey] = {}
        self._sealing: bool | None = None  # unknown until the first answer

    async def for_writing(self, tenant: str, session: str) -> DataKey | None:
        from chronicle_sdk.errors import EncryptionOff

        if self._sealing is False:
            return None
        key = self._keys.get((tenant, session))
        if key is not None:
            return key
        try:
            out = await self._ask(f"/v1/sessions/{session}/data-key")
        except EncryptionOff:
            self._sealing = False
            return None
        self._sealing = True
        key = DataKey(str(out["kid"]), base64.b64decode(str(out["key"])))
        self._keys[(tenant, session)] = key
        self._held.put(tenant, session, key)
        return key

    # reading: only what this client sealed itself (the publisher reads nothing back)
    def key(self, tenant: str, session: str, kid: str) -> DataKey:
        return self._held.key(tenant, session, kid)

    def erased(self, tenant: str, session: str) -> bool:
        return self._held.erased(tenant, session)

    def forget(self, tenant: str, session: str) -> None:
        self._keys.pop((tenant, session), None)
        self._held.erase(tenant, session)

    async def load(self, wanted: Iterable[tuple[str, str, str | None]]) -> None:
        return None
