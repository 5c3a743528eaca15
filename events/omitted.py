"""``OMITTED``: an argument that was not given, as distinct from ``None`` (for a parent id:
omitted attaches to the latest leaf, ``None`` starts a new root). One sentinel for the API, the
write side and the SDK."""

from __future__ import annotations

from typing import Final


class Omitted:
    """The type of :data:`OMITTED` (one instance)."""

    _instance: Omitted | None = None

    def __new__(cls) -> Omitted:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "OMITTED"

    def __bool__(self) -> bool:
        return False


OMITTED: Final = Omitted()
"""``parent_id=OMITTED`` (the default) attaches to the latest leaf; ``parent_id=None`` starts a new root."""

ParentId = str | None | Omitted
"""A parent id argument: an id, ``None`` (a new root) or :data:`OMITTED` (the latest leaf)."""
