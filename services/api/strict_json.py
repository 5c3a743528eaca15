"""HTTP bodies parsed strictly (:func:`services.requests.strict_json.strict_loads`), once, before
any route runs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from services.requests.strict_json import strict_loads


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_strict_json"):
            self._strict_json = strict_loads(await self.body())
        return self._strict_json


class StrictJsonRoute(APIRoute):
    """Routes whose JSON bodies go through :func:`strict_loads` (FastAPI's custom route class)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            strict_request = StrictJsonRequest(request.scope, request.receive)
            content_type = request.headers.get("content-type", "json")
            if request.method in ("POST", "PUT", "PATCH") and "json" in content_type and await strict_request.body():
                # parsed here, so a refusal is our problem answer (FastAPI's parse would make any
                # exception a 400); text that is not JSON is left to FastAPI's own answer
                with contextlib.suppress(json.JSONDecodeError):
                    await strict_request.json()
            return await handler(strict_request)

        return strict
