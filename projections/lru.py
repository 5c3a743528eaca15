"""A least-recently-used map with a capacity: what a long-lived process keeps per session
(the data keys of :mod:`projections.keystore`) without growing for the life of the process.

Pure and O(1) per touch (an :class:`~collections.OrderedDict`: a hit moves the entry to the
newest end, an eviction pops the oldest). :meth:`Lru.put_all` never evicts what it puts: a
caller that needs a batch of entries at once (loaded together, used right after) gets all of
them even past the capacity, and the map is back within its capacity at the next put.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``capacity`` entries (None: unbounded), or those of the last :meth:`put_all` when
    it put more; the least recently used evicted first. :meth:`get` is a use, ``in`` is not."""

    __slots__ = ("_capacity", "_data")

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"an LRU cache holds at least one entry, not {capacity}")
        self._capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()

    @property
    def capacity(self) -> int | None:
        return self._capacity

    def unbound(self) -> None:
        """Evict nothing from now on (a reader that needs every entry at once)."""
        self._capacity = None

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: K) -> bool:
        return key in self._data

    def get(self, key: K, default: V | None = None) -> V | None:
        """The entry (now the most recently used), else ``default``."""
        data = self._data
        try:
            data.move_to_end(key)
        except KeyError:
            return default
        return data[key]

    def put(self, key: K, value: V) -> None:
        """Set ``key`` (the most recently used), evicting the least recently used past the capacity."""
        self.put_all({key: value})

    def put_all(self, entries: Mapping[K, V]) -> None:
        """Set every entry (the most recently used, in ``entries``' order), then evict the least
        recently used past the capacity, never one of ``entries``: all of them are held when this
        returns, even more than the capacity (then exactly they are)."""
        data = self._data
        for key, value in entries.items():
            data[key] = value
            data.move_to_end(key)
        if self._capacity is not None:
            bound = max(self._capacity, len(entries))  # the newest len(entries) are the ones just put
            while len(data) > bound:
                data.popitem(last=False)

    def pop(self, key: K) -> None:
        """Drop ``key`` if held."""
        self._data.pop(key, None)

    def keys(self) -> list[K]:
        """The keys, least recently used first (a copy)."""
        return list(self._data)
