"""`chronicle up` on a local cluster starts a dead nats-server node again, and gives up on one that
keeps dying right after its start (real short-lived processes stand in for the servers)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from services.ops.localstack import REVIVE_QUICK_LIMIT, Revival, revive_dead_nodes


def _exited() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc


def _running() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_a_dead_node_is_started_again_in_its_place(started: list[subprocess.Popen[bytes]]) -> None:
    def start() -> subprocess.Popen[bytes]:
        started.append(_running())
        return started[-1]

    other, dead = _running(), _exited()
    started.append(other)
    procs = [other, dead]
    revive = {dead: Revival("n2", start, started_at=0.0)}  # started long ago: not a quick death
    assert revive_dead_nodes(procs, revive) == []
    assert procs[0] is other
    assert procs[1] is started[-1]
    assert procs[1].poll() is None
    assert list(revive) == [procs[1]]
    assert revive[procs[1]].quick_deaths == 0


def test_a_dead_process_that_is_not_a_node_stops_the_stack() -> None:
    dead = _exited()
    assert revive_dead_nodes([dead], {}) == [dead]


def test_a_node_that_keeps_dying_right_after_its_start_stops_the_stack() -> None:
    procs = [_exited()]
    revive = {procs[0]: Revival("n1", _exited)}  # every start dies at once
    rounds = 0
    while not (gone := revive_dead_nodes(procs, revive)):
        rounds += 1
    assert rounds == REVIVE_QUICK_LIMIT - 1
    assert gone == procs
    assert revive == {}


def test_a_node_that_cannot_start_again_stops_the_stack() -> None:
    def start() -> subprocess.Popen[bytes]:
        raise RuntimeError("nats-server did not listen on 127.0.0.1:1 within 20s")

    dead = _exited()
    assert revive_dead_nodes([dead], {dead: Revival("n3", start, started_at=0.0)}) == [dead]
