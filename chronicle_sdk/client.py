"""The connection to Chronicle: HTTP with retries and read-your-writes, plus the direct JetStream path."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self
from urllib.parse import parse_qsl, urlencode

from pydantic import ValidationError

from chronicle_sdk import jsondecode
from chronicle_sdk.commands import Routed, reply_status, route
from chronicle_sdk.connection import (
    Via,
    checked_message_id,
    checked_new_message_id,
    checked_session_id,
    quote,
    refuse_unnameable_ids,
    session_path,
)
from chronicle_sdk.errors import (
    MAX_RETRY_AFTER_S,
    ChronicleError,
    Contention,
    EventIdTaken,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    SessionErased,
    SessionNotFound,
    TransientError,
    Unauthorized,
    Unavailable,
    UnknownParent,
    error_from_problem,
)
from chronicle_sdk.manager import SessionManager
from chronicle_sdk.session import Session
from chronicle_sdk.transport import Http11Transport, HttpxTransport, Transport, TransportError
from chronicle_sdk.types import OMITTED, AppendResult, Message, NatsPublishing, ParentId
from events import ids
from events.commands import MAX_DELETE_IDS
from events.messages import UIMessage, body_hash, canonical_json, stored_json
from events.subjects import SubjectLayout
from events.validation import validation_detail

if TYPE_CHECKING:
    import httpx
    from nats.aio.client import Client as NatsClient

    from events.publisher import Published, Publisher

_NOT_FOUND_CODES = frozenset({"message_not_found", "session_not_found", "not_found"})
# answers after which any request may be sent again: nothing was written
_NOTHING_WRITTEN = frozenset({"projection_timeout", "contention", "rate_limited", "request_timeout"})

RETRY_BUDGET_S = 15.0
"""How long, by default, one call keeps retrying transient failures: past a NATS stream-leader
election (about 6 s of 503s) or a restart of an API process, with room to spare."""


MAY_HAVE_RUN = "; the request may have reached the server and been applied: read what it writes before sending it again"
"""Said by an :class:`Unavailable` whose request may have run (no answer came after it was sent), so
that a caller does not repeat a write that is not idempotent (an append to a block, a tool call) blindly."""


@dataclass(slots=True)
class _Tries:
    """One call's attempts so far: how many retries were made, since when, and the pauses slept."""

    retried: int = 0
    slept: float = 0.0
    started: float = field(default_factory=time.monotonic)
    on_retry: Callable[[], None] | None = None  # told before each retry (the caller's ``on_retry``)


NATS_CONNECT_ATTEMPTS = 3
"""Tries per server of the first NATS connect (a second apart) before it fails as
:class:`Unavailable`; once connected, the client reconnects for as long as it is open."""
REMEMBERED_SESSIONS = 10_000
"""Sessions whose last write ``seq`` a client remembers (those written to most recently, about
200 bytes each); a read of another waits for the highest ``seq`` of the sessions it forgot. A
client kept every session it ever wrote to: an agent service's long-lived client grew by one
entry per conversation without bound, and each tenant-wide read took the highest of them all."""
FOLLOW_IDLE_S = 60.0
"""How long a followed answer may stay silent before the connection counts as lost (the server
sends a blank line every 15 s while nothing happens)."""


_BATCH_LIMIT = 1000  # messages in one POST …/messages:batch (the API's limit)
_EXISTS_LIMIT = MAX_DELETE_IDS  # ids in one POST …/messages:exists (the API's limit, as a delete's)
_BATCH_BYTES = 48 * 1024 * 1024  # JSON in one batch: half the API's default request bound (97 MiB)


def _chain_stored(err: ChronicleError, messages: Sequence[Mapping[str, Any]], pipelined: bool = False) -> str:
    """What of a chain sent in several requests is stored when ``err`` stopped it (its
    ``written`` and ``failed_index`` counted over the chain), and how to go on from there.
    ``pipelined``: the messages after ``failed_index`` were published with it (JetStream), so
    they may be stored too, whatever the error."""
    index = err.failed_index or 0
    said = f"(append_all: {len(err.written)} of the chain's {len(messages)} messages are stored, err.written"
    if isinstance(err, TransientError) and not isinstance(err, RateLimited):
        said += f"; message {index} may be too"
    if pipelined and index + 1 < len(messages):
        after = (
            f"message {index + 1} was"
            if index + 2 == len(messages)
            else f"messages {index + 1}-{len(messages) - 1} were"
        )
        said += f"; {after} published with it and may be stored too (an ack after one that failed is not counted)"
    if not err.written:
        return said + ".)"
    if not 0 <= index < len(messages):  # a server's answer that names no message of the chain
        return said + f"; the server's failed_index names no message of the chain ({index}).)"
    return (
        f"{said}; go on from message {index} ({str(messages[index].get('id'))!r}) with "
        f"append_all(messages[{index}:], parent_id={err.written[-1].id!r}). Sending the whole chain "
        "again is safe too (the stored messages replay) but, under a rate limit, is charged for them again.)"
    )


def _chain_failed(
    err: ChronicleError, messages: Sequence[Mapping[str, Any]], written: list[AppendResult], *, pipelined: bool
) -> ChronicleError:
    """``err`` as the error of a chain published straight to JetStream that stopped after
    ``written`` (its unbroken acknowledged prefix): ``failed_index`` is the message after them,
    and the error's message says what is stored and how to go on (:func:`_chain_stored`)."""
    err.written = written
    err.failed_index = len(written)
    err.detail = f"{err.detail.rstrip()} {_chain_stored(err, messages, pipelined)}"
    err.args = (err.detail,)
    return err


