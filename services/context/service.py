"""Context memory, one object per process (the container's ``context``), built in layers:
:mod:`services.context.blocks` (configuration, block writes within budgets, search entries),
:mod:`services.context.skills` and :mod:`services.context.prompt` on it, and
:mod:`services.context.tools` (the LLM tools) over both. The decisions without I/O are in
:mod:`services.context.rules`."""

from services.context.tools import ContextTools


class ContextService(ContextTools):
    """Blocks, skills, the frozen prompt and the LLM tools of every session."""
