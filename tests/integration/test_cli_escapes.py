"""``chronicle`` commands print the log's and tenants' values with their control characters
escaped: a tenant's ESC, BEL, CSI or OSC sequence (in a session id its subject token decodes to,
a field name a refusal quotes, a message's text) never reaches the operator's terminal raw."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from events.omitted import OMITTED
from tests.conftest import make_settings, running_stack
from tests.integration.helpers import text_message
from tests.support import chronicle_cli

T = "tenant-b"
EVIL = "\x1b[1A\x1b[2K\x1b]0;pwned\x07\x9b31m"
ESCAPED = "\\x1b[1A\\x1b[2K\\x1b]0;pwned\\x07\\x9b31m"
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # all but the newline that ends each line


async def test_quarantine_replay_and_history_print_a_tenants_control_characters_escaped(
    nats_url: str, fresh_db: str, new_id: Callable[[str], str]
) -> None:
    settings = make_settings(nats_url, fresh_db)
    sid = new_id("esc")
    async with running_stack(settings) as c:
        subject = c.layout.session_subject(T, EVIL)  # what the tenant's NATS permissions allow
        raw = {"id": "e1", "type": "session.renamed", "version": 1, "tenant": T, "session": EVIL, "name": EVIL}
        bad = (await c.js.publish(subject, json.dumps(raw, ensure_ascii=False).encode())).seq
        said = await c.commands.append(T, sid, text_message("m1", f"hello {EVIL}"), OMITTED)
        field = {**raw, "id": "e2", "session": sid, "name": "n", f"x{EVIL}": 1}  # refused, the detail names it
        odd = (await c.js.publish(c.layout.session_subject(T, sid), json.dumps(field).encode())).seq
        await c.waiter.wait_all(odd)

    listed = chronicle_cli(settings, "quarantine", "list")
    assert listed.returncode == 0, listed.stderr
    [second, first, footer] = listed.stdout.split("\n")[:-1]
    assert (first.split()[0], second.split()[0]) == (str(bad), str(odd))
    assert f"{T}/{ESCAPED}" in first
    assert f"x{ESCAPED}: Extra inputs" in second
    assert footer == "2 quarantined in all (invalid 2)"
    shown = chronicle_cli(settings, "quarantine", "show", str(bad))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["session"] == EVIL  # the same JSON value, its C1 character escaped
    table = chronicle_cli(settings, "replay", "--tenant", T, "--session", sid, "--format", "table")
    assert table.returncode == 0, table.stderr
    assert f"REFUSED             invalid: x{ESCAPED}: Extra inputs" in table.stdout
    lines = chronicle_cli(settings, "replay", "--tenant", T, "--session", sid)
    records = [json.loads(line) for line in lines.stdout.split("\n")[:-1]]
    assert [r["seq"] for r in records] == [said.seq, odd]
    assert records[0]["event"]["message"]["parts"][0]["text"] == f"hello {EVIL}"
    assert records[1]["refused"]["detail"].startswith(f"x{EVIL}: Extra inputs")
    history = chronicle_cli(settings, "history", "--tenant", T, "--session", sid)
    assert history.returncode == 0, history.stderr
    assert [json.loads(line)["parts"][0]["text"] for line in history.stdout.split("\n")[:-1]] == [f"hello {EVIL}"]
    for done in (listed, shown, table, lines, history):  # split on newlines only: str.splitlines() splits at \x85
        assert not CONTROL.search(done.stdout), done.args
