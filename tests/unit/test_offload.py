"""The heavy steps of a request (services/offload.py): on the loop for a small body, in a thread of
their own small executor for a large one, with the same result or the same exception; a burst of
large bodies waits for those threads and never takes the ones ``asyncio.to_thread`` uses."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from services.offload import OFF_LOOP_BYTES, OFF_LOOP_WORKERS, off_loop, weigh_body

T = TypeVar("T")


async def _in_request(size: int, fn: Callable[[], T]) -> T:
    """``fn`` run through :func:`off_loop` in a task of its own: a request whose body is ``size`` bytes."""

    async def request() -> T:
        weigh_body(size)
        return await off_loop(fn)

    return await asyncio.create_task(request())


async def test_a_small_bodys_step_runs_on_the_loop() -> None:
    assert await _in_request(OFF_LOOP_BYTES - 1, threading.get_ident) == threading.get_ident()


async def test_a_large_bodys_step_runs_in_a_worker_thread() -> None:
    ran_in = await _in_request(OFF_LOOP_BYTES, threading.current_thread)
    assert ran_in is not threading.current_thread()
    assert ran_in.name.startswith("chronicle-off-loop")


async def test_a_large_bodys_step_raises_its_own_error() -> None:
    def refuse() -> None:
        raise KeyError("the step's own")

    with pytest.raises(KeyError, match="the step's own"):
        await _in_request(OFF_LOOP_BYTES, refuse)


async def test_a_burst_of_large_bodies_leaves_to_thread_its_threads() -> None:
    entered = threading.Semaphore(0)
    release = threading.Event()

    def held() -> str:
        entered.release()
        assert release.wait(30), "never released"
        return threading.current_thread().name

    burst = [asyncio.create_task(_in_request(OFF_LOOP_BYTES, held)) for _ in range(OFF_LOOP_WORKERS + 3)]
    try:
        for _ in range(OFF_LOOP_WORKERS):  # every worker holds a step, the rest of the burst waits
            assert await asyncio.to_thread(entered.acquire, True, 30)
        # the threads object storage's calls use are free: a call runs while the burst waits
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "ran"), 30) == "ran"
    finally:
        release.set()
    names = await asyncio.gather(*burst)
    assert all(n.startswith("chronicle-off-loop") for n in names)
    assert len(set(names)) <= OFF_LOOP_WORKERS
