"""``chronicle stream-replicas N``'s progress line: a copy that has not reported yet (nats-server
lists a stream's new peers only once they answer) is catching up, its lag unknown, never lag 0
(an SRE trial saw "1/3 copies current, largest lag 0", then lag 15493)."""

from __future__ import annotations

from nats.js.api import ClusterInfo, PeerInfo, StreamConfig, StreamInfo, StreamState

from services.ops.replicas import copies_current, progress_line


def info(*peers: PeerInfo, leader: str | None = "n1") -> StreamInfo:
    state = StreamState(messages=0, bytes=0, first_seq=0, last_seq=0, consumer_count=0)
    cluster = ClusterInfo(leader=leader, name="c", replicas=list(peers))
    return StreamInfo(config=StreamConfig(name="S"), state=state, cluster=cluster)


def test_new_copies_that_have_not_reported_are_catching_up_not_at_lag_0() -> None:
    copies = copies_current(info(), 3)
    assert (copies.current, copies.lag, copies.catching_up) == (1, None, 2)
    assert progress_line("S", copies, 3) == "S: 1/3 copies current; 2 catching up (lag not reported yet)"


def test_a_copy_not_current_without_a_lag_is_catching_up() -> None:
    """nats-server leaves a lag of 0 out of its answer: a copy not current without one is not known to
    be at lag 0."""
    copies = copies_current(info(PeerInfo(name="n2", current=False), PeerInfo(name="n3", current=False)), 3)
    assert progress_line("S", copies, 3) == "S: 1/3 copies current; 2 catching up (lag not reported yet)"


def test_the_largest_reported_lag_is_said_beside_those_not_reported() -> None:
    copies = copies_current(info(PeerInfo(name="n2", current=False, lag=15493)), 3)
    assert (copies.current, copies.lag, copies.catching_up) == (1, 15493, 1)
    assert progress_line("S", copies, 3) == (
        "S: 1/3 copies current, largest lag 15493; 1 more catching up (lag not reported yet)"
    )


def test_every_copy_reported() -> None:
    lagging = copies_current(info(PeerInfo(name="n2", current=True), PeerInfo(name="n3", current=False, lag=7)), 3)
    assert progress_line("S", lagging, 3) == "S: 2/3 copies current, largest lag 7"
    done = copies_current(info(PeerInfo(name="n2", current=True), PeerInfo(name="n3", current=True)), 3)
    assert (done.current, done.lag, done.catching_up) == (3, 0, 0)
    assert progress_line("S", done, 3) == "S: 3/3 copies current"


def test_one_replica_is_current_alone() -> None:
    assert progress_line("S", copies_current(info(), 1), 1) == "S: 1/1 copies current"
