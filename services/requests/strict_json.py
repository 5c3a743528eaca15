"""Request bodies parsed strictly, once, before anything is decided (an HTTP route, a NATS command):
what the event contract would refuse later (NaN, infinities, NUL, lone surrogates), what would
exhaust a validator (deep nesting) or what JSON leaves undefined (a key twice in one object, which
a parser may read as either value) is a ``422 invalid_request`` before anything is published."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from events.admission import MAX_DEPTH, has_bad_chars, too_deep
from services.errors import InvalidRequest, MalformedJson

MAX_JSON_DEPTH = MAX_DEPTH
"""The deepest nesting of arrays and objects a request body may have (the body itself is 1): the
contract's, which refuses an event nested deeper however it was published."""


def _constant(name: str) -> Any:
    raise InvalidRequest(f"{name} is not JSON: numbers must be finite")


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise InvalidRequest(f"the number {text[:40]} is out of range: numbers must be finite")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object, refused when a key is in it twice (RFC 8259: names SHOULD be unique; Python
    would keep the last value, another reader the first)."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise InvalidRequest(f"the key {key[:80]!r} is in one object twice: each key may appear once")
        seen.add(key)
    raise AssertionError("unreachable: fewer keys than pairs means one repeats")


_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_float, object_pairs_hook=_object)


def strict_loads(body: bytes) -> Any:
    """The JSON value of a request body, or :class:`InvalidRequest` (422) for what Chronicle never
    stores; :class:`json.JSONDecodeError` for text that is not JSON (FastAPI's 400)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedJson("the body is not UTF-8") from None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise InvalidRequest(f"the body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer literal past Python's digit limit (4,300): never a field's
        raise InvalidRequest(f"a number in the body has more than {sys.get_int_max_str_digits():,} digits") from None
    # Cheap guards first: nesting needs that many brackets, NUL or a surrogate needs a \u escape
    # (raw ones are not JSON, or not UTF-8).
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and too_deep(value, MAX_JSON_DEPTH):
        raise InvalidRequest(f"the body is nested deeper than {MAX_JSON_DEPTH} levels")
    if "\\u" in text and has_bad_chars(value):
        raise InvalidRequest("the body must not contain NUL characters or lone surrogates")
    return value
