"""What a NATS connection logs while it reconnects (services/connection_loss.py): the first failed
attempt of an outage, a summary every 30 s while it lasts, a line once it is back; each attempt
(two a second, each process) was a line of its own."""

from __future__ import annotations

from events.publisher import lost_connection
from services.connection_loss import ReconnectNoise
from services.requests.problems import problem_of

REFUSED = ConnectionRefusedError(111, "Connection refused")
UVLOOP_LOST = RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")


def test_an_outage_logs_its_first_failed_attempt_a_summary_every_30_s_and_its_end() -> None:
    noise = ReconnectNoise()
    said = [noise.attempt_failed(t / 2, REFUSED) for t in range(0, 130)]  # 65 s, an attempt every half second
    lines = [line for line in said if line is not None]
    assert len(lines) == 3, lines
    assert lines[0].startswith("nats: reconnecting: ConnectionRefusedError")
    assert lines[1].startswith("nats: still reconnecting: 61 attempts failed in 30 s")
    assert lines[2].startswith("nats: still reconnecting: 121 attempts failed in 60 s")
    assert noise.reconnected(65.0, "127.0.0.1:4222") == (
        "nats: reconnected to 127.0.0.1:4222 after 130 failed attempts in 65.0 s"
    )


def test_the_next_outage_starts_its_count_again_and_a_reconnect_without_failures_says_nothing() -> None:
    noise = ReconnectNoise()
    assert noise.reconnected(1.0, "n1:4222") is None
    noise.attempt_failed(10.0, REFUSED)
    noise.reconnected(11.0, "n1:4222")
    first = noise.attempt_failed(100.0, REFUSED)
    assert first is not None
    assert first.startswith("nats: reconnecting:")
    assert noise.attempt_failed(100.5, REFUSED) is None
    assert noise.reconnected(101.0, "n2:4222") == "nats: reconnected to n2:4222 after 2 failed attempts in 1.0 s"


def test_a_write_on_a_lost_socket_is_503_unavailable_and_another_runtime_error_stays_a_bug() -> None:
    """nats-py writing to a socket the killed server's end closed, before it noticed, raised out of
    a request as uvloop's RuntimeError (a 500): it is ``503 unavailable`` (retry), as a NATS error is."""
    for lost in (UVLOOP_LOST, ConnectionResetError("Connection lost")):
        assert lost_connection(lost)
        found = problem_of(lost)
        assert found is not None
        assert (found["status"], found["code"]) == (503, "unavailable"), found
    bug = RuntimeError("dictionary changed size during iteration")
    assert not lost_connection(bug)
    assert problem_of(bug) is None
