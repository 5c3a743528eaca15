"""Answers spliced from stored JSON text, and the NDJSON stream type."""

import json
from typing import Any

from fastapi import Response
from fastapi.responses import StreamingResponse

JSON = "application/json"


class NdjsonResponse(StreamingResponse):
    media_type = "application/x-ndjson"


def raw_json(parts: dict[str, Any], raw_messages: list[str] | None = None) -> Response:
    """A JSON object whose ``messages`` member is spliced from stored JSON text (no re-parse)."""
    head = json.dumps(parts)[:-1]
    if raw_messages is None:
        return Response(head + "}", media_type=JSON)
    head += (", " if parts else "") + '"messages": ['
    # One join and one encode: a long history is a megabyte or more, and each copy shows.
    items = list(raw_messages) or [""]
    items[0] = head + items[0]
    items[-1] += "]}"
    return Response(",".join(items).encode(), media_type=JSON)


def joined_json(parts: dict[str, Any], joined_messages: str) -> Response:
    """:func:`raw_json` of messages already joined with ``,`` (the same bytes)."""
    head = json.dumps(parts)[:-1] + (", " if parts else "") + '"messages": ['
    return Response((head + joined_messages + "]}").encode(), media_type=JSON)
