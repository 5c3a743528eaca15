"""Whether a session's system prompt fits in one event, decided where a change to it is decided
(pure): a prompt over :data:`~events.admission.MAX_WRITTEN_BYTES` (sealed, when the session
seals) could be rendered but never recorded, so every freeze and refresh after it would fail.
Block writes, config PUTs and skill puts that would lengthen it past the limit are refused with
these words; a prompt that is over the limit all the same (an object grown in storage) is
refused where it is rendered, naming its largest block (:func:`unstorable`).

The size is a bound, never an under-estimate: headers show each budgeted block's byte length in
place of its token count (a token is at least one byte: never shorter), and the event carries
the longest reason and a ten-digit version. Token counting (slow on a long prompt) is left out."""

from __future__ import annotations

from events.admission import MAX_WRITTEN_BYTES
from events.catalog import PromptRendered
from services.context.prompt_text import RenderedBlock, render

VERSION_BOUND = 10**9
"""A version number no session's prompt reaches (its digits stand for the real one's)."""
SHORTER_TEXT = "write a shorter text, or shorten another block"
SHORTER_SKILL = "give the skill a shorter description, or shorten another block"
SMALLER_CONFIG = "leave blocks out, shorten them, or point read-only blocks at smaller objects"
WAY_OUT = {
    "readonly": "upload a smaller object, or PUT a config that shortens the block or leaves it out",
    "writable": "write a shorter text to it (a write that shortens a block is always taken)",
    "skills": "PUT a config whose block lists fewer skills (keys), or leaves it out",
    "searchable": "PUT a config that leaves it out",
    "history": "PUT a config that leaves it out",
}
"""What shortens a prompt over the limit, by the kind of its largest block."""


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


def room(size: int, without: int, chars: int, limit: int = MAX_WRITTEN_BYTES) -> int:
    """About how many characters a block may hold: with its ``chars`` characters the prompt is
    ``size`` bytes stored, ``without`` with the block empty (the room is estimated at the text's
    own bytes per character); 0 when the rest of the prompt is over ``limit`` already."""
    per_char = (size - without) / max(1, chars)
    return int((limit - without) / per_char) if per_char > 0 and limit > without else 0


def too_large(
    label: str,
    size: int,
    without: int,
    new: str,
    current: str,
    limit: int = MAX_WRITTEN_BYTES,
    *,
    subject: str | None = None,
    advice: str = SHORTER_TEXT,
) -> str:
    """Why a write to ``label`` (``subject``: what is written, the block by default) is refused,
    in the reference's words, and the room left: the prompt would be ``size`` bytes stored with
    ``new`` in the block, ``without`` with the block empty."""
    what = subject or f'Block "{label}"'
    return (
        f"{what} would make the system prompt too large to store: {size} > {limit} bytes. "
        f"The block has room for about {room(size, without, len(new), limit)} characters "
        f"(it holds {len(current)}); {advice}"
    )


def config_too_large(size: int, before: int, grown: RenderedBlock, by: int, limit: int = MAX_WRITTEN_BYTES) -> str:
    """Why a config is refused: the prompt would be ``size`` bytes stored with it, ``before``
    with the config in force; block ``grown`` lengthens it most, by ``by`` characters. The room is
    in characters, as the block's growth is (stored bytes per character as this config's growth
    has them: sealing and JSON escaping make a character cost more than a byte; an estimate that
    errs low when other blocks grew too, and by 1 % more: the sealed size is not exactly linear)."""
    per_char = (size - before) / by if by > 0 and size > before else 1.0
    chars = int(max(0, limit - before) / per_char * 0.99)
    return (
        f"The config would make the system prompt too large to store: {size} > {limit} bytes. "
        f"The prompt has room for about {chars} more characters (it is {before} bytes stored with the config "
        f'in force); block "{grown.label}" lengthens it most, by {by} characters: ' + SMALLER_CONFIG
    )


def most_grown(after: list[RenderedBlock], before: list[RenderedBlock]) -> tuple[RenderedBlock, int]:
    """The block of ``after`` whose part of the prompt (header and text) is the longest next to
    that of the block of its label in ``before`` (none: empty), and by how many characters;
    ``after`` is not empty."""
    was = {b.label: len(render([b])) for b in before}
    grown = [(b, len(render([b])) - was.get(b.label, 0)) for b in after]
    return max(grown, key=lambda g: g[1])


def largest_block(blocks: list[RenderedBlock]) -> RenderedBlock:
    """The block holding the most bytes (the first of equals); ``blocks`` is not empty."""
    return max(blocks, key=lambda b: len(b.content.encode()))


def unstorable(size: int, largest: RenderedBlock, with_one: int, limit: int = MAX_WRITTEN_BYTES) -> str:
    """Why the prompt cannot be recorded: it is ``size`` bytes stored, ``with_one`` with its
    ``largest`` block holding its first character only (its header stays: an empty read-only
    block is not rendered at all); says by how much and what shortens it."""
    chars = len(largest.content)
    fits = 1 + room(size, with_one, chars - 1, limit) if chars and limit >= with_one else 0
    return (
        f"The system prompt is too large to store: {size} > {limit} bytes ({size - limit} over). "
        f'Its largest block, "{largest.label}", has room for about {fits} characters (it holds {chars}): '
        + WAY_OUT[largest.kind]
    )
