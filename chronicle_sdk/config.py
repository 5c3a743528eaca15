"""Context providers and the builder that turns ``with_context(...)`` calls into a session config.

The reference wires a *provider object* to each block; Chronicle runs the providers on the
server, so here a provider is a small description of what backs the block:

=========================  ====================================================  ==============
provider                   reference equivalent                                  prompt tag
=========================  ====================================================  ==============
``Writable()`` (default)   ``AgentContextProvider`` (auto-wired SQLite block)    ``[writable]``
``Readonly(content)``      a read-only ``ContextProvider`` returning ``content``  ``[readonly]``
``ObjectSource(b, key)``   a read-only provider reading an R2/S3 object           ``[readonly]``
``Searchable()``           ``AgentSearchProvider`` / ``PostgresSearchProvider``   ``[searchable]``
``Skills(b, prefix, ks)``  ``R2SkillProvider(bucket, {prefix, keys})``            ``[loadable]``
=========================  ====================================================  ==============
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from pydantic import ValidationError

from chronicle_sdk.errors import InvalidConfig
from events.context import SessionConfig
from events.validation import validation_detail


@dataclass(frozen=True, slots=True)
class Readonly:
    """Fixed text, rendered as ``[readonly]``; the LLM cannot write it."""

    content: str


@dataclass(frozen=True, slots=True)
class ObjectSource:
    """Read-only text read from an S3/MinIO object each time the prompt is rendered."""

    bucket: str
    key: str


@dataclass(frozen=True, slots=True)
class Writable:
    """Free text the LLM (``set_context``) and the application write, within ``max_tokens``."""


@dataclass(frozen=True, slots=True)
class Searchable:
    """Keyed entries indexed with full-text search; the prompt shows ``<N> entries indexed.``."""


@dataclass(frozen=True, slots=True)
class Skills:
    """Documents in an S3/MinIO bucket under ``prefix``, listed in the prompt and loaded on demand.

    ``keys`` is the prefix-relative allowlist; ``None`` or empty means every key. ``set_context``
    refuses a skill outside it (an ``Error: …`` result, nothing written).

    ``writable=False`` keeps the LLM from writing skills through this block (the reference's
    skill provider without ``set``): ``set_context`` does not list it and answers ``Error: Block
    "<label>" does not support writes``. Skills are the tenant's, shared by all its sessions: with
    the default, any session's model can change a skill another session's model loads (a
    prompt-injection path between a tenant's users); set it unless the agent is meant to write
    skills.
    """

    bucket: str
    prefix: str = ""
    keys: Sequence[str] | None = None
    writable: bool = True


Provider = Readonly | ObjectSource | Writable | Searchable | Skills


def block_json(
    label: str, description: str | None, max_tokens: int | None, provider: Provider | None
) -> dict[str, Any]:
    """The config entry (API JSON) of one ``with_context`` call."""
    base: dict[str, Any] = {"label": label}
    if description is not None:
        base["description"] = description
    if max_tokens is not None:
        base["max_tokens"] = max_tokens
    match provider:
        case None | Writable():
            return {**base, "kind": "writable"}
        case Readonly(content=content):
            return {**base, "kind": "readonly", "content": content}
        case ObjectSource(bucket=bucket, key=key):
            return {**base, "kind": "readonly", "source": {"bucket": bucket, "key": key}}
        case Searchable():
            return {**base, "kind": "searchable"}
        case Skills(bucket=bucket, prefix=prefix, keys=keys, writable=writable):
            entry = {**base, "kind": "skills", "bucket": bucket, "prefix": prefix}
            if keys:
                entry["keys"] = list(keys)
            if not writable:
                entry["writable"] = False
            return entry
    raise InvalidConfig(f"unknown provider {provider!r} for block {label!r}")


class ConfigBuilder:
    """Builder methods shared by :class:`~chronicle_sdk.Session` and :class:`~chronicle_sdk.SessionManager`.

    Every method returns ``self``; order does not matter except that blocks render in the order
    they were added. Nothing is sent until the first data call.
    """

    def __init__(self) -> None:
        self._blocks: list[dict[str, Any]] = []
        self._compaction: dict[str, Any] = {}
        self._searchable_history: str | None = None
        self._cached_prompt = False
        self._configured = False
        self._dirty = False

    def _changed(self) -> None:
        self._configured = True
        self._dirty = True

    def with_context(
        self,
        label: str,
        description: str | None = None,
        max_tokens: int | None = None,
        provider: Provider | None = None,
    ) -> Self:
        """Add a context block (``withContext(label, {description, maxTokens, provider})``).

        With no provider the block is writable, as ``Session.create(agent).withContext(...)``
        auto-wires it in the reference. A label added twice replaces the first definition.
        """
        entry = block_json(label, description, max_tokens, provider)
        self._blocks = [b for b in self._blocks if b["label"] != label] + [entry]
        self._changed()
        return self

    def with_cached_prompt(self) -> Self:
        """Persist the frozen system prompt (``withCachedPrompt()``).

        Chronicle always persists it (the first freeze, and each re-render that changes the
        text, is an event), so this only records the intent; it is accepted so that reference
        code ports unchanged.
        """
        self._cached_prompt = True
        return self

    def compact_after(self, tokens: int) -> Self:
        """Compact automatically once the session's token estimate passes ``tokens`` (``compactAfter``).

        The ``chronicle compactor`` worker does it, in the background; :meth:`Session.compact`
        compacts on demand. Compaction only summarises what lies between the protected head and
        the protected tail (:meth:`on_compaction`), so a ``tokens`` below ``tail_token_budget``
        (default 20,000) compacts nothing until the messages after the head exceed the tail
        budget: until then each automatic attempt records ``compaction.skipped`` ("the tail
        already fits the budget"). Set ``tail_token_budget`` below ``tokens``.
        """
        self._compaction["compact_after"] = tokens
        self._changed()
        return self

    def on_compaction(
        self,
        *,
        protect_head: int | None = None,
        tail_token_budget: int | None = None,
        min_tail_messages: int | None = None,
    ) -> Self:
        """Set the compaction range options (``onCompaction(createCompactFunction({...}))``).

        The summarizer itself runs on the server (an OpenAI-compatible endpoint,
        ``CHRONICLE_SUMMARIZER=openai``, for real use; or the default offline one, an extractive
        placeholder for development), so only the options of ``createCompactFunction`` are given here; ``None`` keeps
        the server default (protect_head 3, tail_token_budget 20000, min_tail_messages 2).
        The newest messages within ``tail_token_budget`` (at least ``min_tail_messages``) are
        never summarised: keep it below :meth:`compact_after`, or automatic compaction skips
        ("the tail already fits the budget") until the history outgrows the tail.
        """
        for name, value in (
            ("protect_head", protect_head),
            ("tail_token_budget", tail_token_budget),
            ("min_tail_messages", min_tail_messages),
        ):
            if value is not None:
                self._compaction[name] = value
        self._changed()
        return self

    def with_searchable_history(self, label: str) -> Self:
        """Add a read-only searchable block over all of the tenant's sessions (``withSearchableHistory``).

        Its line in the system prompt is the reference's count of the tenant's sessions
        (``29 sessions available for search.``), so a prompt re-rendered after any session
        of the tenant was created or deleted, another user's included, differs: a
        :meth:`~chronicle_sdk.Session.refresh_system_prompt` after every turn then makes a new
        prompt version (and misses the LLM provider's prompt cache) whenever one was. Refresh
        when the turn wrote a block instead; clears and compactions re-render it too.
        """
        self._searchable_history = label
        self._changed()
        return self

    def _copy_template(self, other: ConfigBuilder) -> None:
        self._blocks = [dict(b) for b in other._blocks]
        self._compaction = dict(other._compaction)
        self._searchable_history = other._searchable_history
        self._cached_prompt = other._cached_prompt
        self._configured = other._configured
        self._dirty = other._configured

    def config_json(self) -> dict[str, Any]:
        """The session config these builder calls describe, as the API's JSON."""
        out: dict[str, Any] = {"blocks": [dict(b) for b in self._blocks]}
        if self._compaction:
            out["compaction"] = dict(self._compaction)
        if self._searchable_history is not None:
            out["searchable_history"] = self._searchable_history
        return out

    def session_config(self) -> SessionConfig:
        """The config, validated as the server will validate it (raises :class:`InvalidConfig`)."""
        return parse_config(self.config_json())


def parse_config(raw: Any) -> SessionConfig:
    """Validate config JSON into the contract's :class:`~events.context.SessionConfig`."""
    try:
        return SessionConfig.model_validate(raw)
    except ValidationError as exc:
        raise InvalidConfig(validation_detail(exc, root="config"), status=422) from exc


__all__ = [
    "ConfigBuilder",
    "ObjectSource",
    "Provider",
    "Readonly",
    "Searchable",
    "Skills",
    "Writable",
    "block_json",
    "parse_config",
]
