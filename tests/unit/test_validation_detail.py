"""One formatter from a validation error to a problem's detail line."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field, ValidationError

from events.context import LABEL_RULE, SessionConfig
from events.validation import NO_NUL_PATTERN, PRINTABLE_ASCII_PATTERN, error_items, validation_detail


class Shape(BaseModel):
    name: str
    parts: list[int]


def test_each_error_reads_loc_colon_msg_joined() -> None:
    with pytest.raises(ValidationError) as caught:
        Shape.model_validate({"name": 1, "parts": ["x"]})
    assert validation_detail(caught.value, prefix="message.") == (
        "message.name: Input should be a valid string; "
        "message.parts.0: Input should be a valid integer, unable to parse string as an integer"
    )


def test_an_error_of_the_whole_value_is_named_by_root() -> None:
    with pytest.raises(ValidationError) as caught:
        Shape.model_validate([])
    assert validation_detail(caught.value, root="config").startswith("config: ")


def test_plain_error_dicts_are_formatted_too() -> None:
    assert validation_detail([{"loc": ["body", "x"], "msg": "missing"}]) == "body.x: missing"


class Patterned(BaseModel):
    text: str = Field(pattern=NO_NUL_PATTERN)
    key: str = Field(pattern=PRINTABLE_ASCII_PATTERN)
    cursor: str = Field(pattern=r"^[0-9]+$")


def test_a_pattern_mismatch_says_what_the_pattern_means_not_the_expression() -> None:
    with pytest.raises(ValidationError) as caught:
        Patterned.model_validate({"text": "a\x00b", "key": "a b", "cursor": "x"})
    detail = validation_detail(caught.value)
    assert detail == (
        "text: must not contain NUL characters; "
        "key: must be printable ASCII characters without spaces; "
        "cursor: is not in the form this field takes"
    )
    items = error_items(caught.value.errors(include_url=False))
    assert [i["msg"] for i in items] == [
        "must not contain NUL characters",
        "must be printable ASCII characters without spaces",
        "is not in the form this field takes",
    ]
    assert validation_detail(items) == detail  # worded once: the items read the same again


@pytest.mark.parametrize(
    "label", ["two words", "", "-lead", "x" * 65, "ü"], ids=["space", "empty", "leading-dash", "65-long", "not-ascii"]
)
def test_a_refused_block_label_says_what_labels_are_allowed(label: str) -> None:
    with pytest.raises(ValidationError) as caught:
        SessionConfig.model_validate({"blocks": [{"kind": "writable", "label": label}], "searchable_history": label})
    assert validation_detail(caught.value, root="config") == (
        f"blocks.0.writable.label: {LABEL_RULE}; searchable_history: {LABEL_RULE}"
    )
    assert "1 to 64 characters" in LABEL_RULE
    assert "'_' or '-'" in LABEL_RULE
