"""HTTP bodies parsed strictly (:func:`services.requests.strict_json.strict_loads`), once, before
any route runs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from services.errors import UnsupportedMediaType
from services.requests.strict_json import strict_loads


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_strict_json"):
            self._strict_json = strict_loads(await self.body())
        return self._strict_json


def is_json(content_type: str) -> bool:
    """Whether a ``Content-Type`` names JSON: ``application/json`` or an ``application/…+json``
    type, parameters aside (what FastAPI parses as JSON)."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


class StrictJsonRoute(APIRoute):
    """Routes whose JSON bodies go through :func:`strict_loads` (FastAPI's custom route class). A
    route that takes a body refuses one declared as something else than JSON (``415
    unsupported_media_type``; FastAPI would validate the raw bytes and answer a puzzling 422), and
    one declared more than once (whichever is JSON); a body with no ``Content-Type`` at all is
    taken as JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def strict(request: Request) -> Response:
            strict_request = StrictJsonRequest(request.scope, request.receive)
            if takes_body and await strict_request.body():
                declared = request.headers.getlist("content-type")
                if len(declared) > 1:  # a proxy may judge one and the app another: neither is taken
                    raise UnsupportedMediaType(
                        f"the body is declared with more than one Content-Type header ({len(declared)}); "
                        "send one: 'Content-Type: application/json'"
                    )
                content_type = declared[0] if declared else None
                if content_type is not None and not is_json(content_type):
                    raise UnsupportedMediaType(
                        f"the body is sent as {content_type!r}; send it as 'Content-Type: application/json' "
                        "(or an application/…+json type)"
                    )
                # parsed here, so a refusal is our problem answer (FastAPI's parse would make any
                # exception a 400); text that is not JSON is left to FastAPI's own answer
                with contextlib.suppress(json.JSONDecodeError):
                    await strict_request.json()
            return await handler(strict_request)

        return strict
