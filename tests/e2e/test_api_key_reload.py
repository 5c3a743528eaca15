"""`chronicle api` reloads its keys on SIGHUP: ``CHRONICLE_API_KEYS_FILE`` read again (``CHRONICLE_API_KEYS``
kept), swapped for the next requests when it parses, the previous keys kept (and an ERROR line)
when it does not. A real process, spoken to over HTTP."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from bench.support import settings_env
from chronicle_sdk import ChronicleClient, Unauthorized
from services.ops.localstack import free_port, wait_for_port
from services.settings import Settings, api_key_entry
from tests.conftest import KEYS
from tests.e2e.helpers import chain, new_sid


@dataclass
class KeyedApi:
    """A `chronicle api` whose keys file is ``keys_file``, its log in ``log``."""

    proc: subprocess.Popen[bytes]
    base: str
    keys_file: Path
    log: Path

    def status(self, key: str) -> int:
        return httpx.get(f"{self.base}/v1/sessions", headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code

    def hangup(self) -> None:
        self.proc.send_signal(signal.SIGHUP)

    def until(self, what: str, done: Callable[[], bool], timeout: float = 30) -> None:
        """Poll ``done`` (the positive signal) until it holds; the process must stay up meanwhile."""
        deadline = time.monotonic() + timeout
        while not done():
            assert self.proc.poll() is None, f"chronicle api exited ({self.proc.returncode}):\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"not within {timeout} s: {what}\n{self.log.read_text()}"
            time.sleep(0.1)

    def logged(self, text: str) -> bool:
        return text in self.log.read_text()


@pytest.fixture
def keyed_api(api_settings: Settings, api_url: str, tmp_path: Path) -> Iterator[KeyedApi]:
    """A second `chronicle api` on the e2e stack (its database migrated by ``api_url``) whose keys
    file holds one key of tenant-c; CHRONICLE_API_KEYS is the stack's (tenant-a's and tenant-b's)."""
    with started_api(api_settings, tmp_path, f"# tenant-c\n\n{api_key_entry('tenant-c', KEPT)}\n") as api:
        wait_for_port("127.0.0.1", api.port, api.proc, "chronicle api", timeout=30)
        yield KeyedApi(api.proc, f"http://127.0.0.1:{api.port}", api.keys_file, api.log)


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    port: int
    keys_file: Path
    log: Path


@contextmanager
def started_api(api_settings: Settings, tmp_path: Path, keys: str) -> Iterator[Started]:
    """A `chronicle api` process (through the command's entry point) on a port of its own, its keys
    file holding ``keys``, its output in a log; stopped (exit 0) at the end."""
    keys_file = tmp_path / "api-keys"
    keys_file.write_text(keys)
    settings = api_settings.model_copy(update={"api_port": free_port(), "api_keys_file": str(keys_file)})
    log = tmp_path / "api.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.ops.entry", "api"], env=settings_env(settings), stdout=out, stderr=out
        )
    try:
        yield Started(proc, settings.api_port, keys_file, log)
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0, log.read_text()


KEPT = "key-c-" + uuid.uuid4().hex


def test_a_key_added_to_the_file_works_after_sighup_and_not_before(keyed_api: KeyedApi) -> None:
    assert keyed_api.status(KEPT) == 200  # the file's key, read at start
    assert keyed_api.status(KEYS["tenant-a"]) == 200  # and CHRONICLE_API_KEYS's, together
    added = "key-c2-" + uuid.uuid4().hex
    with keyed_api.keys_file.open("a") as f:
        f.write(f"{api_key_entry('tenant-c', added, read_only=True)}\n")
    assert keyed_api.status(added) == 401  # the file changed, no signal yet: nothing reread
    keyed_api.hangup()
    keyed_api.until("the added key answers 200", lambda: keyed_api.status(added) == 200)
    keyed_api.until(
        "the reload logged", lambda: keyed_api.logged(f"api keys reloaded: 2 entries from {keyed_api.keys_file}")
    )
    assert keyed_api.status(KEPT) == 200
    assert keyed_api.status(KEYS["tenant-a"]) == 200  # the env's keys kept
    log = keyed_api.log.read_text()
    assert added not in log
    assert KEPT not in log


