"""Every stable problem code the server answers has its typed SDK exception (chronicle_sdk/errors.py
promises one per code): the codes of services/errors.py, the HTTP-level ones of the API and
those a problem is built with directly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import services
from chronicle_sdk import AppendResult
from chronicle_sdk import errors as sdk
from services import errors as server
from services.api.problems import _HTTP_CODES

SOURCE = Path(services.__file__).parent


def server_codes() -> set[str]:
    classes = {v.code for v in vars(server).values() if isinstance(v, type) and issubclass(v, server.ChronicleError)}
    built = {
        m.group(1)
        for path in SOURCE.rglob("*.py")
        for m in re.finditer(r'problem(?:_body)?\(\s*\d{3},\s*"([a-z_]+)"', path.read_text(encoding="utf-8"))
    }
    return classes | set(_HTTP_CODES.values()) | built


def test_the_server_codes_are_found() -> None:
    """The scan finds what it looks for (an empty or partial scan would prove nothing)."""
    wanted = {"session_erased", "method_not_allowed", "unsafe_config", "object_storage", "encryption_off"}
    assert wanted <= server_codes()


@pytest.mark.parametrize("code", sorted(server_codes()))
def test_every_server_code_has_its_own_sdk_exception(code: str) -> None:
    cls = sdk.BY_CODE.get(code)
    assert cls is not None, f"no SDK exception for {code!r}"
    assert cls.default_code == code  # its own class, not a base standing in for it


@pytest.mark.parametrize(
    ("status", "code", "cls", "base"),
    [
        (410, "session_erased", sdk.SessionErased, sdk.Gone),
        (404, "encryption_off", sdk.EncryptionOff, sdk.NotFound),
        (409, "unsafe_config", sdk.UnsafeConfig, sdk.Conflict),
        (503, "object_storage", sdk.ObjectStorageUnavailable, sdk.TransientError),
        (405, "method_not_allowed", sdk.MethodNotAllowed, sdk.InvalidRequest),
        (429, "too_many_streams", sdk.TooManyStreams, sdk.ChronicleError),
        (408, "request_timeout", sdk.RequestTimeout, sdk.TransientError),
    ],
)
def test_a_problem_becomes_its_typed_exception(status: int, code: str, cls: type, base: type) -> None:
    err = sdk.error_from_problem(status, {"code": code, "detail": "why", "status": status})
    assert type(err) is cls
    assert isinstance(err, base)
    assert (err.code, err.status, err.detail) == (code, status, "why")


def test_an_erased_session_is_a_not_found_too_and_is_not_retried() -> None:
    err = sdk.error_from_problem(410, {"code": "session_erased", "detail": "gone"})
    assert isinstance(err, sdk.NotFound)
    assert not isinstance(err, sdk.TransientError)
    assert not isinstance(sdk.error_from_problem(429, {"code": "too_many_streams"}), sdk.TransientError)


def test_a_bare_410_or_405_has_its_status_class() -> None:
    assert type(sdk.error_from_problem(410, "gone")) is sdk.Gone
    assert type(sdk.error_from_problem(405, "")) is sdk.MethodNotAllowed


def test_a_batch_problem_carries_what_the_batch_wrote() -> None:
    written = [{"id": "n1", "parent_id": "ex", "seq": 7, "created": True}, {"id": "n2", "seq": "x"}]
    problem = {"code": "message_conflict", "detail": "why", "failed_index": 1, "written": written}
    err = sdk.error_from_problem(409, problem)
    assert type(err) is sdk.MessageConflict
    assert err.failed_index == 1
    assert err.written == [AppendResult("n1", "ex", 7, True)]  # an item that is not one is left out
    other = sdk.error_from_problem(409, {"code": "message_conflict", "failed_index": True, "written": "no"})
    assert (other.failed_index, other.written) == (None, [])
