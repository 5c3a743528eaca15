"""``chronicle erase --tenant T`` as an operator runs it: a tenant whose API keys are still
configured is warned of (it writes again as soon as it is erased), in one stderr line, in the dry
run too; the dry run marks the sessions erased before as such and does not count them. Real NATS
and Postgres."""

from __future__ import annotations

import uuid

from events.omitted import OMITTED
from services.bootstrap import Container
from services.settings import api_key_entry, new_api_key
from tests.integration.helpers import text_message
from tests.support import chronicle_cli


async def tenant_with_sessions(c: Container, *sessions: str) -> str:
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    last = 0
    for s in sessions:
        last = (await c.commands.append(tenant, s, text_message("m1", "hello"), OMITTED)).seq
    await c.waiter.wait_all(last, timeout_s=20)
    return tenant


async def test_the_dry_run_marks_sessions_erased_before_and_does_not_count_them(stack: Container) -> None:
    """(They were listed as "would erase" and counted: a rerun after a partial erasure, or an
    erasure of a tenant some of whose sessions were erased one by one, overstated what it destroys.)"""
    tenant = await tenant_with_sessions(stack, "s1", "s2", "s3")
    await stack.eraser.erase_session(tenant, "s2")
    dry = chronicle_cli(stack.settings, "erase", "--tenant", tenant)
    assert (dry.returncode, dry.stderr) == (1, "")
    lines = dry.stdout.splitlines()
    assert lines[:3] == ["would erase: 's1'", "already erased: 's2'", "would erase: 's3'"]
    assert lines[-1] == (
        f"not erased: erasing tenant {tenant!r} destroys every session listed (2; 1 already erased, not counted), "
        "its tenant-level entries and the objects listed for good. Run again with --yes to erase."
    )


async def test_a_tenant_whose_keys_are_still_configured_is_warned_of_in_one_line_dry_run_and_erasure(
    stack: Container,
) -> None:
    """(Nothing said so: the erased tenant wrote again at once with the keys it still had.)"""
    tenant = await tenant_with_sessions(stack, "s1")
    other = api_key_entry("someone-else", new_api_key())
    keyed = stack.settings.model_copy(update={"api_keys": [other, api_key_entry(tenant, new_api_key())]})
    warning = (
        f"chronicle erase: warning: tenant {tenant!r} still has 1 API key entry in CHRONICLE_API_KEYS or "
        "CHRONICLE_API_KEYS_FILE: it can write again as soon as it is erased; remove them (SIGHUP the API for the "
        "file, and reload nats-server for its NATS users) first (docs/security.md, Erasing a tenant)\n"
    )
    dry = chronicle_cli(keyed, "erase", "--tenant", tenant)
    assert (dry.returncode, dry.stderr) == (1, warning)
    assert "would erase: 's1'" in dry.stdout.splitlines()
    unkeyed = chronicle_cli(stack.settings.model_copy(update={"api_keys": [other]}), "erase", "--tenant", tenant)
    assert (unkeyed.returncode, unkeyed.stderr) == (1, "")
    done = chronicle_cli(keyed, "erase", "--tenant", tenant, "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines(keepends=True)[0] == warning  # then the erasure's own log lines
    assert len(done.stdout.splitlines()) == 2  # s1, then the tenant scope: erased all the same
