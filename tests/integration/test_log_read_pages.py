"""One session's events are read through batched direct gets (``events.log.read`` with a
subject): a page of a large session receives that page only, and what is read is what an
ordered consumer delivers, headers and times included; where the gets stop short, or the server
answers one event a get (before nats-server 2.11), the rest comes through an ordered consumer.
Real NATS."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from events import log as eventlog
from events.stream import ensure_stream
from events.subjects import SubjectLayout
from services.ops.localstack import free_port, wait_for_port
from tests.conftest import operator_nats


def _layout() -> SubjectLayout:
    tag = uuid.uuid4().hex[:8]
    return SubjectLayout(stream=f"P{tag}", prefix=f"p{tag}.ev", commands=f"p{tag}.cmd")


@contextlib.asynccontextmanager
async def _stream(url: str, seed: bool = True) -> AsyncIterator[tuple[NatsClient, JetStreamContext, SubjectLayout]]:
    nc = await operator_nats(url) if seed else await nats.connect(url)
    js = nc.jetstream()
    layout = _layout()
    await ensure_stream(js, layout)
    try:
        yield nc, js, layout
    finally:
        await js.delete_stream(layout.stream)
        await nc.close()


async def _publish(js: JetStreamContext, subjects: list[str], body: bytes = b"{}", first: int = 0) -> None:
    """One event a subject in turn, ``Nats-Msg-Id`` set as the publisher sets it (``ev-<n>`` from
    ``first``: the stream drops an id it holds)."""
    acks = [
        await js.publish_async(subject, body + str(i).encode(), headers={"Nats-Msg-Id": f"ev-{i}"})
        for i, subject in enumerate(subjects, start=first)
    ]
    await asyncio.gather(*acks)


async def test_a_page_of_a_large_session_receives_that_page_only(nats_url: str) -> None:
    async with _stream(nats_url) as (nc, js, layout):
        big, other = layout.session_subject("t", "big"), layout.session_subject("t", "other")
        await _publish(js, [big, other] * 3_000, b"x" * 300)
        before = nc.stats["in_msgs"]
        page = [e.seq async for e in eventlog.read(js, layout, big, 2_001, limit=100)]
        received = nc.stats["in_msgs"] - before
    assert page == list(range(2_001, 2_201, 2))
    # the page and the answers around it (the subject's last sequence, the batch's end): an
    # ordered consumer received its flow-control window, thousands of events past the page
    assert received <= 100 + 3, received


async def test_a_session_read_in_batches_is_what_an_ordered_consumer_delivers(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventlog, "DIRECT_BATCH", 7)  # many batches, ended by count
    async with _stream(nats_url) as (_, js, layout):
        a, b = layout.session_subject("t", "a"), layout.session_subject("t", "b")
        await _publish(js, [a, b, a] * 40, b"y" * 1_000)
        end = await eventlog.last_seq(js, layout, a)
        pushed = [
            e
            async for e in eventlog._read_consumer(js, layout, a, 5, end, 5.0)  # the reader before direct gets
        ]
        batched = [e async for e in eventlog.read(js, layout, a, 5)]
        monkeypatch.setattr(eventlog, "DIRECT_BATCH_BYTES", 2_500)  # batches ended by their bytes
        by_bytes = [e async for e in eventlog.read(js, layout, a, 5)]
    assert len(pushed) == 77
    assert batched == pushed  # seq, subject, data, headers as stored (Nats-Msg-Id), time
    assert by_bytes == pushed
    assert pushed[0].headers == {"Nats-Msg-Id": "ev-5"}


async def test_a_read_whose_gets_stop_short_of_its_end_reads_the_rest_through_a_consumer(nats_url: str) -> None:
    """What a replica that has not applied the newest events answers (any replica answers a
    direct get): fewer events than the end the read began with."""
    async with _stream(nats_url) as (_, js, layout):
        a = layout.session_subject("t", "a")
        await _publish(js, [a] * 5)
        reader = eventlog._read_subject(js, layout, a, 1, 7, 5.0, None)  # an end the gets do not reach yet
        first = [await anext(reader) for _ in range(5)]
        await _publish(js, [a] * 2, first=5)  # after the gets answered: only the leader's consumer has them
        rest = [e async for e in reader]
    assert [e.seq for e in first + rest] == [1, 2, 3, 4, 5, 6, 7]


DEBIAN_NATS = Path("/usr/sbin/nats-server")


@pytest.mark.skipif(shutil.which(str(DEBIAN_NATS)) is None, reason="no nats-server 2.9 on this machine")
async def test_a_server_before_2_11_answers_one_event_a_get_and_the_read_goes_on_through_a_consumer(
    tmp_path: Path,
) -> None:
    """Debian's nats-server 2.9.10 ignores ``batch``: the read takes its one event and reads on."""
    version = subprocess.run([str(DEBIAN_NATS), "--version"], capture_output=True, text=True, check=True).stdout
    assert "v2.9." in version
    port = free_port()
    proc = subprocess.Popen(
        [str(DEBIAN_NATS), "-js", "-sd", str(tmp_path), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port, proc, "nats-server")
        async with _stream(f"nats://127.0.0.1:{port}", seed=False) as (_, js, layout):
            a, b = layout.session_subject("t", "a"), layout.session_subject("t", "b")
            await _publish(js, [a, b] * 10)
            read = [(e.seq, e.headers) async for e in eventlog.read(js, layout, a, 3)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert [seq for seq, _ in read] == [3, 5, 7, 9, 11, 13, 15, 17, 19]
    assert read[0][1] == {"Nats-Msg-Id": "ev-2"}


async def test_a_stored_header_named_status_is_read_as_the_event_it_belongs_to(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct publisher may store a header named ``Status``: a reply was taken for the server's
    status by that name (a 204 ended the batch early and the rest of it leaked into the next, out
    of order and repeated; any other value failed every read of the session)."""
    monkeypatch.setattr(eventlog, "DIRECT_BATCH", 4)
    async with _stream(nats_url) as (_, js, layout):
        a = layout.session_subject("t", "a")
        for i in range(10):
            status = {2: "204", 5: "500", 7: "200"}.get(i)
            headers = {"Nats-Msg-Id": f"ev-{i}"} | ({"Status": status} if status else {})
            await js.publish(a, f"{i}".encode(), headers=headers)
        pushed = [e async for e in eventlog._read_consumer(js, layout, a, 1, 10, 5.0)]
        batched = [e async for e in eventlog.read(js, layout, a)]
    assert [e.seq for e in pushed] == list(range(1, 11))
    assert batched == pushed
    assert batched[2].headers == {"Nats-Msg-Id": "ev-2", "Status": "204"}


async def test_a_stream_that_answers_no_direct_get_is_read_through_a_consumer(nats_url: str) -> None:
    """No server answers a direct get (a stream made without ``allow_direct``: no responders): the
    read goes on through the ordered consumer, not a failure."""
    nc = await operator_nats(nats_url)
    js = nc.jetstream()
    layout = _layout()
    try:
        await js.add_stream(name=layout.stream, subjects=[layout.wildcard], allow_direct=False)
        a, b = layout.session_subject("t", "a"), layout.session_subject("t", "b")
        await _publish(js, [a, b] * 5)
        # (its last sequence is asked without a direct get here: ``read`` asks it with one)
        read = [e.seq async for e in eventlog._read_subject(js, layout, a, 1, 9, 5.0, 3)]
    finally:
        await js.delete_stream(layout.stream)
        await nc.close()
    assert read[:3] == [1, 3, 5]
