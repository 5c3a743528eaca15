"""N concurrent appends to one session, none naming its parent (each attaches to the latest leaf),
against a running API: how long the burst takes, what it answered, and whether the session is
one linear chain afterwards (the outside-in trial's measurement of same-session contention).

    python -m bench.session_burst --url http://127.0.0.1:8383 --key chr_… --n 100 300
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections import Counter

import httpx


async def spread(client: httpx.AsyncClient, n: int) -> dict[str, object]:
    """The same burst over ``n`` sessions, one append each: what the client and the server take
    for ``n`` concurrent appends when no two share a session (the floor for :func:`burst`)."""
    run = uuid.uuid4().hex[:8]

    async def append(i: int) -> int:
        body = {"message": {"id": "m0", "role": "user", "parts": [{"type": "text", "text": f"message {i}"}]}}
        return (await client.post(f"/v1/sessions/spread-{run}-{i}/messages", json=body)).status_code

    start = time.perf_counter()
    answers = await asyncio.gather(*(append(i) for i in range(n)))
    elapsed = time.perf_counter() - start
    return {"n": n, "sessions": n, "seconds": round(elapsed, 2), "answers": dict(Counter(answers))}


async def burst(client: httpx.AsyncClient, n: int) -> dict[str, object]:
    sid = f"burst-{n}-{uuid.uuid4().hex[:8]}"
    (await client.post("/v1/sessions", json={"id": sid, "name": sid})).raise_for_status()

    async def append(i: int) -> tuple[int, str, object, int]:
        body = {"message": {"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": f"message {i}"}]}}
        r = await client.post(f"/v1/sessions/{sid}/messages", json=body)
        out = r.json()
        return (
            r.status_code,
            (out.get("code", "") if r.status_code >= 400 else ""),
            out.get("parent_id"),
            out.get("seq", 0),
        )

    start = time.perf_counter()
    answers = await asyncio.gather(*(append(i) for i in range(n)))
    elapsed = time.perf_counter() - start
    parents = [p for status, _, p, _ in answers if status == 201]
    seq = max(q for *_, q in answers)
    # one chain: the latest leaf's path holds every message, and no two took the same parent
    path = (await client.get(f"/v1/sessions/{sid}/history", params={"compacted": "false", "min_seq": seq})).json()[
        "messages"
    ]
    return {
        "n": n,
        "seconds": round(elapsed, 2),
        "answers": dict(Counter(f"{s} {c}".strip() for s, c, *_ in answers)),
        "path": len(path),
        "linear": len(path) == len(parents) and len(set(parents)) == len(parents),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--key", required=True)
    parser.add_argument("--n", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--spread", action="store_true", help="also each burst over n sessions (the floor)")
    args = parser.parse_args()
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    headers = {"Authorization": f"Bearer {args.key}"}
    for n in args.n:
        for _ in range(args.repeat):
            # a client per burst: connections a server closed while idle are never reused
            async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=120, limits=limits) as client:
                print(await burst(client, n), flush=True)
            if args.spread:
                async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=120, limits=limits) as client:
                    print(await spread(client, n), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
