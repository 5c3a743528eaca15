"""Followed event answers (``GET …/events?follow=true``): a session's events sent as the log
stores them, in an answer that stays open.

An answer ends when ``to_seq`` is passed (the stream reached it, whichever session's event it
is), after ``limit`` events, after the session's deletion or erasure, when the client leaves,
when the process stops or a reload of the keys (SIGHUP) revoked the key it was opened with, or
gave it to another tenant (within a tick, as the process stopping: the SDK's follow asks again
and meets 401), or when the client reads too slowly for what is coming
(its buffer would grow without bound): the client resumes with ``from_seq`` = the last ``seq`` it
got + 1 and misses nothing. Each tenant holds at most ``follow_streams_per_tenant`` answers in one
process with its full keys, and as many again with its read-only keys: an auditor's followers
cannot take the slots the tenant's agent services follow with, nor theirs an auditor's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from events import log as eventlog
from events.catalog import SessionDeleted, SessionErased
from events.sealing import kid_in
from services.audit import readers as audit
from services.bootstrap import Container
from services.errors import TooManyStreams

KEEPALIVE_S = 15.0
"""How long a followed answer stays silent before it sends a blank line."""
TICK_S = 1.0
"""How often a silent answer looks at what ends it (the process stopping, its key revoked, ``to_seq`` reached)."""
NDJSON = "application/x-ndjson"
ENDING_TYPES = frozenset({SessionDeleted.TYPE, SessionErased.TYPE})
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies pass each line on at once

_following: Counter[tuple[str, bool]] = Counter()
"""Followed answers open in this process, per tenant and kind of key (read-only or full)."""


class FollowedResponse(StreamingResponse):
    """A streaming answer that gives its tenant's slot back when it is over, however it ends
    (finished, the client gone, even before its first byte)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(content, media_type=NDJSON, headers=HEADERS)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def followed(
    c: Container,
    stopping: asyncio.Event,
    tenant: str,
    sid: str,
    from_seq: int,
    to_seq: int | None,
    limit: int | None,
    read_only: bool,
    granted: Callable[[], bool],
) -> FollowedResponse:
    """The answer, holding one of the slots of the tenant's full or read-only keys (429
    ``too_many_streams`` when none is free); it ends once ``granted()`` is false (its key revoked)."""
    allowed = c.settings.follow_streams_per_tenant
    slots = (tenant, read_only)
    if _following[slots] >= allowed:
        keys = "read-only keys" if read_only else "full keys"
        raise TooManyStreams(
            f"tenant {tenant!r} already follows {allowed} event streams with its {keys} in this process"
        )
    _following[slots] += 1

    def release() -> None:
        _following[slots] -= 1
        if not _following[slots]:
            del _following[slots]

    return FollowedResponse(_lines(c, stopping, granted, tenant, sid, from_seq, to_seq, limit), release)


def open_answers(tenant: str, read_only: bool | None = None) -> int:
    """Followed answers the tenant holds open in this process (``read_only``: with those keys only,
    or with its full keys only; None: with either)."""
    kinds = (False, True) if read_only is None else (read_only,)
    return sum(_following[(tenant, kind)] for kind in kinds)


async def _lines(
    c: Container,
    stopping: asyncio.Event,
    granted: Callable[[], bool],
    tenant: str,
    sid: str,
    from_seq: int,
    to_seq: int | None,
    limit: int | None,
) -> AsyncIterator[bytes]:
    if to_seq is not None and to_seq < from_seq:
        return
    sent = 0  # the session's keys were asked for before the answer began (services/api/log.py)

    def ended() -> bool:  # the process stops, or a reload revoked the key
        return stopping.is_set() or not granted()

    stored = _stored(c, ended, c.layout.session_subject(tenant, sid), from_seq, to_seq)
    async with contextlib.aclosing(stored):
        async for ev in stored:
            if ev is None:
                await c.keys.refresh([(tenant, sid)])  # an erasure by another process, say
                yield b"\n"  # a keep-alive: proxies close answers that stay silent
                continue
            if (kid := kid_in(ev.data)) is not None:
                await c.keys.load([(tenant, sid, kid)])  # a key made since the answer began
            shown = audit.event_line(ev, c.layout, c.keys)
            yield shown
            sent += 1
            if sent == limit or ev.seq == to_seq or ends_session(shown) or ended():
                return


async def _stored(
    c: Container, ended: Callable[[], bool], subject: str, from_seq: int, to_seq: int | None
) -> AsyncGenerator[eventlog.StoredEvent | None, None]:
    """The subject's events from ``from_seq``: what is stored already, read to its end (a backlog
    arrives at once), then what comes next; None when a keep-alive is due. Ends once the stream
    passed ``to_seq``, when ``ended()`` (the process stops, the key was revoked: looked at each
    tick and each event), or when the reader falls behind (the client resumes from its last
    ``seq`` + 1)."""
    next_seq = from_seq
    async with contextlib.aclosing(eventlog.read(c.js, c.layout, subject, from_seq, to_seq)) as backlog:
        async for old in backlog:
            next_seq = old.seq + 1
            yield old
    quiet = 0.0
    async with contextlib.aclosing(eventlog.follow(c.js, c.layout, subject, next_seq, TICK_S)) as live:
        try:
            async for ev in live:
                if ended():
                    return  # the process stops (the client resumes elsewhere, from its last seq + 1), or the key went
                if ev is not None:
                    if to_seq is not None and ev.seq > to_seq:
                        return
                    quiet, next_seq = 0.0, ev.seq + 1
                    yield ev
                elif to_seq is not None and await eventlog.last_seq(c.js, c.layout) >= to_seq:
                    # every event up to to_seq is stored: read what was not delivered yet, and end
                    async with contextlib.aclosing(eventlog.read(c.js, c.layout, subject, next_seq, to_seq)) as rest:
                        async for tail in rest:
                            yield tail
                    return
                elif (quiet := quiet + TICK_S) >= KEEPALIVE_S:
                    quiet = 0.0
                    yield None
        except eventlog.FollowerBehind:
            return  # the client reads slower than events come: it resumes from its last seq + 1


def ends_session(line: bytes) -> bool:
    """Whether an answer's line shows its session's deletion or erasure (as the SDK decides)."""
    record: Any = json.loads(line)
    shown = record.get("event") or record.get("erased") or {}
    return isinstance(shown, dict) and shown.get("type") in ENDING_TYPES
