"""The JSON bodies the routes accept: strict (unknown fields refused), with the examples the
OpenAPI document shows."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from events.commands import (
    MAX_DELETE_IDS,
    Cost,
    EndReason,
    ErasureReason,
    MessageId,
    MessageJson,
    SessionId,
    Tokens,
)
from events.limits import MAX_SESSION_NAME


def _examples(*examples: dict[str, Any]) -> ConfigDict:
    return ConfigDict(extra="forbid", json_schema_extra={"examples": list(examples)})


_MESSAGE = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "We deploy on Friday"}]}


class CreateSessionBody(BaseModel):
    model_config = _examples({"id": "demo", "name": "Demo", "metadata": {"team": "ops"}})
    id: SessionId | None = None
    name: str = Field(default="", max_length=MAX_SESSION_NAME)
    parent_session_id: SessionId | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class RenameBody(BaseModel):
    model_config = _examples({"name": "Release planning"})
    name: str = Field(max_length=MAX_SESSION_NAME)


class UsageBody(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"input_tokens": 1200, "output_tokens": 350, "cost": 0.0042}],
        },
    )
    input_tokens: Tokens = 0
    output_tokens: Tokens = 0
    cost: Cost = 0.0


class EndBody(BaseModel):
    model_config = _examples({"reason": "compaction"})
    reason: EndReason


class EraseBody(BaseModel):
    model_config = _examples({"reason": "ticket GDPR-1234: the user asked for erasure"})
    reason: ErasureReason | None = Field(
        default=None,
        description="why (at most 500 characters, no NUL): kept as given in the log and the erasure's record "
        "for auditors, after the session is gone; never put personal data in it",
    )


class AppendBody(BaseModel):
    model_config = _examples({"message": _MESSAGE}, {"message": {**_MESSAGE, "id": "m0"}, "parent_id": None})
    message: MessageJson
    parent_id: MessageId | None = None


class ForkBody(BaseModel):
    model_config = _examples({"at_message_id": "m1", "name": "What if Thursday"})
    at_message_id: MessageId
    name: str | None = Field(default=None, max_length=MAX_SESSION_NAME)
    id: SessionId | None = None


class CompactBody(BaseModel):
    model_config = _examples({}, {"leaf_id": "m1"})
    leaf_id: MessageId | None = None


class AppendBatchBody(BaseModel):
    model_config = _examples({"messages": [_MESSAGE, {**_MESSAGE, "id": "m2", "role": "assistant"}]})
    messages: list[MessageJson] = Field(min_length=1, max_length=1000)
    parent_id: MessageId | None = None


class DeleteMessagesBody(BaseModel):
    model_config = _examples({"ids": ["m1", "m2,with a comma"]})
    ids: list[MessageId] = Field(min_length=1, max_length=MAX_DELETE_IDS)


class ExistsBody(DeleteMessagesBody):
    """The ids a ``messages:exists`` read asks about (as a delete lists them)."""


class UpdateBody(BaseModel):
    model_config = _examples({"message": _MESSAGE})
    message: MessageJson
