"""Skill documents are bounded (``CHRONICLE_MAX_SKILL_BYTES``, 1 MiB by default): a put of a larger
one stores nothing (the ``set_context`` tool answers ``Error: …``, ``chronicle skills put`` exits 2
naming ``skill_too_large``), and ``load_context`` of one stored larger (before the bound, or
uploaded out of band) answers ``Error: …`` and loads nothing: no part of it reaches the LLM. A
document at the bound, and an empty one, are stored and loaded whole, as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from minio.error import S3Error

from services.settings import Settings
from tests.e2e.context_support import configure, events, minio, new_bucket, put_object, sid, tenant_key, tool
from tests.support import chronicle_cli

MAX_SKILL_BYTES = 1024 * 1024  # CHRONICLE_MAX_SKILL_BYTES' default, the e2e stack's
AT_BOUND = "é" * (MAX_SKILL_BYTES // 2)  # UTF-8 bytes are counted, not characters
OVER = "x" * (MAX_SKILL_BYTES + 1)


def _block(bucket: str) -> dict[str, Any]:
    return {"kind": "skills", "label": "skills", "description": "Loadable docs", "bucket": bucket, "prefix": "skills/"}


def _stored(settings: Settings, bucket: str, key: str) -> bool:
    try:
        minio(settings).stat_object(bucket, tenant_key(key))
    except S3Error as exc:
        if exc.code != "NoSuchKey":
            raise
        return False
    return True


def _skill_events(evs: list[dict[str, Any]]) -> list[str]:
    return [e["event"]["type"] for e in evs if e["event"]["type"].startswith("skill.")]


async def test_set_context_of_a_document_over_the_bound_stores_nothing(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    s = sid()
    await configure(client, s, {"blocks": [_block(bucket)]})
    before = await events(client, s)
    args = {"label": "skills", "content": OVER, "metadata": {"title": "big", "description": "Too big"}}
    result, _ = await tool(client, s, "set_context", args)
    assert result == (
        f'Error: Skill "big" is {MAX_SKILL_BYTES + 1:,} bytes, more than the {MAX_SKILL_BYTES:,} a skill document '
        "may have (CHRONICLE_MAX_SKILL_BYTES); nothing was stored: write a shorter document, or split it in several"
    )
    assert not _stored(api_settings, bucket, "skills/big")
    assert await events(client, s) == before

    # at the bound: stored and loaded whole
    args = {"label": "skills", "content": AT_BOUND, "metadata": {"title": "edge", "description": "At the bound"}}
    assert (await tool(client, s, "set_context", args))[0] == 'Indexed "edge" in skills.'
    assert (await tool(client, s, "load_context", {"label": "skills", "key": "edge"}))[0] == AT_BOUND


async def test_load_context_of_a_document_stored_over_the_bound_is_an_error_and_loads_nothing(
    client: httpx.AsyncClient, api_settings: Settings
) -> None:
    bucket = new_bucket(api_settings)
    s = sid()
    await configure(client, s, {"blocks": [_block(bucket)]})
    put_object(api_settings, bucket, "skills/huge", OVER, description="Stored before the bound")
    put_object(api_settings, bucket, "skills/empty", "")

    result, _ = await tool(client, s, "load_context", {"label": "skills", "key": "huge"})
    assert result == (
        f'Error: Skill "huge" is more than the {MAX_SKILL_BYTES:,} bytes a skill document may have '
        "(CHRONICLE_MAX_SKILL_BYTES): it was not loaded; it loads once it is stored again, shorter"
    )
    assert _skill_events(await events(client, s)) == []
    result, _ = await tool(client, s, "unload_context", {"label": "skills", "key": "huge"})
    assert result == 'Skill "huge" is not currently loaded in "skills".'

    # an empty document is read whole (a ranged read of nothing), as before
    assert (await tool(client, s, "load_context", {"label": "skills", "key": "empty"}))[0] == ""
    assert _skill_events(await events(client, s)) == ["skill.loaded"]


@pytest.mark.timeout(180)
async def test_cli_put_of_a_document_over_the_bound_stores_nothing(api_settings: Settings, tmp_path: Path) -> None:
    bucket = new_bucket(api_settings)
    doc = tmp_path / "big.md"
    doc.write_text(OVER, encoding="utf-8")
    done = chronicle_cli(
        api_settings, "skills", "put", str(doc), "--bucket", bucket, "--key", "skills/big", "--tenant", "tenant-a",
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "(skill_too_large)" in done.stderr
    assert f"is {MAX_SKILL_BYTES + 1:,} bytes, more than the {MAX_SKILL_BYTES:,}" in done.stderr
    assert done.stdout == ""
    assert not _stored(api_settings, bucket, "skills/big")
