"""The bounded least-recently-used map that holds a process's data keys (projections/lru.py), and
its setting (``key_cache_sessions``)."""

from __future__ import annotations

import pytest

from projections.keystore import KEY_CACHE_SESSIONS
from projections.lru import Lru
from services.settings import Settings


def filled(capacity: int | None, *keys: str) -> Lru[str, int]:
    lru: Lru[str, int] = Lru(capacity)
    for i, key in enumerate(keys):
        lru.put(key, i)
    return lru


def test_past_its_capacity_the_least_recently_put_is_evicted_first() -> None:
    lru = filled(3, "a", "b", "c", "d", "e")
    assert lru.keys() == ["c", "d", "e"]
    assert len(lru) == 3
    assert "a" not in lru
    assert lru.get("a") is None


def test_a_hit_is_a_use_and_saves_the_entry_from_the_next_eviction() -> None:
    lru = filled(3, "a", "b", "c")
    assert lru.get("a") == 0
    lru.put("d", 3)
    assert lru.keys() == ["c", "a", "d"]  # b, the least recently used, went


def test_in_is_not_a_use() -> None:
    lru = filled(3, "a", "b", "c")
    assert "a" in lru
    lru.put("d", 3)
    assert "a" not in lru


def test_putting_a_held_key_again_replaces_its_value_and_counts_as_a_use() -> None:
    lru = filled(2, "a", "b")
    lru.put("a", 10)
    lru.put("c", 2)
    assert lru.keys() == ["a", "c"]
    assert lru.get("a") == 10


def test_a_miss_answers_the_default() -> None:
    lru = filled(2, "a")
    assert lru.get("z") is None
    assert lru.get("z", 7) == 7
    assert lru.keys() == ["a"]


def test_capacity_one_holds_the_last_put_only() -> None:
    lru = filled(1, "a", "b")
    assert lru.keys() == ["b"]
    assert lru.get("b") == 1
    lru.put("b", 5)
    assert lru.keys() == ["b"]
    assert lru.get("b") == 5
    lru.put("c", 6)
    assert lru.keys() == ["c"]


@pytest.mark.parametrize("capacity", [0, -1])
def test_a_capacity_below_one_is_refused(capacity: int) -> None:
    with pytest.raises(ValueError, match="at least one"):
        Lru[str, int](capacity)


def test_put_all_evicts_none_of_what_it_puts_even_past_the_capacity() -> None:
    lru = filled(2, "a", "b")
    lru.put_all({"c": 2, "d": 3, "e": 4})
    assert lru.keys() == ["c", "d", "e"]  # three held at capacity 2: exactly the batch
    lru.put("f", 5)
    assert lru.keys() == ["e", "f"]  # back within the capacity at the next put


def test_put_all_with_held_keys_keeps_them_and_evicts_the_others_first() -> None:
    lru = filled(3, "a", "b", "c")
    lru.put_all({"a": 10, "d": 3})
    assert lru.keys() == ["c", "a", "d"]
    assert lru.get("a") == 10


def test_put_all_at_capacity_one_keeps_the_whole_batch() -> None:
    lru = filled(1, "a")
    lru.put_all({"b": 1, "c": 2})
    assert lru.keys() == ["b", "c"]


def test_pop_drops_a_held_key_and_ignores_one_not_held() -> None:
    lru = filled(3, "a", "b")
    lru.pop("a")
    lru.pop("z")
    assert lru.keys() == ["b"]


def test_unbounded_evicts_nothing() -> None:
    lru = filled(None, *(str(i) for i in range(1000)))
    assert len(lru) == 1000
    assert lru.capacity is None


def test_unbound_lifts_the_capacity_from_then_on() -> None:
    lru = filled(2, "a", "b", "c")
    assert lru.keys() == ["b", "c"]
    lru.unbound()
    lru.put_all({"d": 3, "e": 4})
    lru.put("f", 5)
    assert lru.keys() == ["b", "c", "d", "e", "f"]


def test_the_key_cache_setting_defaults_to_the_stores_and_has_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().key_cache_sessions == KEY_CACHE_SESSIONS == 100_000
    monkeypatch.setenv("CHRONICLE_KEY_CACHE_SESSIONS", "5000")
    assert Settings().key_cache_sessions == 5000
    for refused in (999, 100_000_001):
        with pytest.raises(ValueError, match="key_cache_sessions"):
            Settings(key_cache_sessions=refused)
