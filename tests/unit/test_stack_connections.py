"""``chronicle up`` fits its processes' Postgres connections in the server's ``max_connections``
(services/ops/connections.py): pools as asked when they fit, capped when they do not and the
pool size was not set, and a refusal naming what to change otherwise."""

from __future__ import annotations

from services.ops.connections import MIN_POOL, extra_connections, pool_decision

COMPACTS = extra_connections(4)  # compactor, command service, API: leases, LISTEN, one passing
PROJECTS = extra_connections(4, compacts=False)  # a projector holds no lease
STACK = [PROJECTS, COMPACTS, COMPACTS, COMPACTS]  # `chronicle up` at its defaults


def test_a_projector_holds_no_lease() -> None:
    assert (COMPACTS, PROJECTS) == (6, 2)


def test_a_compactor_holds_its_presence_besides() -> None:
    assert extra_connections(4, compactor=True) == COMPACTS + 1


def test_pools_that_fit_are_kept_as_asked_and_nothing_is_said() -> None:
    decided = pool_decision(allowed=200, extras=STACK, pool_max=20, pool_max_set=False, max_connections=208)
    assert (decided.pool_max, decided.message) == (20, "")


def test_at_the_defaults_against_a_stock_server_each_pool_is_capped_to_fit() -> None:
    """A projector of 20 + 2 and three processes of 20 + 6 could open 100 connections; a stock
    server (100, 3 reserved, a few open, 5 kept free) leaves ~90."""
    decided = pool_decision(allowed=90, extras=STACK, pool_max=20, pool_max_set=False, max_connections=100)
    assert decided.pool_max == (90 - 20) // 4 == 17
    assert 4 * decided.pool_max + sum(STACK) <= 90
    assert (
        "20 more in all (compaction leases, LISTEN, compactor presence) could open 100 Postgres connections"
        in decided.message
    )
    assert "the server leaves 90 of its max_connections 100" in decided.message
    assert decided.message.endswith("each process's pool is capped at 17")


def test_a_pool_size_the_operator_set_is_never_changed_the_stack_is_refused() -> None:
    decided = pool_decision(allowed=90, extras=STACK, pool_max=20, pool_max_set=True, max_connections=100)
    assert decided.pool_max is None
    assert "set CHRONICLE_DB_POOL_MAX to 17 or less" in decided.message
    assert "raise max_connections (at least 110)" in decided.message  # 100 + the 10 the server keeps


def test_many_projectors_fit_where_counting_leases_for_each_would_refuse() -> None:
    """Eight projector workers, a compactor, a command service and an API on a stock server."""
    extras = [PROJECTS] * 8 + [COMPACTS] * 3
    decided = pool_decision(allowed=90, extras=extras, pool_max=20, pool_max_set=False, max_connections=100)
    assert decided.pool_max == (90 - 34) // 11 == 5


def test_too_many_processes_for_even_the_smallest_pools_is_refused() -> None:
    extras = [COMPACTS] * 12
    decided = pool_decision(allowed=90, extras=extras, pool_max=20, pool_max_set=False, max_connections=100)
    assert decided.pool_max is None
    least = 12 * MIN_POOL + sum(extras)
    assert f"raise max_connections (at least {least + 10}), or start fewer processes" in decided.message
    assert "CHRONICLE_DB_POOL_MAX to" not in decided.message  # no pool size would do
