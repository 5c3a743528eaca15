"""``chronicle up`` fits its processes' Postgres connections in the server's ``max_connections``
(services/ops/connections.py): pools as asked when they fit, capped when they do not and the
pool size was not set, and a refusal naming what to change otherwise."""

from __future__ import annotations

from services.ops.connections import MIN_POOL, extra_connections, pool_decision

EXTRA = extra_connections(4)


def test_pools_that_fit_are_kept_as_asked_and_nothing_is_said() -> None:
    decided = pool_decision(allowed=200, processes=4, extra=EXTRA, pool_max=20, pool_max_set=False, max_connections=208)
    assert (decided.pool_max, decided.message) == (20, "")


def test_at_the_defaults_against_a_stock_server_each_pool_is_capped_to_fit() -> None:
    """Four processes of 20 + 6 could open 104 connections; a stock server (100, 3 reserved, a few
    open, 5 kept free) leaves ~90."""
    decided = pool_decision(allowed=90, processes=4, extra=EXTRA, pool_max=20, pool_max_set=False, max_connections=100)
    assert decided.pool_max == (90 - 4 * EXTRA) // 4 == 16
    assert 4 * (decided.pool_max + EXTRA) <= 90
    assert "could open 104 Postgres connections; the server leaves 90 of its max_connections 100" in decided.message
    assert decided.message.endswith("each process's pool is capped at 16")


def test_a_pool_size_the_operator_set_is_never_changed_the_stack_is_refused() -> None:
    decided = pool_decision(allowed=90, processes=4, extra=EXTRA, pool_max=20, pool_max_set=True, max_connections=100)
    assert decided.pool_max is None
    assert "set CHRONICLE_DB_POOL_MAX to 16 or less" in decided.message
    assert "raise max_connections (at least 114)" in decided.message  # 104 + the 10 the server keeps


def test_too_many_processes_for_even_the_smallest_pools_is_refused() -> None:
    decided = pool_decision(allowed=90, processes=12, extra=EXTRA, pool_max=20, pool_max_set=False, max_connections=100)
    assert decided.pool_max is None
    least = 12 * (MIN_POOL + EXTRA)
    assert f"raise max_connections (at least {least + 10}), or start fewer processes" in decided.message
    assert "CHRONICLE_DB_POOL_MAX to" not in decided.message  # no pool size would do
