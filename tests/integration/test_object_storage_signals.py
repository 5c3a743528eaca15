"""An operator learns that object storage cannot be used: a request it fails answers `503
object_storage` to the tenant, logs one warning saying why and is counted in
`chronicle_object_storage_failures_total` (before: the tenant got the 503 while the API's log and
`/metrics` said nothing, and `/readyz` does not look at S3; an operator's trial with S3 stopped
found it). Real NATS and Postgres, the API app in this process, an S3 endpoint where nothing
listens."""

from __future__ import annotations

import logging
import uuid

import pytest

from services.api.app import build_app
from services.api.metrics import REGISTRY
from services.ops.localstack import free_port
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import tenant_client


async def test_a_request_object_storage_fails_answers_503_and_logs_a_warning_saying_why(
    nats_url: str, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(nats_url, db_url, s3_endpoint=f"127.0.0.1:{free_port()}")
    sid = f"s3-down-{uuid.uuid4().hex[:8]}"
    config = {"blocks": [{"label": "policy", "kind": "readonly", "source": {"bucket": "policies", "key": "p.md"}}]}
    failures = "chronicle_object_storage_failures_total"
    before = REGISTRY.get_sample_value(failures) or 0.0
    async with running_stack(settings) as c, tenant_client(build_app(c.settings, c), "tenant-a") as http:
        with caplog.at_level(logging.WARNING, logger="chronicle.requests"):
            r = await http.put(f"/v1/sessions/{sid}/config", json=config)
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "object_storage"
    warned = [rec.getMessage() for rec in caplog.records if rec.name == "chronicle.requests"]
    assert warned == [f"object storage failed: {r.json()['detail']}"]
    assert "Connection refused" in warned[0]
    assert REGISTRY.get_sample_value(failures) == before + 1  # /metrics counts it, for an alert
