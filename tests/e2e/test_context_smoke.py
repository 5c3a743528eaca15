from __future__ import annotations

import uuid

import httpx
from minio import Minio

from services.settings import Settings


def sid() -> str:
    return "ctx-" + uuid.uuid4().hex[:10]


async def test_config_write_tools_prompt(client: httpx.AsyncClient, api_settings: Settings) -> None:
    s = sid()
    Minio(api_settings.s3_endpoint, "testing", "testing", secure=False, region="us-east-1").make_bucket(f"sk-{s}")
    config = {
        "blocks": [
            {"label": "soul", "kind": "readonly", "content": "You are helpful."},
            {"label": "memory", "kind": "writable", "description": "Learned facts", "max_tokens": 20},
            {"label": "knowledge", "kind": "searchable", "description": "Searchable docs"},
            {
                "label": "skills",
                "kind": "skills",
                "bucket": f"sk-{s}",
                "prefix": "skills/",
                "description": "Loadable docs",
            },
        ]
    }
    r = await client.put(f"/v1/sessions/{s}/config", json=config)
    assert r.status_code == 200, r.text
    r = await client.post(f"/v1/sessions/{s}/tools/set_context", json={"label": "memory", "content": "fact1"})
    assert r.json()["result"].startswith("Written to memory. Usage: "), r.text
    r = await client.post(
        f"/v1/sessions/{s}/tools/set_context", json={"label": "memory", "content": "fact2", "action": "append"}
    )
    r = await client.get(f"/v1/sessions/{s}/context", params={"min_seq": r.json()["seq"]})
    mem = next(b for b in r.json()["blocks"] if b["label"] == "memory")
    assert mem["content"] == "fact1\nfact2"
    r = await client.post(f"/v1/sessions/{s}/tools/set_context", json={"label": "memory", "content": "word " * 50})
    assert r.json()["result"].startswith('Error: Block "memory" exceeds maxTokens: '), r.text
    r = await client.post(
        f"/v1/sessions/{s}/tools/set_context",
        json={
            "label": "skills",
            "content": "Arr matey",
            "metadata": {"title": "Pirate style", "description": "Talk like a pirate"},
        },
    )
    assert r.json()["result"] == 'Indexed "pirate-style" in skills.'
    r = await client.post(
        f"/v1/sessions/{s}/tools/set_context",
        json={"label": "knowledge", "content": "The deploy happens on Friday", "metadata": {"title": "deploy"}},
    )
    assert r.json()["result"] == 'Indexed "deploy" in knowledge.'
    r = await client.post(
        f"/v1/sessions/{s}/tools/search_context", json={"label": "knowledge", "query": "friday deploy"}
    )
    assert r.json()["result"] == "[deploy]\nThe deploy happens on Friday"
    r = await client.post(f"/v1/sessions/{s}/tools/load_context", json={"label": "skills", "key": "pirate-style"})
    assert r.json()["result"] == "Arr matey"
    params = {"format": "anthropic", "min_seq": r.json()["seq"]}
    tools = (await client.get(f"/v1/sessions/{s}/tools", params=params)).json()["tools"]
    assert [t["name"] for t in tools] == ["set_context", "load_context", "unload_context", "search_context"]
    assert "Currently loaded: skills:pirate-style." in tools[2]["description"]
    r = await client.post(f"/v1/sessions/{s}/tools/unload_context", json={"label": "skills", "key": "pirate-style"})
    assert r.json()["result"] == 'Unloaded "pirate-style" from skills. Context reclaimed.'
    p1 = (await client.get(f"/v1/sessions/{s}/system-prompt")).json()
    assert "MEMORY (Learned facts) [" in p1["prompt"]
    assert "- pirate-style: Talk like a pirate" in p1["prompt"]
    assert "1 entries indexed." in p1["prompt"]
    await client.put(f"/v1/sessions/{s}/context/memory", json={"content": "new"})
    p2 = (await client.get(f"/v1/sessions/{s}/system-prompt")).json()
    assert p2 == p1
    p3 = (await client.post(f"/v1/sessions/{s}/system-prompt:refresh")).json()
    assert p3["version"] == 2
    assert "\nnew" in p3["prompt"]
