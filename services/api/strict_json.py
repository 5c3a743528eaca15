"""HTTP bodies parsed strictly (:func:`services.requests.strict_json.strict_loads`), once, before
any route runs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Coroutine, Sequence
from types import UnionType
from typing import Any, Union, get_args, get_origin

from fastapi import Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from services.errors import AmbiguousIdempotencyKey, UnsupportedMediaType
from services.offload import off_loop, weigh_body
from services.requests.strict_json import strict_loads


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_strict_json"):
            self._strict_json = await off_loop(strict_loads, await self.body())
        return self._strict_json


def is_json(content_type: str) -> bool:
    """Whether a ``Content-Type`` names JSON: ``application/json`` or an ``application/…+json``
    type, parameters aside (what FastAPI parses as JSON)."""
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


class StrictJsonRoute(APIRoute):
    """Routes whose JSON bodies go through :func:`strict_loads` (FastAPI's custom route class), and
    whose query names a parameter that takes one value at most once and, on a ``/v1`` route, only
    parameters the route takes (:func:`check_query`). A
    route that takes a body refuses one declared as something else than JSON (``415
    unsupported_media_type``; FastAPI would validate the raw bytes and answer a puzzling 422), and
    one declared more than once (whichever is JSON); a body with no ``Content-Type`` at all is
    taken as JSON. A route that takes an ``Idempotency-Key`` refuses a request with more than one
    (``400 ambiguous_idempotency_key``), before anything else of it is looked at."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None
        scalars = scalar_query_names(self.dependant)
        known = taken_query_names(self.path, self.methods, self.dependant)
        keyed = IDEMPOTENCY_KEY in header_names(self.dependant)

        async def strict(request: Request) -> Response:
            if keyed and len(keys := request.headers.getlist(IDEMPOTENCY_KEY)) > 1:
                # FastAPI would take the first silently: a retry sent with the second names
                # another request, and a proxy checking one may see another request than the app
                raise AmbiguousIdempotencyKey(
                    f"send one Idempotency-Key header (one key names one request): this request has {len(keys)}"
                )
            if request.scope["query_string"] and (scalars or known is not None):
                check_query(request, scalars, known)
            strict_request = StrictJsonRequest(request.scope, request.receive)
            if takes_body and (body := await strict_request.body()):
                weigh_body(len(body))  # a large one is parsed and checked off the loop (services/offload.py)
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


def scalar_query_names(dependant: Dependant) -> frozenset[str]:
    """The query parameters of a route (its dependencies' included) that take one value."""
    return _query_names(dependant, scalar_only=True)


def _query_names(dependant: Dependant, *, scalar_only: bool) -> frozenset[str]:
    names: set[str] = set()
    todo = [dependant]
    while todo:
        d = todo.pop()
        names.update(f.alias for f in d.query_params if not (scalar_only and _takes_list(f.field_info.annotation)))
        todo.extend(d.dependencies)
    return frozenset(names)


STRICT_QUERY_ROOT = "/v1/"
"""The routes under it (the JSON API) refuse a query parameter they do not take; the probes,
``/metrics`` and the auditor's page take whatever a prober or a browser adds."""
EVERY_READ_TAKES = frozenset({"min_seq"})
"""What every ``GET`` under :data:`STRICT_QUERY_ROOT` takes, declared or not: the SDK sends
``min_seq`` with every read after a write (chronicle_sdk/client.py), and a read that waits on no
projection (``whoami``, ``erasures``, ``last-seq``, ``events``, …) has nothing to wait for."""


def taken_query_names(path: str, methods: set[str] | None, dependant: Dependant) -> frozenset[str] | None:
    """The query parameters a route takes; None for a route that takes any (outside
    :data:`STRICT_QUERY_ROOT`)."""
    if not path.startswith(STRICT_QUERY_ROOT):
        return None
    names = _query_names(dependant, scalar_only=False)
    return names | EVERY_READ_TAKES if "GET" in (methods or ()) else names


IDEMPOTENCY_KEY = "idempotency-key"


def header_names(dependant: Dependant) -> frozenset[str]:
    """The header parameters of a route (its dependencies' included), lower-cased."""
    names: set[str] = set()
    todo = [dependant]
    while todo:
        d = todo.pop()
        names.update(f.alias.lower() for f in d.header_params)
        todo.extend(d.dependencies)
    return frozenset(names)


def _takes_list(annotation: Any) -> bool:
    """Whether a parameter's type is (optionally) a list, set or tuple: FastAPI reads it from every
    occurrence in the query."""
    if get_origin(annotation) in (Union, UnionType):
        return any(_takes_list(arg) for arg in get_args(annotation))
    return get_origin(annotation) in (list, set, frozenset, tuple, Sequence) or annotation in (list, set, tuple)


def check_query(request: Request, scalars: frozenset[str], known: frozenset[str] | None) -> None:
    """``422 invalid_request`` naming each parameter the query gives that the route does not take
    (``known``; None: any is taken), and each of ``scalars`` it gives more than once.

    An unknown parameter was ignored: ``history/stats?as_of_seq=3`` answered the current state to
    a client that believed it asked for the past (``as_of_seq`` is ``history``'s), and a misspelt
    parameter its default. A repeated one FastAPI would take the last value of silently, while a
    proxy checking the first sees another request (``limit=500&limit=1``). A parameter that takes
    a list (``ids``) may repeat."""
    seen: dict[str, list[str]] = {}
    unknown: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name in scalars:
            seen.setdefault(name, []).append(value)
        elif known is not None and name not in known:
            unknown.setdefault(name, value)
    errors = []
    if unknown:
        takes = ", ".join(sorted(known or ())) or "no query parameter"
        msg = f"not a parameter of this route (it takes {takes})"
        errors = [{"type": "extra_forbidden", "loc": ("query", n), "msg": msg, "input": v} for n, v in unknown.items()]
    errors += [
        {"type": "repeated", "loc": ("query", name), "msg": "given more than once; give it once", "input": values}
        for name, values in seen.items()
        if len(values) > 1
    ]
    if errors:
        raise RequestValidationError(errors)
