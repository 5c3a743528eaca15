"""What context memory decides without I/O: where a tenant's objects live, how an append joins,
which configured keys are unsafe and which skills a block allows (how unloaded skills' outputs
show in stored messages: projections/reclaimed.py)."""

from __future__ import annotations

from events.context import ReadonlyBlock, SearchableBlock, SessionConfig, SkillsBlock, WritableBlock
from services.context.entry_keys import unsafe_object_key, unsafe_prefix
from services.errors import UnsafeStoredConfig

Sources = dict[tuple[str, str], str]
"""Object-storage texts of read-only blocks by (bucket, key)."""
Listings = dict[tuple[str, str], list[tuple[str, str | None]]]
"""The indexed skills (key, description) under each (bucket, prefix), in key order."""


def object_key(tenant: str, key: str) -> str:
    """Where a tenant's objects live in a bucket: ``tenants/<tenant>/<key>``.

    Every tenant's reads and writes go through the server's S3 credentials, so each tenant is
    confined to its own key space; one tenant cannot name another's objects.
    """
    return f"tenants/{tenant}/{key}"


def joined(current: str, addition: str) -> str:
    """Append as the reference does: a newline between, unless empty or already starting with one."""
    sep = "\n" if current and not addition.startswith("\n") else ""
    return current + sep + addition


def unsafe_keys(config: SessionConfig) -> str | None:
    """Why ``config`` names an object outside its tenant's space (the first block that does), or
    None. Object keys are relative to ``tenants/<tenant>/`` (see :func:`object_key`)."""
    for b in config.blocks:
        found: list[tuple[str, str, str | None]] = []
        if isinstance(b, ReadonlyBlock) and b.source is not None:
            found.append(("source.key", b.source.key, unsafe_object_key(b.source.key)))
        if isinstance(b, SkillsBlock):
            found.append(("prefix", b.prefix, unsafe_prefix(b.prefix)))
            found.extend(("keys", k, unsafe_object_key(b.prefix + k)) for k in b.keys or [])
        for field, value, why in found:
            if why is not None:
                return f"block {b.label!r}: {field} {value[:200]!r} is not a safe object key: {why}"
    return None


def refuse_unsafe(config: SessionConfig) -> None:
    """A configuration stored before keys were checked is refused where it would be rendered."""
    problem = unsafe_keys(config)
    if problem is not None:
        raise UnsafeStoredConfig(problem)


def tool_writable(block: ReadonlyBlock | WritableBlock | SearchableBlock | SkillsBlock) -> bool:
    """Whether ``set_context`` writes ``block``: a writable or searchable block, a skills block
    unless its ``writable`` is false (the reference's ``writable``: the provider has ``set``)."""
    if isinstance(block, SkillsBlock):
        return block.writable
    return not isinstance(block, ReadonlyBlock)


def allows(block: SkillsBlock, key: str) -> bool:
    """Whether the block's ``keys`` allowlist takes ``key`` (relative to its prefix; an omitted or
    empty list takes every key, as the reference's)."""
    return not block.keys or key in block.keys


def outside_allowlist(block: SkillsBlock, key: str) -> str | None:
    """Why a skill put through ``block`` under ``key`` is refused: the block's allowlist leaves it
    out, so the block would never list nor load it (None when it allows it)."""
    if allows(block, key):
        return None
    keys = block.keys or []
    shown = ", ".join(keys[:10]) + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")
    return (
        f'Skill "{key}" is not in the keys allowed in block "{block.label}" ({shown}): it could never '
        "be listed or loaded there; nothing was written"
    )


def allowed(block: SkillsBlock, listing: list[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    """(key relative to the block's prefix, description) of the listed skills the block allows."""
    entries: list[tuple[str, str | None]] = []
    for key, desc in listing:
        rel = key[len(block.prefix) :]
        if rel and allows(block, rel):
            entries.append((rel, desc))
    return entries


def skill_sources(config: SessionConfig) -> list[tuple[str, str]]:
    """The (bucket, prefix) of each skills block, once each, in order."""
    return list(dict.fromkeys((b.bucket, b.prefix) for b in config.blocks if isinstance(b, SkillsBlock)))


def named_buckets(config: SessionConfig) -> set[str]:
    """The buckets ``config`` reads the tenant's objects from: its skills blocks' and its
    read-only blocks' sources."""
    skills = {b.bucket for b in config.blocks if isinstance(b, SkillsBlock)}
    return skills | {b.source.bucket for b in config.blocks if isinstance(b, ReadonlyBlock) and b.source is not None}


def with_skill(listings: Listings, bucket: str, key: str, description: str | None) -> Listings:
    """``listings`` as they would be once skill ``key`` of ``bucket`` is indexed with
    ``description`` (in place of the one indexed under that key, if any)."""
    out: Listings = {}
    for (b, prefix), entries in listings.items():
        if b == bucket and key.startswith(prefix):
            entries = sorted([e for e in entries if e[0] != key] + [(key, description)], key=lambda e: e[0])
        out[(b, prefix)] = entries
    return out


def find_block(
    config: SessionConfig, label: str
) -> ReadonlyBlock | WritableBlock | SearchableBlock | SkillsBlock | None:
    return next((b for b in config.blocks if b.label == label), None)
