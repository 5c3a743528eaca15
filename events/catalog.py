"""The event types of the message history (v1). Past-tense names; facts only, no behaviour.

Every event is self-sufficient: ``MessageAppended.parent_id`` is the resolved parent (never
"latest leaf"), and a message body travels inline or as a claim-check reference.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from events.blobs import BlobRef
from events.envelope import Event


class SessionCreated(Event):
    TYPE: ClassVar[str] = "session.created"
    VERSION: ClassVar[int] = 1
    type: Literal["session.created"] = "session.created"
    version: Literal[1] = 1

    name: str = ""
    parent_session_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionRenamed(Event):
    TYPE: ClassVar[str] = "session.renamed"
    VERSION: ClassVar[int] = 1
    type: Literal["session.renamed"] = "session.renamed"
    version: Literal[1] = 1

    name: str


class SessionDeleted(Event):
    TYPE: ClassVar[str] = "session.deleted"
    VERSION: ClassVar[int] = 1
    type: Literal["session.deleted"] = "session.deleted"
    version: Literal[1] = 1


class MessageBodyEvent(Event):
    """A message body, inline (``message``) or in object storage (``message_ref``)."""

    message_id: str
    role: str
    body_sha256: str
    message: dict[str, Any] | None = None
    message_ref: BlobRef | None = None

    @model_validator(mode="after")
    def _one_body(self) -> MessageBodyEvent:
        if (self.message is None) == (self.message_ref is None):
            raise ValueError("exactly one of message and message_ref must be set")
        return self


class MessageAppended(MessageBodyEvent):
    TYPE: ClassVar[str] = "message.appended"
    VERSION: ClassVar[int] = 1
    type: Literal["message.appended"] = "message.appended"
    version: Literal[1] = 1

    parent_id: str | None


class MessageUpdated(MessageBodyEvent):
    TYPE: ClassVar[str] = "message.updated"
    VERSION: ClassVar[int] = 1
    type: Literal["message.updated"] = "message.updated"
    version: Literal[1] = 1


class MessagesDeleted(Event):
    TYPE: ClassVar[str] = "messages.deleted"
    VERSION: ClassVar[int] = 1
    type: Literal["messages.deleted"] = "messages.deleted"
    version: Literal[1] = 1

    message_ids: list[str]


class MessagesCleared(Event):
    TYPE: ClassVar[str] = "messages.cleared"
    VERSION: ClassVar[int] = 1
    type: Literal["messages.cleared"] = "messages.cleared"
    version: Literal[1] = 1


EVENT_TYPES: tuple[type[Event], ...] = (
    SessionCreated,
    SessionRenamed,
    SessionDeleted,
    MessageAppended,
    MessageUpdated,
    MessagesDeleted,
    MessagesCleared,
)
