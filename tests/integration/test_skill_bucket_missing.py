"""A skills block whose bucket was deleted after the config named it: the ``set_context`` tool's
put is an ``Error: …`` result (tools never raise) and a warning for the operator; nothing is
uploaded, recorded or made. Real JetStream, Postgres and moto's S3."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from minio import Minio

from events.context import SessionConfig
from projections import context_queries
from services.bootstrap import Container
from services.context.rules import skill_sources


def s3(c: Container) -> Minio:
    s = c.settings
    return Minio(s.s3_endpoint, s.s3_access_key, s.s3_secret_key, secure=False, region=s.s3_region)


async def test_set_context_into_a_deleted_bucket_is_an_error_result_and_a_warning_and_stores_nothing(
    stack: Container, new_id: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    c, s, bucket = stack, new_id("skills"), new_id("sk")
    s3(c).make_bucket(bucket)
    config = SessionConfig.model_validate(
        {"blocks": [{"kind": "skills", "label": "skills", "description": "Docs", "bucket": bucket}]}
    )
    await c.waiter.wait_all(await c.context.configure("tenant-a", s, config), timeout_s=20)
    s3(c).remove_bucket(bucket)
    args = {"label": "skills", "content": "Tax doc", "metadata": {"title": "tax", "description": "Tax workflows"}}
    with caplog.at_level(logging.WARNING, "chronicle.context"):
        result = await c.context.execute("tenant-a", s, "set_context", args)
    assert result == (
        f'Error: Skill "tax" not stored: the bucket {bucket!r} of block "skills" does not exist '
        "(the deployment must create it)"
    )
    warned = [r for r in caplog.records if r.name == "chronicle.context" and r.levelno == logging.WARNING]
    warnings = [r.getMessage() for r in warned]
    assert warnings == [
        f"skills block 'skills' of session {s!r} (tenant 'tenant-a'): bucket {bucket!r} does not exist; "
        "create it, with its policy"
    ]
    assert not s3(c).bucket_exists(bucket)
    async with c.pool.connection() as conn:
        listings = await context_queries.skill_listings(conn, "tenant-a", skill_sources(config))
    assert all(not listed for listed in listings.values())
