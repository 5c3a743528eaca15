"""Whether a session's system prompt fits in one event, decided where a block write is decided
(pure): a prompt over :data:`~events.admission.MAX_WRITTEN_BYTES` (sealed, when the session
seals) could be rendered but never recorded, so every freeze and refresh after it would fail.

The size is a bound, never an under-estimate: headers show each budgeted block's byte length in
place of its token count (a token is at least one byte: never shorter), and the event carries
the longest reason and a ten-digit version. Token counting (slow on a long prompt) is left out."""

from __future__ import annotations

from events.admission import MAX_WRITTEN_BYTES
from events.catalog import PromptRendered
from services.context.prompt_text import RenderedBlock, render

VERSION_BOUND = 10**9
"""A version number no session's prompt reaches (its digits stand for the real one's)."""


def bounding_event(tenant: str, session: str, blocks: list[RenderedBlock]) -> PromptRendered:
    """The ``prompt.rendered`` event of ``blocks`` (their ``tokens`` a bound: byte lengths), no
    shorter than the one a refresh would record."""
    text = render(blocks)
    return PromptRendered(
        tenant=tenant,
        session=session,
        text=text,
        tokens=len(text.encode()),
        version_no=VERSION_BOUND,
        reason="compaction",
    )


def too_large(label: str, size: int, without: int, new: str, current: str, limit: int = MAX_WRITTEN_BYTES) -> str:
    """Why a write to ``label`` is refused, in the reference's words, and the room left: the
    prompt would be ``size`` bytes stored with ``new`` in the block, ``without`` with the block
    empty; the room is estimated at ``new``'s own bytes per character."""
    per_char = (size - without) / max(1, len(new))
    room = int((limit - without) / per_char) if per_char > 0 and limit > without else 0
    return (
        f'Block "{label}" would make the system prompt too large to store: {size} > {limit} bytes. '
        f"The block has room for about {room} characters (it holds {len(current)}); "
        "write a shorter text, or shorten another block"
    )
