"""The CPU-heavy steps of a request with a large body, run in a worker thread, off the event loop.

A write's body is parsed, checked, hashed and serialised again on its way to the log, all in
Python: for a body of tens of MB that held the loop about a second (a measured 0.8 s for 16 MiB of
text, 4.4 s for 16 MiB of small parts), during which no other request of any tenant was served
(the noisy-neighbour trial). The edge that reads a body (the API's hot path and routes, the NATS
commands) says how large it is (:func:`weigh_body`); the heavy steps of a request whose body is
:data:`OFF_LOOP_BYTES` or more (:func:`off_loop`) then run in a thread of this module's own small
executor, and the loop serves other requests meanwhile. The executor is bounded
(:data:`OFF_LOOP_WORKERS`): a burst of huge bodies waits its turn there, and never takes the
threads that object storage's calls use (``asyncio.to_thread``'s). A step's result and its
errors are what they were on the loop: the same exception, raised where it was awaited.

The size is the request's, held in a context variable: it follows the request through the
layers (and the tasks it starts) without every signature carrying it, and work no request
started (the compactor, the projector) stays on the loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

OFF_LOOP_BYTES = 256 * 1024
"""A body this large or larger has its heavy steps run off the loop. Measured on the development machine
(parse, body model, message checks, hash and the two serialisations of one append): 64 KiB
held the loop 1.4 ms (text) to 5.6 ms (small parts), 256 KiB 11 to 29 ms, 1 MiB 55 to 175 ms;
a thread's hop costs ~0.36 ms, paid by each of a request's three or four steps: below this size
the hops would cost a good part of the work, above it they cost under a tenth of it."""

OFF_LOOP_WORKERS = 2
"""Threads for the heavy steps, every request's together. The steps are Python holding the GIL:
more threads would add no throughput, only take more of the loop's turns while they run."""

_body_bytes: ContextVar[int] = ContextVar("chronicle_request_body_bytes", default=0)
_executor: ThreadPoolExecutor | None = None

P = ParamSpec("P")
T = TypeVar("T")


def weigh_body(size: int) -> None:
    """Say, for the rest of the current request (its task and those it starts), how many bytes its
    body has."""
    _body_bytes.set(size)


def heavy() -> bool:
    """Whether the current request's body is large enough for :func:`off_loop` to leave the loop."""
    return _body_bytes.get() >= OFF_LOOP_BYTES


async def off_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``: in a worker thread when the current request's body is large
    (:func:`heavy`), else here, on the loop. ``fn`` must be pure CPU work on values the caller
    does not change while it runs."""
    if not heavy():
        return fn(*args, **kwargs)
    global _executor
    if _executor is None:  # made on first use: nothing is started at import
        _executor = ThreadPoolExecutor(OFF_LOOP_WORKERS, thread_name_prefix="chronicle-off-loop")
    return await asyncio.get_running_loop().run_in_executor(_executor, functools.partial(fn, *args, **kwargs))
