"""``GET /v1/sessions/{sid}/events`` when a data key cannot be opened (a key-encryption key not
configured in the process that answers: a KEK rotated in the wrong order). Before any line is
sent, the answer is ``500 key_unavailable`` (problem+json), as an append's is; it was ``200`` with
no line. A key that fails once lines were sent cuts the answer short (no last chunk): the client
sees an incomplete answer, never a complete one missing events. Real HTTP (uvicorn), NATS,
Postgres; processes of one deployment with different key-encryption keys."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from events.omitted import OMITTED
from events.sealing import KeyUnavailable
from projections.keystore import new_kek_line
from services.api.app import build_app
from services.bootstrap import Container, open_container
from services.settings import Settings
from tests.conftest import KEYS, TEST_KEK, make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import served

T = "tenant-a"


def variant(base: Settings, *, encryption: bool, kek: str) -> Settings:
    """Another process of ``base``'s deployment (its stream, subjects, projector) with its own KEK."""
    return base.model_copy(update={"encryption": encryption, "kek": SecretStr(kek)})


@contextlib.asynccontextmanager
async def api(settings: Settings) -> AsyncIterator[tuple[Container, httpx.AsyncClient]]:
    async with open_container(settings) as c, served(build_app(settings, c)) as url:
        headers = {"Authorization": f"Bearer {KEYS[T]}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
            yield c, http


def problem_code(r: httpx.Response) -> tuple[int, str, str]:
    return r.status_code, r.headers["content-type"], r.json()["code"]


async def append(settings: Settings, sid: str, *mids: str) -> int:
    async with running_stack(settings) as c:
        for mid in mids:
            last = await c.commands.append(T, sid, text_message(mid, f"words of {mid}"), OMITTED)
        await c.waiter.wait_all(last.seq, timeout_s=20)
        return last.seq


async def test_a_read_whose_first_events_key_cannot_be_opened_is_500_key_unavailable(
    nats_url: str, fresh_db: str
) -> None:
    written = variant(make_settings(nats_url, fresh_db), encryption=True, kek=TEST_KEK)
    sid = f"k-{uuid.uuid4().hex[:8]}"
    await append(written, sid, "m1", "m2")
    other_kek = variant(written, encryption=True, kek=new_kek_line())  # the KEK it was wrapped by is not here
    async with api(other_kek) as (_, http):
        for params in ({}, {"follow": "true"}, {"from_seq": "2"}):
            r = await http.get(f"/v1/sessions/{sid}/events", params=params)
            assert problem_code(r) == (500, "application/problem+json", "key_unavailable"), (params, r.text)
            assert "key-encryption key" in r.json()["detail"]
        appended = await http.post(f"/v1/sessions/{sid}/messages", json={"message": text_message("m3", "more")})
        assert problem_code(appended) == (500, "application/problem+json", "key_unavailable")
    async with api(written) as (_, http):  # the process holding the KEK reads every event
        r = await http.get(f"/v1/sessions/{sid}/events")
        assert r.status_code == 200
        assert len(r.text.splitlines()) == 2  # m1, m2


async def drain(lines: AsyncIterator[str], into: list[str]) -> None:
    async for line in lines:
        into.append(line)


async def lines_until_cut(http: httpx.AsyncClient, sid: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The lines an answer gave before it was cut short (:class:`httpx.RemoteProtocolError`: the
    answer ended without its last chunk); fails if it ended as a complete answer."""
    got: list[str] = []
    async with http.stream("GET", f"/v1/sessions/{sid}/events", params=params) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
            await drain(r.aiter_lines(), got)
    return [json.loads(line) for line in got if line]


async def test_a_followed_answer_whose_later_events_key_cannot_be_opened_is_cut_short(
    nats_url: str, fresh_db: str
) -> None:
    """A session written unsealed, followed by a process that knows the old KEK only; another
    process, the new KEK first, seals the session's next event with a key it wraps with it."""
    plain = variant(make_settings(nats_url, fresh_db), encryption=False, kek=TEST_KEK)
    sid = f"k-{uuid.uuid4().hex[:8]}"
    await append(plain, sid, "m1")
    rotated = variant(plain, encryption=True, kek=f"{new_kek_line()},{TEST_KEK}")
    async with api(variant(plain, encryption=True, kek=TEST_KEK)) as (_, http):
        got: list[dict[str, Any]] = []
        async with http.stream("GET", f"/v1/sessions/{sid}/events", params={"follow": "true"}) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            while not got:  # m1: what is stored already
                if line := await anext(lines):
                    got.append(json.loads(line))
            await append(rotated, sid, "m2")
            rest: list[str] = []
            with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
                await drain(lines, rest)
            assert not any(rest), rest  # keep-alives at most: no line for m2, and no clean end
        assert [g["event"]["message"]["id"] for g in got] == ["m1"]
        again = await http.get(f"/v1/sessions/{sid}/events", params={"follow": "true"})
        assert problem_code(again) == (500, "application/problem+json", "key_unavailable")


async def test_a_page_whose_later_events_key_cannot_be_opened_is_cut_short(
    nats_url: str, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unsealed events, then sealed ones: the page's first lines are sent, then the key is asked
    for again (evicted in a long page, say) and cannot be opened (rewrapped meanwhile by a KEK
    this process lacks: stood in for by the key store raising as it then does)."""
    plain = variant(make_settings(nats_url, fresh_db), encryption=False, kek=TEST_KEK)
    sid = f"k-{uuid.uuid4().hex[:8]}"
    await append(plain, sid, "m1", "m2")
    sealing = variant(plain, encryption=True, kek=TEST_KEK)
    await append(sealing, sid, "m3", "m4")
    async with api(sealing) as (c, http):

        async def unwrappable(wanted: Any) -> None:
            raise KeyUnavailable("data key wrapped by key-encryption key 'kek-new', which is not configured")

        monkeypatch.setattr(c.keys, "load", unwrappable)
        got = await lines_until_cut(http, sid, {})
        assert [g["event"]["message"]["id"] for g in got] == ["m1", "m2"]  # the unsealed ones, whole
        monkeypatch.undo()
        whole = await http.get(f"/v1/sessions/{sid}/events")
        assert whole.status_code == 200
        assert len(whole.text.splitlines()) == 4
