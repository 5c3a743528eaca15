"""What a session and the manager need of their connection to Chronicle, as a protocol.

:class:`~chronicle_sdk.Session` and :class:`~chronicle_sdk.SessionManager` are typed against
:class:`Connection`, never against the client that implements it
(:class:`~chronicle_sdk.ChronicleClient`), so the SDK's modules import one another in one
direction only: the client above the manager, the manager above the session, this protocol below
them, the transport and the value types at the bottom.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol
from urllib.parse import quote as _quote

from chronicle_sdk.errors import InvalidId, InvalidRequest
from chronicle_sdk.types import OMITTED, AppendResult, ParentId
from events import ids

Via = Literal["http", "nats", "jetstream"]
"""How a write reaches the server: through the API (``"http"``), as a NATS command (``"nats"``), or,
for a chain of appends, published straight to JetStream (``"jetstream"``)."""


class Connection(Protocol):
    """An authenticated connection to one Chronicle API, with read-your-writes.

    :class:`~chronicle_sdk.ChronicleClient` is the implementation; a test may pass its own.
    """

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
        body: Any = OMITTED,
        session: str | None = None,
        tenant_wide: bool = False,
        idempotent: bool | None = None,
        headers: Mapping[str, str] | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> Any:
        """Send one API request and return its decoded JSON; errors raise ``ChronicleError`` subclasses.
        ``on_retry`` is called before each retry the connection makes of it."""
        ...

    def stream_lines(self, path: str, params: Mapping[str, Any]) -> AsyncGenerator[bytes, None]:
        """The lines of one GET answer that stays open, as they come (errors raise as ``request``'s)."""
        ...

    async def get_optional(
        self,
        path: str,
        *,
        session: str | None = None,
        min_seq: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        """A GET that answers None instead of raising for a missing session or message."""
        ...

    def note_seq(self, session_id: str, seq: Any) -> None:
        """Remember a write's ``seq`` so that later reads of ``session_id`` wait for it."""
        ...

    def last_seq(self, session_id: str | None = None) -> int:
        """The highest write ``seq`` seen for a session (``None``: for any session); 0 if none."""
        ...

    async def append(
        self, session_id: str, message: Mapping[str, Any], parent_id: ParentId = OMITTED, *, via: Via | None = None
    ) -> AppendResult:
        """Append one message."""
        ...

    async def append_chain(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        parent_id: str | None = None,
        *,
        via: Via | None = None,
    ) -> list[AppendResult]:
        """Append ``messages`` as one chain under ``parent_id`` (``None``: a new root chain)."""
        ...


def quote(value: str) -> str:
    """An id as one URL path segment; :class:`InvalidId` for one holding a lone surrogate, which
    no URL can carry (no stored id holds one)."""
    try:
        return _quote(value, safe="")
    except UnicodeEncodeError as exc:
        raise InvalidId("an id must not contain lone surrogates", status=422) from exc


def _checked(check: Callable[[str], str], value: str) -> str:
    """``check(value)``, its refusal raised as the SDK's :class:`InvalidId` (``422``)."""
    try:
        return check(value)
    except ids.InvalidId as exc:
        raise InvalidId(str(exc), status=422) from exc


def checked_session_id(session_id: str) -> str:
    """``session_id`` when the server would take it, else :class:`InvalidId` (``422``) before any
    request: an empty one, or one with a ``/``, would otherwise name another route (``404``)."""
    return _checked(ids.check_session, session_id)


def checked_message_id(message_id: str) -> str:
    """``message_id`` when the server would take it, else :class:`InvalidId` (``422``)."""
    return _checked(ids.check_message_id, message_id)


def checked_new_message_id(message_id: str) -> str:
    """``message_id`` when the server would take it as a new message's id, else
    :class:`InvalidId` (``422``) before any request: one holding a ``/``, or ``.`` or ``..``,
    could never be named by a URL afterwards (:func:`events.ids.check_new_message_id`)."""
    return _checked(ids.check_new_message_id, message_id)


def checked_mapping(message: Any, where: str = "message") -> Mapping[str, Any]:
    """``message`` when it is a mapping; :class:`InvalidRequest` (``422``, as the server answers
    a body that is not an object) before any request when it is not."""
    if not isinstance(message, Mapping):
        raise InvalidRequest(
            f"{where}: a message is an object (a UIMessage dict), not {type(message).__name__}", status=422
        )
    return message


def refuse_unnameable_ids(messages: Sequence[Mapping[str, Any]]) -> None:
    """:class:`InvalidId` (``422``) before any request when a new message's id is one no URL could
    name (a ``/`` in it, or ``.`` or ``..``), which the server refuses too: nothing of a chain is
    sent. A message that is not a mapping is :class:`InvalidRequest` (``422``, as the server would
    answer it), also before any request. The rest of a message's shape is left to the server (or to
    the JetStream path's check)."""
    for i, message in enumerate(messages):
        mid = checked_mapping(message, f"message {i}").get("id")
        if isinstance(mid, str) and (mid in ids.UNREACHABLE_MESSAGE_IDS or "/" in mid):
            checked_new_message_id(mid)


def session_path(session_id: str, tail: str = "") -> str:
    """The URL path of a session (and ``tail`` under it), its id checked first."""
    return f"/v1/sessions/{quote(checked_session_id(session_id))}{tail}"


__all__ = [
    "Connection",
    "Via",
    "checked_mapping",
    "checked_message_id",
    "checked_new_message_id",
    "checked_session_id",
    "quote",
    "refuse_unnameable_ids",
    "session_path",
]
