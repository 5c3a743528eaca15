"""The search gate (services/context/search_gate.py): a tenant's share, the process's total."""

from __future__ import annotations

import asyncio

import pytest

from services.context.search_gate import SearchBusy, SearchGate, search_slots


def test_the_slots_default_to_half_the_pool_and_half_of_those_for_one_tenant() -> None:
    assert search_slots(20, None, None) == (10, 5)
    assert search_slots(14, None, None) == (7, 3)
    assert search_slots(1, None, None) == (1, 1)
    assert search_slots(20, 6, None) == (6, 3)
    assert search_slots(20, None, 2) == (10, 2)


async def test_a_tenant_past_its_share_is_refused_at_once_and_another_tenant_gets_a_slot() -> None:
    gate = SearchGate(total=3, per_tenant=2)
    async with gate.slot("a", 1.0), gate.slot("a", 1.0):
        with pytest.raises(SearchBusy) as busy:
            async with gate.slot("a", 1.0):
                pass
        assert busy.value.retry_after_s == 1.0
        assert busy.value.status == 429
        async with gate.slot("b", 1.0):
            assert (gate.running("a"), gate.running("b")) == (2, 1)
    assert (gate.running("a"), gate.running("b")) == (0, 0)


async def test_a_search_waits_for_a_slot_of_the_process_then_is_refused_past_its_wait() -> None:
    gate = SearchGate(total=1, per_tenant=1)
    release = asyncio.Event()

    async def holding() -> None:
        async with gate.slot("a", 1.0):
            await release.wait()

    holder = asyncio.create_task(holding())
    while gate.running("a") == 0:
        await asyncio.sleep(0)
    with pytest.raises(SearchBusy):
        async with gate.slot("b", 0.05):
            pass
    assert gate.running("b") == 0
    waiting = asyncio.create_task(_one(gate, "b"))
    while gate.running("b") == 0:
        await asyncio.sleep(0)
    release.set()
    await holder
    assert await waiting == "served"


async def _one(gate: SearchGate, tenant: str) -> str:
    async with gate.slot(tenant, 5.0):
        return "served"
