"""``chronicle`` commands that print lists exit quietly, status 0, when their reader closes stdout
early (``| head``): no BrokenPipeError traceback. One handler in ``cli.main`` serves every command
(history and the others too); quarantine list and replay are run here."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from bench.support import settings_env
from tests.conftest import make_settings, running_stack

T = "tenant-b"


async def test_listing_commands_exit_quietly_when_their_reader_closes_stdout(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    """Each prints more than a pipe holds; the reader takes one line and closes."""
    settings = make_settings(nats_url, fresh_db)
    sid = new_id("long")
    async with running_stack(settings) as c:
        filler = "x" * 200
        last = 0
        for i in range(400):
            last = (await c.js.publish(c.layout.session_subject(T, sid), f"{{bad {i} {filler}".encode())).seq
        await c.waiter.wait_all(last)
    for argv in (
        ["quarantine", "list", "--limit", "400"],
        ["replay", "--tenant", T, "--session", sid],
        ["replay", "--tenant", T, "--session", sid, "--format", "table"],
    ):
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.ops.cli", *argv],
            env=settings_env(settings),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline()
        proc.stdout.close()  # as `head -1` does
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert b"Traceback" not in err, err
        assert b"BrokenPipe" not in err, err
