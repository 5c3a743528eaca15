"""The checks of a client's request that come before any decision, whichever transport brought it:
ids, NUL characters, and the shape of a message."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from events import ids
from events.admission import has_bad_chars
from events.messages import UIMessage, stored_json
from events.validation import error_items, validation_detail
from services.errors import InvalidId, InvalidRequest


def check_id(kind: str, value: str) -> str:
    """An id of a request: the contract's rules (events/ids.py), and no session id ``.`` or
    ``..`` (:data:`events.ids.UNREACHABLE_SESSION_IDS`), refused here rather than by the
    contract so that events stored with one stay admissible."""
    checker = {"session": ids.check_session, "message": ids.check_message_id}[kind]
    try:
        checked = checker(value)
    except ids.InvalidId as exc:
        raise InvalidId(str(exc)) from exc
    if kind == "session" and checked in ids.UNREACHABLE_SESSION_IDS:
        raise InvalidId(f"session id must not be {checked!r}: as a URL path segment it names no session")
    return checked


def no_nul(value: object, what: str) -> None:
    """Postgres cannot store NUL characters (nor lone surrogates), and the event contract refuses
    both: refuse them at the edge (nothing is written)."""
    if has_bad_chars(value):
        raise InvalidRequest(f"{what} must not contain NUL characters or lone surrogates")


Loc = tuple[str | int, ...]
"""Where a value is in a request's body (``("messages", 2)``), as a validation error's ``loc``."""


def invalid_fields(errors: list[dict[str, Any]]) -> InvalidRequest:
    """``422 invalid_request`` naming fields of the body: ``errors`` as the edge's own validation
    gives them, ``detail`` their ``loc: msg`` lines."""
    return InvalidRequest(validation_detail(errors), errors=errors)


def field_error(loc: Loc, msg: str, kind: str = "value_error") -> dict[str, Any]:
    """One ``{loc, msg, type}`` item of a problem's ``errors``."""
    return {"loc": [str(p) for p in loc], "msg": msg, "type": kind}


def checked_message(raw: dict[str, Any], *, new: bool, loc: Loc = ("message",)) -> dict[str, Any]:
    """Validate the UIMessage shape; the client's dict is stored as sent (unknown fields kept).
    A ``new`` message (an append's) may not take an id that ``/messages/{mid}`` could never name
    (:func:`events.ids.check_new_message_id`: one holding a ``/``, or ``.`` or ``..``). An update
    names a stored message, which keeps its id. A refusal names the fields in its ``errors``,
    each ``loc`` under ``loc`` (where the message is in the body)."""
    checked_size(raw, new=new, loc=loc)
    return raw


def checked_size(raw: dict[str, Any], *, new: bool, loc: Loc = ("message",)) -> int:
    """:func:`checked_message`, answering the bytes the message is stored as."""
    try:
        UIMessage.model_validate(raw)
    except ValidationError as exc:
        found = error_items(exc.errors(include_url=False))
        raise invalid_fields([{**e, "loc": [str(p) for p in loc] + e["loc"]} for e in found]) from exc
    if new:
        try:
            ids.check_new_message_id(raw["id"])
        except ids.InvalidId as exc:
            raise InvalidId(str(exc)) from exc
    try:
        size = len(stored_json(raw).encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise invalid_fields([field_error(loc, "contains invalid Unicode (a lone surrogate)")]) from exc
    if has_bad_chars(raw):
        raise invalid_fields([field_error(loc, "must not contain NUL characters or lone surrogates")])
    return size
