"""Session configuration: context blocks (in render order) and compaction settings.

Part of the contract: agent services send it, ``SessionConfigured`` events carry it whole.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LABEL_RE = r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$"
LABEL_RULE = "must be 1 to 64 characters, each an ASCII letter, a digit, '_' or '-', and not start with '-'"
""":data:`LABEL_RE` in words: what a refused label's problem says (events/validation.py)."""
Label = Annotated[str, Field(pattern=LABEL_RE)]
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
Bucket = Annotated[str, Field(min_length=3, max_length=63, json_schema_extra={"pattern": BUCKET_RE.pattern})]
"""An S3 bucket name (checked by :func:`_bucket_name`, which names the bucket in its error)."""


_IPV4_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")


def is_bucket_name(bucket: str) -> bool:
    """Whether ``bucket`` is a name an object-storage request can be made for: :data:`BUCKET_RE`,
    and none of what S3 (and the ``minio`` client, which refuses such a name with a ``ValueError``
    before sending anything) also refuses: ``..``, ``.-`` or ``-.``, the form of an IPv4 address,
    a name ending in ``-s3alias`` or ``--ol-s3``. The services' rule (a config put, the CLI, the
    buckets an erasure cleans); the contract's is :data:`BUCKET_RE` alone (:func:`_bucket_name`),
    so that no event it admitted before this rule is refused now (a rebuild equals the live model)."""
    return (
        BUCKET_RE.fullmatch(bucket) is not None
        and not any(pair in bucket for pair in ("..", ".-", "-."))
        and _IPV4_RE.fullmatch(bucket) is None
        and not bucket.endswith(("-s3alias", "--ol-s3"))
    )


def _bucket_name(bucket: str) -> str:
    if not BUCKET_RE.fullmatch(bucket):
        raise ValueError(f"invalid bucket name {bucket!r}")
    return bucket


class _Block(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    label: Label
    description: str | None = Field(default=None, max_length=2000)
    max_tokens: int | None = Field(default=None, ge=1)


class ObjectSource(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    bucket: Bucket
    key: str = Field(min_length=1, max_length=1024)

    @model_validator(mode="after")
    def _bucket_name(self) -> ObjectSource:
        _bucket_name(self.bucket)
        return self


class ReadonlyBlock(_Block):
    """Fixed text, inline or read from an object at render time."""

    kind: Literal["readonly"] = "readonly"
    content: str | None = Field(default=None, max_length=1_000_000)
    source: ObjectSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ReadonlyBlock:
        if self.content is not None and self.source is not None:
            raise ValueError("a readonly block has either content or source, not both")
        return self


class WritableBlock(_Block):
    """Free text the LLM and the application write, within ``max_tokens``."""

    kind: Literal["writable"] = "writable"


class SearchableBlock(_Block):
    """Keyed entries indexed with Postgres FTS; the prompt shows how many there are."""

    kind: Literal["searchable"] = "searchable"


class SkillsBlock(_Block):
    """Documents in an object-storage bucket, listed in the prompt, loaded on demand."""

    kind: Literal["skills"] = "skills"
    bucket: Bucket
    prefix: str = Field(default="", max_length=512)
    keys: list[str] | None = None
    writable: bool = Field(default=True, exclude_if=lambda v: v is True)
    """False: the LLM's ``set_context`` cannot put skills through this block (the reference's
    skill provider without ``set``); skills are the tenant's, so a session's model that may write
    them may change what every other session loads. Left out of the stored JSON when True (the
    default), so configs that do not use it are stored as before."""

    @model_validator(mode="after")
    def _bucket_name(self) -> SkillsBlock:
        _bucket_name(self.bucket)
        return self


Block = Annotated[ReadonlyBlock | WritableBlock | SearchableBlock | SkillsBlock, Field(discriminator="kind")]


MAX_COMPACT_AFTER = 2**31 - 1
"""The largest ``compact_after``: the compaction state keeps it as a Postgres ``integer`` (a larger
one, admitted, was acknowledged and then quarantined: the config never took effect)."""


class CompactionConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    compact_after: int | None = Field(default=None, ge=1, le=MAX_COMPACT_AFTER)
    protect_head: int = Field(default=3, ge=0)
    tail_token_budget: int = Field(default=20_000, ge=0)
    min_tail_messages: int = Field(default=2, ge=0)


class SessionConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    blocks: list[Block] = Field(default_factory=list, max_length=64)
    compaction: CompactionConfig | None = None
    searchable_history: Label | None = None

    @model_validator(mode="after")
    def _unique_labels(self) -> SessionConfig:
        labels = [b.label for b in self.blocks]
        if self.searchable_history is not None:
            labels.append(self.searchable_history)
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"duplicate block labels: {', '.join(dupes)}")
        return self
