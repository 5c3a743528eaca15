"""The longest text fields the API takes, and the contract admits: one definition for both.

The HTTP API and the NATS commands refuse a request whose fields are longer (``422``); an event
published straight to JetStream with a longer one is refused by admission (reason ``too_long``,
events/admission.py), so a direct publisher cannot store what a request could not, and every
reader of the log (projector, rebuild, verify) decides the same. Lengths in characters (code
points), as pydantic's ``max_length`` counts them. Ids have their own rules (events/ids.py).
"""

from __future__ import annotations

MAX_SESSION_NAME = 512
"""A session's ``name`` (create, rename, fork)."""
MAX_ROLE = 64
"""A message's ``role`` (and a body event's ``role``, which is its message's)."""
MAX_TOOL_CALL_ID = 256
"""The ``tool_call_id`` of a tool call (``skill.loaded``, ``skill.unloaded``)."""
