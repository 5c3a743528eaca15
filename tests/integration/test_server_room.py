"""What ``chronicle up`` reads of the server before it sizes its pools (services/ops/connections.py)."""

from __future__ import annotations

import psycopg

from services.ops.connections import HEADROOM, server_room


def test_the_room_is_max_connections_less_reserved_slots_open_connections_and_headroom(db_url: str) -> None:
    with psycopg.connect(db_url) as held:  # open while the room is read: it counts
        most = int(held.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]
        reserved = int(held.execute("SHOW superuser_reserved_connections").fetchone()[0])  # type: ignore[index]
        version = int(held.execute("SHOW server_version_num").fetchone()[0])  # type: ignore[index]
        if version >= 160000:
            reserved += int(held.execute("SHOW reserved_connections").fetchone()[0])  # type: ignore[index]
        room = server_room(db_url)
    assert (room.max_connections, room.reserved) == (most, reserved)
    assert room.open_now >= 2  # this one, and the one asking
    assert room.allowed == most - reserved - room.open_now - HEADROOM