def _batches(messages: Sequence[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """The chain in ``messages:batch`` requests: at most :data:`_BATCH_LIMIT` messages and, past
    the first message of each, :data:`_BATCH_BYTES` of JSON (a body over the API's request bound
    is refused whole).

    A request does not end with a compaction summary's id (``compaction_…``, history sent back)
    when it can start the next one instead: the server answers it as a replay, the chain going on
    after the last message it covers, which the next request's ``parent_id`` cannot name."""
    from events.catalog import overlay_id_in

    batches: list[list[dict[str, Any]]] = []
    size = 0
    last_n = 0
    for m in messages:
        n = len(_json_bytes(m, f"message {m.get('id')!r}"))
        if not batches or len(batches[-1]) == _BATCH_LIMIT or size + n > _BATCH_BYTES:
            current = batches[-1] if batches else []
            carried = (
                current.pop()
                if len(current) > 1
                and overlay_id_in(str(current[-1].get("id"))) is not None
                and last_n + n <= _BATCH_BYTES
                else None
            )
            batches.append([] if carried is None else [carried])
            size = 0 if carried is None else last_n
        batches[-1].append(dict(m))
        size += n
        last_n = n
    return batches


UNENCODABLE = "must not contain lone surrogates (text that is not valid Unicode cannot be sent as UTF-8)"


def _utf8(text: str, what: str) -> bytes:
    """``text`` as UTF-8, or :class:`InvalidRequest` (nothing sent) for text holding a lone
    surrogate (a truncated ``\\ud83d`` from a model's output, say), which no UTF-8 request can carry."""
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{what} {UNENCODABLE}", status=422) from exc


def _json_bytes(body: Any, what: str = "the request body") -> bytes:
    """A request body as JSON in UTF-8 (see :func:`_utf8`); :class:`InvalidRequest` for one that
    JSON cannot hold (a ``set``, an object, a circular reference), as the server refuses ``NaN``."""
    try:
        text = json.dumps(body, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{what} is not JSON: {exc}", status=422) from exc
    return _utf8(text, what)


def _target(path: str, query: Sequence[tuple[str, Any]]) -> str:
    """The request target: ``path`` and its query, checked to be sendable (see :func:`_utf8`)."""
    _utf8(path, "the request path (an id in it)")
    if not query:
        return path
    pairs = [(k, _query_value(v)) for k, v in query]
    for _, value in pairs:
        _utf8(value, "a query parameter")
    return f"{path}?{urlencode(pairs)}"


def _check_message(message: Mapping[str, Any]) -> Message:
    """Validate the ``UIMessage`` shape as the server does; the dict is sent as it is."""
    try:
        UIMessage.model_validate(message)
    except ValidationError as exc:
        raise InvalidRequest(validation_detail(exc, prefix="message."), status=422) from exc
    return dict(message)


class ChronicleClient:
    """An async client for one Chronicle API (one tenant, selected by ``api_key``).

    * Retries transient failures (connection errors, 502/503/504, ``projection_timeout``,
      ``contention``, 429 ``rate_limited``) with exponential backoff (``backoff_s`` doubling up to
      ``max_backoff_s``, each pause jittered to 0.5-1.5 times): ``retries`` times (4) whatever
      they take, and beyond that for as long as ``retry_budget_s`` (``RETRY_BUDGET_S``, 15 s)
      has not passed since the first attempt (the last pause cut to end there), which rides out
      a NATS stream-leader election (about 6 s of 503s) or an API restart. ``retry_budget_s=0``
      makes it ``retries`` only; with ``retries=0`` as well, nothing is retried. Requests that
      are not idempotent are retried only when nothing can have been written (a 429 wrote
      nothing); one that got no answer after it was sent raises :class:`~chronicle_sdk.Unavailable`
      saying that it may have been applied (read before sending it again). After a 429 the
      client waits at least the server's ``retry_after``; one over ``MAX_RETRY_AFTER_S`` (60 s),
      or past the budget once the ``retries`` are made, raises
      :class:`~chronicle_sdk.RateLimited` at once instead (an ``append_all`` refused after its
      first requests were stored: its ``written`` and ``failed_index`` say what is).
    * How long one call may take, with the defaults: a read (or a write) that waits for the
      server's read models answers ``503 projection_timeout`` after the server's read wait
      (``CHRONICLE_READ_WAIT_TIMEOUT_S``, 5 s), and is retried; ``retries`` + 1 attempts of
      5 s are 25 s, past the 15 s budget, so the call raises after about (``retries`` + 1) times
      the read wait = 25 s, plus the pauses between attempts (at most 0.15 + 0.3 + 0.6 + 1.2 =
      2.25 s).
      Answers that fail at once are retried until ``retry_budget_s`` (15 s) has passed. A server
      that does not answer at all holds each attempt for ``timeout_s`` (30 s): an idempotent
      request then raises after (``retries`` + 1) times ``timeout_s`` = 150 s plus the pauses, one
      that is not after 30 s. A 429's ``retry_after`` (at most ``MAX_RETRY_AFTER_S``, 60 s) is
      waited out during the ``retries`` (up to 4 times 60 s). Lower ``timeout_s``, ``retries`` or
      ``retry_budget_s`` to bound a call more tightly.
    * Read-your-writes: remembers the ``seq`` of its last write per session and sends it as
      ``min_seq`` on every read of that session (tenant-wide reads send the highest one). It
      remembers the ``REMEMBERED_SESSIONS`` (10,000) sessions it wrote to last: a read of one
      written before those sends the highest ``seq`` of the sessions it forgot, which is at least
      that session's own.
    * Commands over NATS: with ``nats_url`` and ``via="nats"``, every write (appends, sessions,
      messages, context, tools, prompts, compaction) is sent as a NATS request to the server's
      command service (``chronicle commands``) instead of an HTTP request: the server runs the
      same code, so the answers, the typed errors, the retries and read-your-writes are those of
      HTTP. Reads stay on HTTP. A request bigger than the NATS server's ``max_payload`` goes over
      HTTP. ``via=`` per append, ``append_via`` for appends only.
    * Direct path: with ``nats_url`` (a cluster's nodes comma-separated), chains can be published
      straight to JetStream with the ``events`` publisher (``append_via="jetstream"`` or ``via=``
      per call); it needs nats-py, the SDK's ``nats`` extra (``pip install 'chronicle-sdk[nats]'``):
      without it, a client given ``nats_url`` raises ``ImportError``. On first use the
      client asks the API (``GET /v1/nats``) which tenant ``api_key`` belongs to, the stream's
      layout, the inbox prefix and the size limits, then connects as that tenant: with the NKey
      derived from ``api_key`` (what ``chronicle keygen`` registers), or with
      ``nats_credentials``, a ``.creds`` file for an external NATS cluster with its own accounts
      (its user must allow publishing on the tenant's subjects and subscribing under the inbox
      prefix). The tenant is never a parameter: NATS lets these credentials publish only on
      that tenant's subjects.
    * The NATS connection (both paths share it): the first connect tries each server
      ``NATS_CONNECT_ATTEMPTS`` (3) times, then raises :class:`~chronicle_sdk.Unavailable`; once
      connected, it reconnects for as long as the client is open, however long NATS is away
      (a connection closed all the same is opened again on the next call). While it is down,
      calls over NATS are retried as HTTP's are and then raise
      :class:`~chronicle_sdk.Unavailable`, never nats-py's own errors.

    * HTTP goes over the SDK's own HTTP/1.1 transport (:mod:`chronicle_sdk.transport`: pooled
      keep-alive connections, about a fifth of httpx's client CPU per request); ``transport``
      takes an httpx transport instead (``httpx.MockTransport`` in tests, ``httpx.ASGITransport``
      to call an app in-process).

    Use it as an async context manager, or call :meth:`aclose`. Its connections belong to the
    event loop that opened them: a client used from a later loop (``asyncio.run`` per call in a
    synchronous program) opens new ones there and ends the old loop's.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        nats_url: str | None = None,
        nats_credentials: str | None = None,
        via: Literal["http", "nats"] = "http",
        append_via: Via | None = None,
        timeout_s: float = 30.0,
        retries: int = 4,
        backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        retry_budget_s: float = RETRY_BUDGET_S,
        conflict_attempts: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if nats_url is None and (via != "http" or (append_via or via) != "http"):
            raise ValueError(f"via={via!r}, append_via={append_via!r} need nats_url")
        if nats_url is not None:
            _require_nats()
        self.base_url = base_url.rstrip("/")
        self.nats_url = nats_url
        self.nats_credentials = nats_credentials
        self.via: Literal["http", "nats"] = via
        self.append_via: Via = append_via or via
        self._timeout = timeout_s
        self._api_key = api_key
        self._retries = max(0, retries)
        self._retry_budget = max(0.0, retry_budget_s)
        self._backoff = backoff_s
        self._max_backoff = max_backoff_s
        self._conflict_attempts = max(1, conflict_attempts)
        self._headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
        self._http: Transport = (
            Http11Transport(self.base_url, timeout_s=timeout_s)
            if transport is None
            else HttpxTransport(self.base_url, transport, timeout_s=timeout_s)
        )
        self._seqs: OrderedDict[str, int] = OrderedDict()  # written to least recently first
        self._highest_seq = 0  # of every session written to
        self._forgotten_seq = 0  # of the sessions dropped from _seqs
        self._publishing: NatsPublishing | None = None
        self._direct: _Direct | None = None
        self._direct_lock = asyncio.Lock()

    @property
    def tenant(self) -> str | None:
        """The tenant ``api_key`` belongs to, as the server said (``None`` until the first direct
        append or :meth:`nats_publishing`)."""
        return self._publishing.tenant if self._publishing is not None else None

    @property
    def layout(self) -> SubjectLayout | None:
        """The stream's subject layout, as the server said (``None`` until it was asked)."""
        return self._publishing.layout if self._publishing is not None else None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client and, if it was opened, the NATS connection."""
        await self._http.aclose()
        if self._direct is not None:
            direct, self._direct = self._direct, None
            if direct.loop is not asyncio.get_running_loop():  # another loop's, which alone could close it
                return
            from nats.errors import Error as NatsError

            try:
                await direct.nc.drain()
            except NatsError:  # already closed (for example: the server dropped it)
                await direct.nc.close()

    # -- factories --------------------------------------------------------------------------

    def session(self, session_id: str) -> Session:
        """``Session.create(self, session_id)``: a session builder bound to this client."""
        return Session.create(self, session_id)

    def manager(self) -> SessionManager:
        """A :class:`~chronicle_sdk.SessionManager` on this client."""
        return SessionManager(self)

    # -- read-your-writes -------------------------------------------------------------------

    def last_seq(self, session_id: str | None = None) -> int:
        """The highest write ``seq`` seen for a session (``None``: for any session); 0 if none.

        The client remembers the :data:`REMEMBERED_SESSIONS` sessions it wrote to last; for one it
        wrote to before those (or never), the highest ``seq`` of the sessions it forgot: at least
        that session's own, so its reads still wait for its writes."""
        if session_id is None:
            return self._highest_seq
        return self._seqs.get(session_id, self._forgotten_seq)

    def note_seq(self, session_id: str, seq: Any) -> None:
        """Remember a write's ``seq`` so that later reads of ``session_id`` wait for it."""
        if isinstance(seq, int) and not isinstance(seq, bool) and seq > self.last_seq(session_id):
            self._seqs[session_id] = seq
            self._seqs.move_to_end(session_id)
            self._highest_seq = max(self._highest_seq, seq)
            while len(self._seqs) > REMEMBERED_SESSIONS:
                _, dropped = self._seqs.popitem(last=False)
                self._forgotten_seq = max(self._forgotten_seq, dropped)

    # -- HTTP -------------------------------------------------------------------------------

    def _delay(self, attempt: int) -> float:
        return float(min(self._max_backoff, self._backoff * 2 ** min(attempt, 32)) * (0.5 + random.random()))  # noqa: S311

    def _next_pause(self, tries: _Tries, at_least: float = 0.0) -> float | None:
        """The pause before retrying, at least ``at_least`` (a 429's ``retry_after``), or None
        when no retry is left: the first ``retries`` are always made; after them, only while the
        budget lasts (``retry_budget_s`` from the first attempt: the time passed or the pauses
        slept, whichever is more), the last pause cut to end with it (none, when ``at_least``
        does not fit)."""
        pause = max(self._delay(tries.retried), at_least)
        if tries.retried < self._retries:
            return pause
        left = self._retry_budget - max(tries.slept, time.monotonic() - tries.started)
        if left <= 0 or at_least > left:
            return None
        return min(pause, left)

    def _retry_pause(self, err: ChronicleError, tries: _Tries, safe: bool) -> float | None:
        """Seconds to wait before sending again after the error answer ``err``; None: raise it.

        Transient errors are retried, within the retry budget (:meth:`_next_pause`), when the
        request is safe to repeat or nothing was written (``projection_timeout``, ``contention``,
        ``rate_limited``). A :class:`RateLimited` waits at least its ``retry_after``, and is
        raised at once when that is over :data:`MAX_RETRY_AFTER_S` or what is left of the budget.
        """
        if not isinstance(err, TransientError) or not (safe or err.code in _NOTHING_WRITTEN):
            return None
        at_least = 0.0
        if isinstance(err, RateLimited) and err.retry_after is not None:
            if err.retry_after > MAX_RETRY_AFTER_S:
                return None
            at_least = err.retry_after
        return self._next_pause(tries, at_least)

    async def _pause(self, tries: _Tries, seconds: float) -> None:
        tries.retried += 1
        if tries.on_retry is not None:
            tries.on_retry()
        tries.slept += seconds
        await self._sleep(seconds)

    async def _sleep(self, seconds: float) -> None:
        """The pause between attempts (one place, so that tests can count it instead of waiting)."""
        await asyncio.sleep(seconds)

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
        """Send one API request and return its decoded JSON (or text for NDJSON).

        ``session`` makes a GET wait for this client's last write to that session (``min_seq``);
        ``tenant_wide`` waits for its last write to any session. ``idempotent`` (default: every
        method but POST) allows retrying after failures that may have reached the server;
        ``on_retry`` is called before each retry (the answer returned is then the last attempt's).
        Errors are raised as typed :class:`~chronicle_sdk.ChronicleError` subclasses; text that
        UTF-8 cannot carry (a lone surrogate, as in a model's output cut inside a surrogate pair)
        is :class:`~chronicle_sdk.InvalidRequest` before anything is sent.
        """
        query: list[tuple[str, Any]] = list(params.items() if isinstance(params, Mapping) else params or [])
        safe = idempotent if idempotent is not None else method != "POST"
        if self.via == "nats" and method != "GET":
            bare, _, in_path = path.partition("?")  # a query written into the path is a query over NATS too
            routed = route(method, bare, body, dict(parse_qsl(in_path)) | dict(query), headers or {})
            if routed is not None:
                with contextlib.suppress(_TooBigForNats):
                    return await self._command(routed, safe, _Tries(on_retry=on_retry))
        tries = _Tries(on_retry=on_retry)
        return await self._http_request(method, path, query, body, session, tenant_wide, safe, headers, tries)

    async def _http_request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, Any]],
        body: Any,
        session: str | None,
        tenant_wide: bool,
        safe: bool,
        headers: Mapping[str, str] | None,
        tries: _Tries,
    ) -> Any:
        if method == "GET" and not any(k == "min_seq" for k, _ in query):
            wait = self.last_seq(None) if tenant_wide else (self.last_seq(session) if session is not None else 0)
            if wait:
                query.append(("min_seq", wait))
        content = None if body is OMITTED else _json_bytes(body)
        sent = {
            **self._headers,
            **({"Content-Type": "application/json"} if content is not None else {}),
            **(headers or {}),
        }
        target = _target(path, query)
        while True:
            try:
                resp = await self._http.send(method, target, sent, content)
            except TransportError as exc:
                if (safe or exc.unsent) and (pause := self._next_pause(tries)) is not None:
                    await self._pause(tries, pause)
                    continue
                raise Unavailable(f"{method} {path}: {exc}{'' if exc.unsent else MAY_HAVE_RUN}", status=0) from exc
            if resp.status < 400:
                if resp.headers.get("content-type", "").startswith("application/x-ndjson"):
                    return resp.content.decode("utf-8", "replace")
                return jsondecode.loads(resp.content) if resp.content else None
            text = resp.content.decode("utf-8", "replace")
            try:
                payload: Any = json.loads(text)
            except ValueError:
                payload = text
            err = error_from_problem(resp.status, payload, retry_after=resp.headers.get("retry-after"))
            pause = self._retry_pause(err, tries, safe)
            if pause is not None:
                await self._pause(tries, pause)
                continue
            raise err

    async def stream_lines(self, path: str, params: Mapping[str, Any]) -> AsyncGenerator[bytes, None]:
        """The lines of one GET answer that stays open (``…/events?follow=true``), as they come.
        An error answer raises its typed error; a lost or silent connection raises
        :class:`Unavailable` (the caller resumes where it was)."""
        target = _target(path, list(params.items()))
        try:
            async with self._http.stream(target, self._headers, FOLLOW_IDLE_S) as opened:
                if opened.status >= 400:
                    text = opened.content.decode("utf-8", "replace")
                    try:
                        payload: Any = json.loads(text)
                    except ValueError:
                        payload = text
                    raise error_from_problem(opened.status, payload, retry_after=opened.headers.get("retry-after"))
                async for line in opened.lines:
                    yield line
        except TransportError as exc:
            raise Unavailable(f"GET {path}: {exc}", status=0) from exc

    async def get_optional(
        self,
        path: str,
        *,
        session: str | None = None,
        min_seq: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        """GET that answers None instead of raising for a missing session or message."""
        query = {**(params or {}), **({"min_seq": min_seq} if min_seq else {})}
        try:
            return await self.request("GET", path, params=query or None, session=session)
        except NotFound as exc:
            if exc.code in _NOT_FOUND_CODES:
                return None
            raise

    # -- appends ----------------------------------------------------------------------------

    def _via(self, via: Via | None) -> Via:
        chosen = via or self.append_via
        if chosen != "http" and self.nats_url is None:
            raise ValueError(f"appending via {chosen} needs a client built with nats_url")
        return chosen

    async def append(
        self, session_id: str, message: Mapping[str, Any], parent_id: ParentId = OMITTED, *, via: Via | None = None
    ) -> AppendResult:
        """Append one message (see :meth:`chronicle_sdk.Session.append_message`): over HTTP, or as a
        NATS command (``"nats"``; ``"jetstream"`` too: one message is never published without the
        server's decision, which only the server makes)."""
        refuse_unnameable_ids([message])
        return await self._append_api(session_id, message, parent_id, "http" if self._via(via) == "http" else "nats")

    async def append_chain(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        parent_id: str | None = None,
        *,
        via: Via | None = None,
    ) -> list[AppendResult]:
        """Append ``messages`` as one chain under ``parent_id`` (``None``: a new root chain).

        Over HTTP the chain is sent with ``POST …/messages:batch`` (1,000 messages a request);
        via JetStream it is pipelined. Message ids in a chain must be distinct.
        """
        if not messages:
            return []
        refuse_unnameable_ids(messages)
        if len({str(m.get("id")) for m in messages}) != len(messages):
            raise InvalidRequest("message ids in a chain must be distinct", status=422)
        chosen = self._via(via)
        if chosen == "jetstream":
            return await self._append_chain_direct(session_id, messages, parent_id)
        return await self._append_chain_api(session_id, messages, parent_id, chosen)

    def _path(self, session_id: str, tail: str = "") -> str:
        return session_path(session_id, tail)

    async def _send(self, via: Literal["http", "nats"], method: str, path: str, body: Any, **kw: Any) -> Any:
        """One write over ``via``, whatever the client's default."""
        if via == "nats":
            routed = route(method, path, body, {}, kw.get("headers") or {})
            assert routed is not None, f"{method} {path} has no command"
            with contextlib.suppress(_TooBigForNats):
                return await self._command(routed, bool(kw.get("idempotent")), _Tries())
        return await self._http_request(
            method, path, [], body, kw.get("session"), False, bool(kw.get("idempotent")), kw.get("headers"), _Tries()
        )

    async def _append_api(
        self, session_id: str, message: Mapping[str, Any], parent: ParentId, via: Literal["http", "nats"] = "http"
    ) -> AppendResult:
        """One append decided by the server, sent over HTTP or as a NATS command."""
        body: dict[str, Any] = {"message": dict(message)}
        if parent is not OMITTED:
            body["parent_id"] = parent
        # idempotent by message id: the same body again answers like the first append; the key
        # (one per call, the same in every retry) makes a retry of a stored attempt answer created
        out = await self._send(
            via,
            "POST",
            self._path(session_id, "/messages"),
            body,
            session=session_id,
            idempotent=True,
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        self.note_seq(session_id, out["seq"])
        return AppendResult(str(out["id"]), out.get("parent_id"), int(out["seq"]), bool(out.get("created", True)))

    async def _append_chain_api(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        parent_id: str | None,
        via: Literal["http", "nats"] = "http",
    ) -> list[AppendResult]:
        """The chain in ``messages:batch`` requests (HTTP or NATS commands). Idempotent by message
        id, as single appends: a retried batch re-answers the messages already appended, and the
        call's ``Idempotency-Key`` (one for all its requests and their retries) makes those that
        an earlier attempt of this call stored answer ``created=True`` (others ``created=False``);
        an id already stored with a different body is a
        :class:`~chronicle_sdk.MessageConflict`. An error part-way carries the chain's stored
        messages (``written``) and the index of the one that failed (``failed_index``), across
        requests: see :class:`~chronicle_sdk.ChronicleError`."""
        results: list[AppendResult] = []
        parent = parent_id
        key = uuid.uuid4().hex  # the call's name in every request and retry: what it stored is created
        batches = _batches(messages)
        for chunk in batches:
            try:
                out = await self._send(
                    via,
                    "POST",
                    self._path(session_id, "/messages:batch"),
                    {"messages": chunk, "parent_id": parent},
                    session=session_id,
                    idempotent=True,
                    headers={"Idempotency-Key": key},
                )
            except ChronicleError as err:  # what the chain stored before it failed: on the error
                err.failed_index = len(results) + (err.failed_index or 0)
                err.written = results + err.written
                if err.written:
                    self.note_seq(session_id, max(w.seq for w in err.written))  # stored: reads wait for it
                if len(batches) > 1:  # the server's detail speaks of one request: say what of the chain is stored
                    err.detail = f"{err.detail.rstrip()} {_chain_stored(err, messages)}"
                    err.args = (err.detail,)
                raise
            self.note_seq(session_id, out["seq"])
            results += [
                AppendResult(str(r["id"]), r.get("parent_id"), int(r["seq"]), bool(r.get("created", True)))
                for r in out["messages"]
            ]
            parent = results[-1].id
        return results

    # -- commands over NATS -----------------------------------------------------------------

    async def _command(self, routed: Routed, safe: bool, tries: _Tries) -> Any:
        """Send a write as a NATS command and return its reply as :meth:`request` returns an
        answer: the server ran the route's code, so success, errors and retries are HTTP's."""
        info = await self.nats_publishing()
        direct = await self._connect_direct(info)
        data = _json_bytes(routed.payload)
        if len(data) > direct.nc.max_payload:  # bigger than one NATS message: the API takes it
            raise _TooBigForNats()
        subject = f"{info.command_prefix}.{ids.encode_token(info.tenant)}.{routed.command.name}"
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        not_sent: tuple[type[Exception], ...] = (Unavailable, _NatsDown, *_nats_not_sent())
        while True:
            try:
                direct = await self._connect_direct(info)  # a closed connection is opened again
                if not direct.nc.is_connected:  # reconnecting: sent now, it would wait in a buffer
                    raise _NatsDown(f"the connection to NATS at {self.nats_url} is down (reconnecting)")
                msg = await direct.nc.request(subject, data, timeout=self._timeout)
            except not_sent as exc:  # not sent: nothing can have been written
                if (pause := self._next_pause(tries)) is not None:
                    await self._pause(tries, pause)
                    continue
                if isinstance(exc, Unavailable):
                    raise
                raise Unavailable(f"{routed.command.name}: NATS at {self.nats_url}: {exc}") from exc
            except NoRespondersError as exc:  # nobody received it: nothing can have been written
                if (pause := self._next_pause(tries)) is not None:
                    await self._pause(tries, pause)
                    continue
                raise Unavailable(f"no command service answers on {subject}: is `chronicle commands` running?") from exc
            except (NatsTimeout, TimeoutError) as exc:
                if direct.errors.denied is not None:
                    raise Unauthorized(
                        f"NATS denied the {direct.who}: {direct.errors.denied}", code="nats_unauthorized", status=0
                    ) from exc
                if safe and (pause := self._next_pause(tries)) is not None:
                    await self._pause(tries, pause)
                    continue
                raise Unavailable(
                    f"{routed.command.name}: no reply on {subject} in {self._timeout} s{MAY_HAVE_RUN}"
                ) from exc
            status = reply_status(msg.headers)
            try:
                payload: Any = json.loads(msg.data)
            except ValueError:
                payload = msg.data.decode("utf-8", "replace")
            if 200 <= status < 400:
                try:
                    routed.command.reply.model_validate(payload)  # the contract's reply
                except ValidationError as exc:
                    raise ChronicleError(
                        f"the reply to {routed.command.name} does not match the contract: {exc}",
                        code="invalid_reply",
                        status=status,
                    ) from exc
                return payload
            err = error_from_problem(status or 502, payload)
            pause = self._retry_pause(err, tries, safe)
            if pause is not None:
                await self._pause(tries, pause)
                continue
            raise err

    # -- direct JetStream path --------------------------------------------------------------

    async def nats_publishing(self) -> NatsPublishing:
        """How this key's tenant publishes to JetStream (``GET /v1/nats``, asked once): its tenant,
        the stream's layout, the inbox prefix and the size limits. Raises
        :class:`~chronicle_sdk.Unauthorized` for an unknown API key."""
        if self._publishing is None:
            try:
                out = await self.request("GET", "/v1/nats")
            except Unauthorized as exc:
                raise Unauthorized(
                    f"the API refused this client's API key ({exc.detail}), so it has no NATS credentials "
                    "for the direct path either",
                    code=exc.code,
                    status=exc.status,
                    problem=exc.problem,
                ) from exc
            except NotFound as exc:
                raise NotFound(
                    f"this server does not offer direct publishing (GET /v1/nats: {exc.detail})",
                    code=exc.code,
                    status=exc.status,
                    problem=exc.problem,
                ) from exc
            self._publishing = NatsPublishing.from_json(out)
        return self._publishing

    def _credentials(self, info: NatsPublishing) -> str:
        """The NATS credentials this client uses, in words (for error messages; never a secret);
        ``ValueError`` for a credentials file that does not exist."""
        if self.nats_credentials is not None:
            if not Path(self.nats_credentials).is_file():
                raise ValueError(f"nats_credentials: no such file {self.nats_credentials}")
            return f"credentials file {self.nats_credentials}"
        from events.credentials import nkey_public_key, tenant_nkey_seed

        public = nkey_public_key(tenant_nkey_seed(self._api_key))
        return f"NKey user {public} derived from the API key of tenant {info.tenant!r}"

    async def _connect_direct(self, info: NatsPublishing) -> _Direct:
        """The client's NATS connection, opened on first use, and opened again when the cached one
        was closed (nats-py gave up on it, or the server dropped it for good): a closed
        connection raised ``ConnectionClosedError`` on every later call, for the client's life.
        A connection belongs to the event loop that opened it: used from another (a later
        ``asyncio.run``), the client connects again on that one."""
        loop = asyncio.get_running_loop()
        if self._direct is not None and self._direct.loop is not loop:
            self._direct = None  # its loop is gone, and its tasks with it: nothing of it can run here
            self._direct_lock = asyncio.Lock()  # a lock that waited once is bound to that loop too
        async with self._direct_lock:
            if self._direct is not None and self._direct.nc.is_closed:
                stale, self._direct = self._direct, None
                await _discard(stale.nc)
            if self._direct is None:
                self._direct = await self._open_nats(info)
            return self._direct

    async def _open_nats(self, info: NatsPublishing) -> _Direct:
        from nats.aio.client import Client

        from events.credentials import tenant_nkey_seed
        from events.publisher import Publisher

        assert self.nats_url is not None
        who = self._credentials(info)
        guard = _NatsErrors()
        nc = Client()
        auth: dict[str, Any] = (
            {"user_credentials": self.nats_credentials}
            if self.nats_credentials is not None
            else {"nkeys_seed_str": tenant_nkey_seed(self._api_key)}
        )
        try:
            await nc.connect(
                [url.strip() for url in self.nats_url.split(",") if url.strip()],  # a cluster: its nodes
                connect_timeout=5,
                max_reconnect_attempts=NATS_CONNECT_ATTEMPTS,  # the first connect: fail, do not hang
                reconnect_time_wait=1,
                inbox_prefix=info.inbox_prefix,
                error_cb=guard.on_error,
                **auth,
            )
        except _NatsRefused as exc:
            await _discard(nc)
            raise Unauthorized(
                f"NATS at {self.nats_url} refused the {who}: {exc}", code="nats_unauthorized", status=0
            ) from exc
        except Exception as exc:
            await _discard(nc)
            raise Unavailable(f"cannot connect to NATS at {self.nats_url} with the {who}: {exc!r}") from exc
        guard.connecting = False
        # connected: from now on reconnect for as long as the client is open (an outage of any
        # length ends with the connection back; meanwhile calls raise Unavailable)
        nc.options["max_reconnect_attempts"] = -1
        from chronicle_sdk.sealing import ServerKeys

        async def ask(path: str) -> dict[str, Any]:
            out: dict[str, Any] = await self.request("GET", path)
            return out

        async def stored_on(event: Any, subject: str, seq: int) -> bool:
            """Whether the message at ``seq`` (a publish answered "duplicate") is this session's:
            a tenant may not read the log over NATS, so the API reads that one sequence of the
            session's events (nothing when the message there is on another subject)."""
            query = {"from_seq": seq, "to_seq": seq, "limit": 1}
            lines = await self.request("GET", self._path(event.session, "/events"), params=query)
            return any(json.loads(line).get("seq") == seq for line in str(lines or "").split("\n") if line.strip())

        # sealed with the session's data key when the deployment seals (chronicle_sdk/sealing.py)
        publisher = Publisher(nc.jetstream(), info.layout, keys=ServerKeys(ask), stored_on=stored_on)
        return _Direct(nc, publisher, guard, who)

    async def _pack(self, info: NatsPublishing, message: Mapping[str, Any]) -> tuple[Message, dict[str, Any] | None]:
        """The validated body and its event fields; ``None`` when the body needs a claim check."""
        from events.bodies import pack_body

        body = _check_message(message)
        checked_new_message_id(body["id"])  # as the API refuses it: no URL could name it
        try:
            size = len(canonical_json(body))
        except UnicodeEncodeError as exc:
            raise InvalidRequest(f"message {body['id']!r} {UNENCODABLE}", status=422) from exc
        if size > info.max_message_bytes:
            raise PayloadTooLarge(f"message is {size} bytes; the limit is {info.max_message_bytes}", status=413)
        if len(stored_json(body).encode()) > info.payload_limit_bytes:  # pack_body's claim-check rule
            return body, None
        return body, await pack_body(body, None, info.payload_limit_bytes)

    async def _last_seq(self, session_id: str) -> int:
        """The stream sequence of the session's newest event (0 when none), from the API."""
        out = await self.request("GET", self._path(session_id, "/last-seq"))
        return int(out["seq"])

    async def _live_state(self, session_id: str, last: int) -> None:
        """Raise :class:`SessionNotFound` when the session has events but no live registry row
        (deleted), :class:`SessionErased` when its newest event is of an erased session (its
        ``session.erased``, or a tombstone of one published after it)."""
        if last and await self.get_optional(self._path(session_id), min_seq=last) is None:
            query = {"from_seq": last, "to_seq": last, "limit": 1}
            lines = await self.request("GET", self._path(session_id, "/events"), params=query)
            for line in str(lines or "").split("\n"):
                event = json.loads(line).get("event") if line.strip() else None
                if isinstance(event, dict) and (event.get("type") == "session.erased" or event.get("erased") is True):
                    raise SessionErased(f"session {session_id!r} was erased", status=410)
            raise SessionNotFound(f"session {session_id!r} was deleted", status=404)

    async def _has_message(self, session_id: str, message_id: str, last: int) -> bool:
        if not last:
            return False
        found = await self.get_optional(self._path(session_id, f"/messages/{quote(message_id)}"), min_seq=last)
        return found is not None

    async def _stored_ids(self, session_id: str, message_ids: Sequence[str], last: int) -> set[str]:
        """Which of ``message_ids`` the session holds once its events up to ``last`` are applied
        (none when it has no events): a direct chain's messages that are repeats, not created.
        One ``POST …/messages:exists`` for the whole list (one per :data:`_EXISTS_LIMIT` ids);
        a session that is not there holds none (:meth:`_live_state` says why)."""
        if not last:
            return set()
        path = self._path(session_id, "/messages:exists")

        async def held(part: list[str]) -> list[str]:
            try:
                out = await self.request("POST", path, params={"min_seq": last}, body={"ids": part}, idempotent=True)
            except NotFound as exc:
                if exc.code == "session_not_found":
                    return []
                raise
            return [str(i) for i in out["existing"]]

        ids_ = list(message_ids)
        parts = [ids_[i : i + _EXISTS_LIMIT] for i in range(0, len(ids_), _EXISTS_LIMIT)]
        return {mid for found in await asyncio.gather(*(held(part) for part in parts)) for mid in found}

    def _publish_error(self, direct: _Direct, exc: Exception) -> ChronicleError:
        """The SDK error for a failed publish: refused by the contract, denied by NATS, or unavailable."""
        from events.publisher import ForeignDuplicate, Refused

        if isinstance(exc, ForeignDuplicate):
            return EventIdTaken(
                f"JetStream holds this write's event id {exc.event_id} in another message (seq {exc.seq}), not "
                "one of this session: someone publishing straight to the stream took it first; nothing of this "
                "write was stored",
                status=0,
            )
        if isinstance(exc, ChronicleError):  # the API's answer while sealing (the session is erased, say)
            return exc
        if isinstance(exc, Refused):
            problem = {"code": "", "detail": exc.detail, "reason": exc.reason}
            if exc.reason == "too_large":
                return PayloadTooLarge(exc.detail, status=413, problem={**problem, "code": "payload_too_large"})
            return InvalidRequest(exc.detail, status=422, problem={**problem, "code": "invalid_request"})
        if direct.errors.denied is not None:
            return Unauthorized(
                f"NATS denied the {direct.who}: {direct.errors.denied}", code="nats_unauthorized", status=0
            )
        return Unavailable(f"publishing to NATS at {self.nats_url} with the {direct.who} failed: {exc}")

    async def _publish(self, direct: _Direct, event: Any, expected: int | None) -> Published | None:
        """Publish; the stream's answer (its seq, and whether the event was a duplicate), or None
        on a concurrency conflict."""
        from events.publisher import ConcurrencyConflict

        try:
            return await direct.publisher.publish(event, expected_last_subject_seq=expected)
        except ConcurrencyConflict:
            return None
        except Exception as exc:
            raise self._publish_error(direct, exc) from exc

    async def _conflict_pause(self, attempt: int) -> None:
        await asyncio.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))  # noqa: S311

    async def _append_chain_direct(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], parent_id: str | None
    ) -> list[AppendResult]:
        """A chain pipelined with ``Publisher.publish_many``; the first event is conditional.

        Event ids are derived from (tenant, session, message, parent, body) and the API key
        (:func:`direct_append_id`), so re-running a failed bulk call inside the stream's duplicate
        window appends nothing twice, and no other tenant can derive them; an id that
        is already stored keeps its first body (the projection ignores the repeat), as the
        reference's ``appendAll`` does. ``created`` is False, as over HTTP, for a message whose id
        the session held before the chain (read once, before the first, conditional, publish: one
        ``POST …/messages:exists`` for the chain's ids when the session has events; an id stored by
        another writer while a concurrency conflict is retried is not read again) and for an event
        the stream answered "duplicate" (the same chain again inside its duplicate window).

        A chain holding a body over the payload limit (claim check, which only the server
        writes) is sent whole over HTTP (``messages:batch``): nothing is appended twice there
        either (the server is idempotent by message id), but an id already stored with a
        different body is a :class:`~chronicle_sdk.MessageConflict`, as on the HTTP path.
        So is a chain holding a compaction summary's id (``compaction_…``, a history sent back with
        a new message): only the server knows the session's overlays, and decides the summary a
        replay (the chain goes on after the last message it covers) or a refusal.
        """
        from events.catalog import MessageAppended, overlay_id_in
        from events.publisher import Refused

        if any(overlay_id_in(str(m.get("id"))) is not None for m in messages):
            return await self._append_chain_api(session_id, messages, parent_id, "http")
        checked_session_id(session_id)
        info = await self.nats_publishing()
        tenant = info.tenant
        if parent_id is not None:
            parent_id = checked_message_id(parent_id)
        events: list[MessageAppended] = []
        results: list[tuple[str, str | None]] = []
        parent = parent_id
        for message in messages:
            body, packed = await self._pack(info, message)
            if packed is None:
                return await self._append_chain_api(session_id, messages, parent_id, "http")
            mid = str(body["id"])
            event_id = direct_append_id(self._api_key, tenant, session_id, mid, parent, body)
            events.append(
                MessageAppended(
                    id=event_id, tenant=tenant, session=session_id, message_id=mid, parent_id=parent, **packed
                )
            )
            results.append((mid, parent))
            parent = mid
        direct = await self._connect_direct(info)
        stored: set[str] | None = None  # read once: an id the session holds stays held
        for attempt in range(self._conflict_attempts):
            last = await self._last_seq(session_id)
            _, parent_found, found = await asyncio.gather(
                self._live_state(session_id, last),
                self._has_message(session_id, parent_id, last) if parent_id is not None else _none(),
                self._stored_ids(session_id, [mid for mid, _ in results], last) if stored is None else _none(),
            )
            stored = stored if stored is not None else found or set()
            if parent_id is not None and not parent_found:
                raise UnknownParent(f"parent message {parent_id!r} is not in this session", status=422)
            try:
                first = await self._publish(direct, events[0], last)
            except ChronicleError as err:  # a lone conditional publish: nothing after it was sent
                _chain_failed(err, messages, [], pipelined=False)
                raise
            if first is None:
                await self._conflict_pause(attempt)
                continue
            published = [first]  # the unbroken acknowledged prefix of the chain
            try:
                await direct.publisher.publish_many(events[1:], into=published)
            except Exception as exc:
                self.note_seq(session_id, max(p.seq for p in published))  # stored: the client's reads wait for it
                refused = isinstance(exc, Refused)  # admitted before any was published: none after the first was
                written = [
                    AppendResult(mid, pid, p.seq, not p.duplicate and mid not in stored)
                    for (mid, pid), p in zip(results, published, strict=False)
                ]
                failed = _chain_failed(self._publish_error(direct, exc), messages, written, pipelined=not refused)
                raise failed from exc
            self.note_seq(session_id, max(p.seq for p in published))
            return [
                AppendResult(mid, pid, p.seq, not p.duplicate and mid not in stored)
                for (mid, pid), p in zip(results, published, strict=True)
            ]
        raise Contention(f"gave up after {self._conflict_attempts} conflicting attempts", status=503)


