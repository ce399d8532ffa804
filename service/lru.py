"""A bounded, thread-safe least-recently-used map: the caches of results that are a pure
function of their key (validated request bodies, compose reports)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["LRU"]

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``entries`` values; the least recently used goes first. Counts hits and misses."""

    def __init__(self, entries: int) -> None:
        self.entries = entries
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
