"""What erasing a tenant has to destroy (``chronicle erase --tenant``): a tenant with nothing is a
mistyped name, and is not erased (its erasure would burn the name for good)."""

from __future__ import annotations

import uuid

from events.ids import TENANT_SCOPE
from events.omitted import OMITTED
from services.bootstrap import open_container
from tests.conftest import make_settings
from tests.integration.helpers import text_message


async def test_a_tenant_exists_by_its_sessions_keys_erasures_or_events_in_the_log(nats_url: str, db_url: str) -> None:
    tag = uuid.uuid4().hex[:8]
    written, keyed, logged, nobody = (f"{what}-{tag}" for what in ("written", "keyed", "logged", "nobody"))
    async with open_container(make_settings(nats_url, db_url)) as c:
        await c.commands.append(written, "s1", text_message("m1", "kept"), OMITTED)
        await c.keys.key_of(keyed, TENANT_SCOPE, create=True)  # a tenant-level data key alone
        # an event of it in the log alone (published straight to the stream, never applied)
        await c.js.publish(c.layout.session_subject(logged, "s1"), b"{}", stream=c.layout.stream)
        assert [await c.eraser.tenant_exists(t) for t in (written, logged, nobody)] == [True, True, False]
        assert await c.keys.has_key(keyed, TENANT_SCOPE)
        assert await c.eraser.tenant_exists(keyed)
