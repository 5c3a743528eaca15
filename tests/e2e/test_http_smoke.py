from __future__ import annotations

import httpx


def msg(mid: str, text: str, role: str = "user") -> dict[str, object]:
    return {"id": mid, "role": role, "parts": [{"type": "text", "text": text}]}


async def test_append_branch_history(client: httpx.AsyncClient) -> None:
    sid = "smoke-http"
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m1", "hello")})
    assert r.status_code == 201, r.text
    r = await client.post(f"/v1/sessions/{sid}/messages", json={"message": msg("m2", "world")})
    seq = r.json()["seq"]
    h = await client.get(f"/v1/sessions/{sid}/history", params={"min_seq": seq})
    assert [m["id"] for m in h.json()["messages"]] == ["m1", "m2"]
