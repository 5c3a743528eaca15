"""Request bodies: strict JSON (finite numbers, no NUL or lone surrogates, bounded nesting)."""

from __future__ import annotations

import json
import re

import pytest

from services.errors import InvalidRequest, MalformedJson
from services.requests.strict_json import MAX_JSON_DEPTH, strict_loads


@pytest.mark.parametrize(
    "raw",
    [
        b"NaN",
        b'{"a": Infinity}',
        b"[-Infinity]",
        b'{"x": 1e400}',
        b"[-1e309]",
        b'{"\\ud800": 1}',
        b'"\\udc00"',
        b'{"k": ["a\\u0000b"]}',
        b'{"n": ' + b"9" * 5000 + b"}",  # past Python's 4,300 digits: a ValueError that was a 500
        b"[-" + b"1" * 4301 + b"]",
    ],
)
def test_values_chronicle_never_stores_are_invalid_requests(raw: bytes) -> None:
    with pytest.raises(InvalidRequest):
        strict_loads(raw)


def test_nesting_is_bounded() -> None:
    assert strict_loads(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) is not None
    for depth in (MAX_JSON_DEPTH + 1, 254, 5000, 200_000):
        with pytest.raises(InvalidRequest, match="nested"):
            strict_loads(b"[" * depth + b"]" * depth)
    with pytest.raises(InvalidRequest, match="nested"):
        strict_loads(json.dumps({"a": [{"b": [[]]}] * 3, "deep": json.loads("[" * 70 + "]" * 70)}).encode())


def test_many_brackets_that_do_not_nest_are_fine() -> None:
    wide = {"items": [[1], {"a": []}] * 500, "text": "[[[[{{{{" * 100}
    assert strict_loads(json.dumps(wide).encode()) == wide


def test_ordinary_values_pass_and_escapes_that_are_fine() -> None:
    raw = b'{"a": 1.5, "b": -2e10, "c": "\\u00e9\\ud83d\\ude00", "d": [null, true]}'
    assert strict_loads(raw) == {"a": 1.5, "b": -2e10, "c": "é😀", "d": [None, True]}


def test_not_json_is_left_to_the_decoder_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        strict_loads(b'{"a": ')
    with pytest.raises(MalformedJson):
        strict_loads(b"\xff\xfe")
    with pytest.raises(MalformedJson):
        strict_loads(b'"\xed\xa0\x80"')  # a UTF-8-encoded surrogate: not UTF-8


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'{"a": 1, "a": 1}', "a"),
        (b'{"a": {"b": 1, "c": 2, "b": 3}}', "b"),
        (b'[{}, [{"x": [{"k": 1, "k": 2}]}]]', "k"),
        (b'{"\\u00e9": 1, "\xc3\xa9": 2}', "\u00e9"),  # the same key, escaped once and once not
    ],
)
def test_a_key_twice_in_one_object_is_refused_at_any_depth(raw: bytes, key: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(f"the key {key!r} is in one object twice")):
        strict_loads(raw)


def test_the_same_key_in_different_objects_is_fine() -> None:
    assert strict_loads(b'{"a": {"a": {"a": 1}}, "b": [{"a": 1}, {"a": 2}]}') == {
        "a": {"a": {"a": 1}},
        "b": [{"a": 1}, {"a": 2}],
    }