def test_a_key_removed_from_the_file_is_401_after_sighup(keyed_api: KeyedApi) -> None:
    assert keyed_api.status(KEPT) == 200
    keyed_api.keys_file.write_text("# tenant-c's key revoked\n")
    keyed_api.hangup()
    keyed_api.until("the removed key answers 401", lambda: keyed_api.status(KEPT) == 401)
    keyed_api.until(
        "the reload logged", lambda: keyed_api.logged(f"api keys reloaded: 0 entries from {keyed_api.keys_file}")
    )
    assert keyed_api.status(KEYS["tenant-a"]) == 200


async def test_a_followed_answer_ends_once_a_reload_revoked_its_key_and_a_kept_key_s_goes_on(
    keyed_api: KeyedApi,
) -> None:
    """(A followed event answer opened with a key that a reload then removed kept streaming the
    tenant's events for as long as the client stayed.) It ends soon after the reload, as it ends
    when the server stops: the SDK's follow asks again and meets 401. One of a key the reload kept
    goes on."""
    gone = "key-c-gone-" + uuid.uuid4().hex
    kept_only = f"{api_key_entry('tenant-c', KEPT)}\n"
    keyed_api.keys_file.write_text(f"{kept_only}{api_key_entry('tenant-c', gone, read_only=True)}\n")
    keyed_api.hangup()
    keyed_api.until("the second key answers 200", lambda: keyed_api.status(gone) == 200)
    sid = new_sid("revoked-follow")
    path, follow = f"/v1/sessions/{sid}/events", {"follow": "true"}
    async with (
        httpx.AsyncClient(base_url=keyed_api.base, headers=_bearer(KEPT), timeout=30) as writer,
        httpx.AsyncClient(base_url=keyed_api.base, headers=_bearer(gone), timeout=30) as reader,
    ):
        first = await chain(writer, sid, ["m1"])
        async with (
            writer.stream("GET", path, params=follow) as kept,
            reader.stream("GET", path, params=follow) as ended,
        ):
            assert (kept.status_code, ended.status_code) == (200, 200)
            kept_lines, ended_lines = _events(kept.aiter_lines()), _events(ended.aiter_lines())
            assert (await anext(kept_lines))["seq"] == first
            assert (await anext(ended_lines))["seq"] == first
            keyed_api.keys_file.write_text(kept_only)  # the read-only key revoked
            keyed_api.hangup()
            # the positive signal: the answer's end, well before a keep-alive is due (15 s)
            assert await asyncio.wait_for(_rest(ended_lines), timeout=10) == []
            assert keyed_api.status(gone) == 401  # what the SDK's follow meets when it asks again
            second = await chain(writer, sid, ["m2"])
            assert (await asyncio.wait_for(anext(kept_lines), timeout=10))["seq"] == second


async def test_the_sdk_s_follow_of_a_revoked_key_raises_unauthorized(keyed_api: KeyedApi) -> None:
    """The end of a followed answer whose key a reload removed is, to the SDK, a server that
    stopped: it asks again, meets 401 and raises it (it does not follow on, nor wait forever)."""
    gone = "key-c-gone-" + uuid.uuid4().hex
    kept_only = f"{api_key_entry('tenant-c', KEPT)}\n"
    keyed_api.keys_file.write_text(f"{kept_only}{api_key_entry('tenant-c', gone)}\n")
    keyed_api.hangup()
    keyed_api.until("the second key answers 200", lambda: keyed_api.status(gone) == 200)
    async with ChronicleClient(keyed_api.base, gone) as sdk:
        session = sdk.session(new_sid("revoked-sdk-follow"))
        await session.append_message({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]})
        records: list[dict[str, object]] = []

        async def follow() -> None:
            async for record in session.follow_events():
                records.append(record)

        following = asyncio.create_task(follow())
        async with asyncio.timeout(20):
            while not records:  # the follow is open and has given its first event
                await asyncio.sleep(0.02)
        keyed_api.keys_file.write_text(kept_only)
        keyed_api.hangup()
        with pytest.raises(Unauthorized):
            await asyncio.wait_for(following, timeout=20)
        assert len(records) == 1


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, object]]:
    """A followed answer's records (keep-alives skipped)."""
    async for line in lines:
        if line.strip():
            record: dict[str, object] = json.loads(line)
            yield record


