"""One formatter from a validation error to a problem's detail line."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from events.validation import validation_detail


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