def direct_append_id(api_key: str, tenant: str, session_id: str, mid: str, parent: str | None, body: Any) -> str:
    """The event id of a message appended straight to JetStream: derived from the append and,
    in place of the body's plain hash, one keyed by the API key, so that a retry gets the same id
    and no other tenant can derive it (any publisher can learn the stream's newest event id, and
    one derived from the body alone would confirm a guess of the body)."""
    return ids.derived_id("sdk:append", tenant, session_id, mid, parent, ids.keyed_digest(api_key, body_hash(body)))


def _require_nats() -> None:
    """The direct path's libraries (nats-py, its nkeys, and cryptography to seal events), which only
    the ``nats`` extra installs."""
    missing = [name for name in ("nats", "nkeys", "cryptography") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"nats_url needs {' and '.join(missing)}, which the SDK installs only with its nats extra: "
            "pip install 'chronicle-sdk[nats]'"
        )


class _NatsDown(Exception):
    """The client's NATS connection is reconnecting: a request is not sent (it fails as
    :class:`Unavailable` after the retries)."""


def _nats_not_sent() -> tuple[type[Exception], ...]:
    """nats-py's errors for a request that never left the client (a closed or draining connection,
    no server left, a full reconnect buffer): retried, then :class:`Unavailable`."""
    from nats import errors

    return (
        errors.ConnectionClosedError,
        errors.ConnectionDrainingError,
        errors.ConnectionReconnectingError,
        errors.NoServersError,
        errors.OutboundBufferLimitError,
        errors.StaleConnectionError,
    )


