"""The SDK decodes answers with msgspec to exactly what json.loads gave, whatever the JSON."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronicle_sdk.jsondecode import loads

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


def same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (1 and 1.0 and True are not the same)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


@settings(max_examples=400)
@given(JSON_VALUES, st.booleans())
def test_any_json_decodes_as_json_loads_decodes_it(value: Any, ascii_only: bool) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert same(loads(data), json.loads(data))


@pytest.mark.parametrize(
    "data",
    [
        b"[18446744073709551616, -9223372036854775809, 123456789012345678901234567890]",  # past 64 bits
        b'{"a": 1, "a": 2}',  # the last of repeated keys
        b"[1.0, 1, -0.0, 1e308, 5e-324, 0.1]",
        b'"\\ud800 and \\udfff"',  # lone surrogate escapes: msgspec refuses them
        b"[NaN, Infinity, -Infinity]",  # not JSON: json.loads reads them
        b'\xef\xbb\xbf{"bom": true}',  # a UTF-8 byte-order mark
        '{"ü": "日本語", "e": "\\u00e9"}'.encode(),
        b"  [ ]  ",
    ],
)
def test_edge_cases_decode_as_json_loads_decodes_them(data: bytes) -> None:
    assert same(loads(data), json.loads(data))


@pytest.mark.parametrize("data", [b"", b"{", b"[1,]", b"\xff\xfe", b'{"a" 1}'])
def test_what_json_loads_refuses_is_refused_alike(data: bytes) -> None:
    try:
        json.loads(data)
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError for bytes that are no text
        refused: type[ValueError] = type(exc)
    else:
        raise AssertionError(f"json.loads read {data!r}")
    with pytest.raises(refused):
        loads(data)
