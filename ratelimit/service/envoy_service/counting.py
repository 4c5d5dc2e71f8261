"""envoyproxy/ratelimit's fixed windows, counted where and as it counts them.

A limit of N per unit counts on one key per window, ``<prefix><domain>_<key>_<value>_..._
<window start>`` (``GenerateCacheKey``: the window starts at the unit's multiple of Unix
seconds, a month being 30 days and a year 365; a ``share_threshold`` entry writes its
wildcard instead of its value), by ``INCRBY`` of the descriptor's hits and ``EXPIRE`` of the
unit (plus up to ``EXPIRATION_JITTER_MAX_SECONDS`` of jitter). Refused hits are counted
too. Being its keys on its store, a fleet can move from its service to this one (or back)
while both run, sharing the counters.

- :class:`~ratelimit.backends.redis.envoy.windows.RedisWindows`: on its Redis, on its keys;
- :class:`MemoryCounts`: the same in this process (``BACKEND_TYPE=memory``: one process,
  for trying it out);
- :class:`OverLimitCache`: ``LOCAL_CACHE_SIZE_IN_BYTES``, the keys known to be over.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

from ratelimit.backends.redis.envoy.windows import Count


class Store(Protocol):
    """The store the answers count on, as the service sees it: asked whether it answers,
    and closed."""

    async def ping(self) -> None:
        """Return once the store answers; ``BackendError`` if it does not."""
        ...

    async def aclose(self) -> None: ...


class Counts(Store, Protocol):
    """Where the windows are counted."""

    async def add(self, counts: Sequence[Count]) -> list[int]:
        """Add each count's hits to its key; each key's value after."""
        ...

    async def read(self, counts: Sequence[Count]) -> list[int]:
        """Each key's value now (0: none), adding nothing."""
        ...

    async def ping(self) -> None:
        """Return once the store answers; ``BackendError`` if it does not."""
        ...

    async def aclose(self) -> None: ...


class MemoryCounts:
    """:class:`Counts` in this process: each key with its value and when it expires."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._values: dict[str, tuple[int, float]] = {}
        self._sweep_at = 0.0

    async def add(self, counts: Sequence[Count]) -> list[int]:
        now = self._clock()
        self._sweep(now)
        out = []
        for count in counts:
            value, ends = self._values.get(count.key, (0, 0.0))
            value = (value if ends > now else 0) + count.hits
            self._values[count.key] = (value, now + count.seconds)
            out.append(value)
        return out

    async def read(self, counts: Sequence[Count]) -> list[int]:
        now = self._clock()
        out = []
        for count in counts:
            value, ends = self._values.get(count.key, (0, 0.0))
            out.append(value if ends > now else 0)
        return out

    def _sweep(self, now: float) -> None:
        """Forget the keys that expired, once a second at most."""
        if now < self._sweep_at:
            return
        self._sweep_at = now + 1.0
        for key in [k for k, (_, ends) in self._values.items() if ends <= now]:
            del self._values[key]

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        self._values.clear()


ENTRY_BYTES = 64
"""What a key held in the local cache is taken to cost besides its own bytes (the cache
Go uses, freecache, keeps a header and its index per entry)."""


class OverLimitCache:
    """``LOCAL_CACHE_SIZE_IN_BYTES``: the keys found over their limit, each remembered for
    its unit from when it was found (its window ends sooner: the key of the next window
    differs), so that a request on them is refused without a round trip and counts nothing.
    At most ``size`` bytes; the oldest go first."""

    def __init__(self, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._size = size
        self._used = 0
        self._clock = clock
        self._keys: OrderedDict[str, float] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        ends = self._keys.get(key)
        if ends is None:
            return False
        if ends > self._clock():
            return True
        self._drop(key)
        return False

    def add(self, key: str, seconds: int) -> None:
        if key in self._keys:
            self._drop(key)
        self._keys[key] = self._clock() + seconds
        self._used += len(key) + ENTRY_BYTES
        while self._used > self._size and self._keys:
            self._drop(next(iter(self._keys)))

    def _drop(self, key: str) -> None:
        del self._keys[key]
        self._used -= len(key) + ENTRY_BYTES