class _TooBigForNats(Exception):
    """A command's request is over the NATS server's ``max_payload``: it goes over HTTP instead."""


class _NatsRefused(Exception):
    """The NATS server refused the client's credentials while connecting."""


class _NatsErrors:
    """The NATS connection's error callback: fails the first connect at once when the server refuses
    the credentials (instead of retrying them), and remembers permission violations, which the
    server reports asynchronously (a denied publish otherwise only times out)."""

    def __init__(self) -> None:
        self.connecting = True
        self.denied: str | None = None

    async def on_error(self, exc: Exception) -> None:
        text = str(exc) or type(exc).__name__
        lowered = text.lower()
        if (
            "authorization violation" in lowered
            or "authentication" in lowered
            or type(exc).__name__ == ("AuthorizationError")
        ):
            if self.connecting:
                raise _NatsRefused(text)
            self.denied = text
        elif "permissions violation" in lowered:
            self.denied = text


@dataclass(slots=True)
class _Direct:
    nc: NatsClient
    publisher: Publisher
    errors: _NatsErrors
    who: str
    loop: asyncio.AbstractEventLoop | None = field(default_factory=lambda: _running_loop())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # none: made outside a loop
        return None


async def _none() -> None:
    return None


async def _discard(nc: NatsClient) -> None:
    """Close a connection whose connect failed (whatever state that left it in)."""
    with contextlib.suppress(Exception):
        await nc.close()


def _query_value(value: Any) -> str:
    """A query parameter as text, booleans as ``true``/``false`` (what the API parses)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


__all__ = ["ChronicleClient", "ChronicleError", "Via"]
