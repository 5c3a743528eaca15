"""The one event base: a frozen, versioned envelope that every Chronicle event extends."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import ClassVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator


def new_event_id() -> str:
    return str(uuid.uuid4())


def utcnow() -> datetime:
    return datetime.now(UTC)


class Event(BaseModel):
    """Envelope fields shared by every event; subclasses add the facts.

    ``id`` is also the ``Nats-Msg-Id``: publishing the same event twice records it once.
    Events are immutable: a change of shape is a new ``version`` plus an upcaster.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    TYPE: ClassVar[str]
    VERSION: ClassVar[int]

    id: str = Field(default_factory=new_event_id, min_length=1, max_length=128)
    type: str
    version: int
    tenant: str
    session: str
    occurred_at: AwareDatetime = Field(default_factory=utcnow)
    correlation_id: str | None = None
    causation_id: str | None = None

    @field_validator("occurred_at")
    @classmethod
    def _an_instant_in_utc(cls, value: datetime) -> datetime:
        """A time that is within the datetime range as written but not in UTC (``0001-01-01T00:00
        +14:00`` is in year 0) is refused: Postgres stores it, and every read of its row failed."""
        try:
            value.astimezone(UTC)
        except OverflowError:
            raise ValueError("is outside the years 1 to 9999 in UTC") from None
        return value

    def left_out(self, *, sealed: bool = False) -> set[str]:
        """The fields this event's stored JSON leaves out (they decode to the same values): none,
        unless its type is stored compact (:class:`events.catalog.MessageBodyEvent`). ``sealed``:
        the JSON is to be sealed (:func:`events.sealing.seal_event`)."""
        return set()

    def to_json(self) -> bytes:
        omit = self.left_out()
        return (self.model_dump_json(exclude=omit) if omit else self.model_dump_json()).encode()
