"""Tool results never hand internal exception text to the LLM: a stable message, the detail logged."""

from __future__ import annotations

from typing import Any, cast

import pytest

from projections.skill_scan import TOOL_FAILED
from services.context.service import ContextService
from services.errors import BudgetExceeded, ErasedSession, ObjectStorageError, SessionNotFound


class _Failing:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def catch_up(self, tenant: str, session: str) -> int:
        raise self.exc


def _service(exc: Exception) -> ContextService:
    return ContextService(cast(Any, _Failing(exc)), cast(Any, None), cast(Any, None), cast(Any, None), None)


async def test_an_unexpected_error_is_a_stable_message(caplog: pytest.LogCaptureFixture) -> None:
    out = await _service(RuntimeError("password=hunter2 at db.internal:5432")).execute("t", "s", "set_context", {})
    assert out == TOOL_FAILED
    assert "hunter2" in caplog.text  # the detail went to the log


async def test_a_backing_service_failure_gives_its_title_not_its_detail() -> None:
    out = await _service(ObjectStorageError("AccessDenied: bucket secret-internal")).execute("t", "s", "x", {})
    assert out == f"Error: {ObjectStorageError.title}"
    assert "secret-internal" not in out


async def test_the_callers_mistakes_keep_their_explanation() -> None:
    out = await _service(BudgetExceeded("notes would hold 120 of 100 tokens")).execute("t", "s", "x", {})
    assert out == "Error: notes would hold 120 of 100 tokens"


@pytest.mark.parametrize("gone", [SessionNotFound("session 's' was deleted"), ErasedSession("session 's' was erased")])
async def test_a_deleted_or_erased_session_is_the_requests_error_not_a_result(gone: Exception) -> None:
    with pytest.raises(type(gone)):
        await _service(gone).execute("t", "s", "x", {})