async def _rest(records: AsyncIterator[dict[str, object]]) -> list[dict[str, object]]:
    return [record async for record in records]


def test_an_invalid_file_on_sighup_keeps_the_old_keys_and_logs_why(keyed_api: KeyedApi) -> None:
    added = "key-c3-" + uuid.uuid4().hex
    keyed_api.keys_file.write_text(f"{api_key_entry('tenant-c', added)}\n\ntenant-c:{added}\n")  # line 3: a raw key
    keyed_api.hangup()
    keyed_api.until("the refusal logged", lambda: keyed_api.logged("api keys not reloaded"))
    (line,) = [line for line in keyed_api.log.read_text().splitlines() if "api keys not reloaded" in line]
    assert " ERROR " in line
    assert f"{keyed_api.keys_file} line 3: an entry of tenant 'tenant-c' is not" in line
    assert added not in line  # never the line's text: it may be a secret
    assert keyed_api.status(KEPT) == 200  # the previous keys, whole
    assert keyed_api.status(added) == 401  # nothing of the new file
    # unreadable: the same
    keyed_api.keys_file.unlink()
    keyed_api.hangup()
    keyed_api.until(
        "the second refusal logged",
        lambda: keyed_api.log.read_text().count("api keys not reloaded") == 2,
    )
    assert f"{keyed_api.keys_file} cannot be read (No such file or directory)" in keyed_api.log.read_text()
    assert keyed_api.status(KEPT) == 200
    # empty (an editor's or a shell's `>` truncates before it writes): the same, never "no keys"
    keyed_api.keys_file.write_text("")
    keyed_api.hangup()
    keyed_api.until(
        "the third refusal logged",
        lambda: keyed_api.log.read_text().count("api keys not reloaded") == 3,
    )
    assert f"{keyed_api.keys_file} is empty (being written?" in keyed_api.log.read_text()
    assert keyed_api.status(KEPT) == 200


def test_a_sighup_while_the_api_starts_is_a_reload_once_it_serves(
    api_settings: Settings, api_url: str, tmp_path: Path
) -> None:
    """(The API installed its SIGHUP handler only once its imports and settings were done: a reload
    sent to a process still starting, by `chronicle up` or `systemctl reload`, ended it, and `up`
    stopped the whole stack.)"""
    with started_api(api_settings, tmp_path, f"{api_key_entry('tenant-c', KEPT)}\n") as api:
        # the entry point's handler, installed before anything heavy is imported
        _while_up(api, lambda: _catches_sighup(api.proc.pid), step=0.005)
        api.proc.send_signal(signal.SIGHUP)
        wait_for_port("127.0.0.1", api.port, api.proc, "chronicle api", timeout=30)
        _while_up(api, lambda: f"api keys reloaded: 1 entries from {api.keys_file}" in api.log.read_text())


def _while_up(api: Started, done: Callable[[], bool], step: float = 0.1) -> None:
    """Poll ``done`` for up to 30 s while the process stays up."""
    deadline = time.monotonic() + 30
    while not done():
        assert api.proc.poll() is None, api.log.read_text()
        assert time.monotonic() < deadline, api.log.read_text()
        time.sleep(step)


def _catches_sighup(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    return False
