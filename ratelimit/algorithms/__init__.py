"""The algorithms, one object each (:class:`~ratelimit.algorithms.base.Algorithm`), and the
math of one rule's outcome from what storage counted.

- ``sliding-log`` (default, :mod:`~ratelimit.algorithms.sliding_log`): per identifier the
  timestamps of its hits. Exact; memory O(N) per identifier.
- ``sliding-window`` and ``fixed-window`` (:mod:`~ratelimit.algorithms.window_counters`):
  per identifier and window size, the counts of the current and previous windows. O(1)
  memory per identifier; the sliding one approximates the log.
- ``gcra`` (:mod:`~ratelimit.algorithms.gcra`): a token bucket kept as one arrival time per
  identifier and rule. O(1) memory per identifier; exact.

A call is admitted by a rule when what is already counted plus the call's cost stays within
the rule's count. Storage scripts compute the same "limited" flag with the same floating
point operations in the same order, so every backend decides alike
(``tests/test_differential.py``).

A new algorithm is one module here with an :class:`Algorithm` subclass, one line in
:data:`BY_NAME`, its Lua and SQL where stores keep it, and a line in the table of each
backend that supports it (see the docs, "Architecture").

Twins: code written more than once, in other languages or for other stores, that must agree.
Change one, change them all; the named tests hold each set together.

1. The And/Or tree (binding rule, retry_after, remaining): ``ratelimit/core/evaluation.py``
   (``evaluate``), ``backends/redis/lua/_tree.lua``, and ``ratelimit_decide`` in
   ``backends/postgres/schema.sql``. Held by ``tests/test_differential.py`` (every engine,
   hypothesis trees), ``tests/test_postgres.py::test_postgres_decides_as_memory_does``, and
   the backends' own check that the store's verdict equals the evaluator's.
2. One rule's outcome per algorithm: this package (Python), ``sliding_log.lua``,
   ``window_counters.lua``, ``gcra.lua`` and the SQL window arithmetic. Held by the same
   tests, and for GCRA by ``tests/test_gcra.py`` (an exact-fraction reference).
3. Window-counter reads and writes (two slots per size, the clock that steps back): the
   memory backend (``backends/memory/backend.py`` with ``backends/windows.py``), the
   command engine (``backends/redis/command/decisions.py``), ``window_counters.lua`` with
   ``_windows.lua``, ``backends/postgres/schema.sql``, and the counter API and ``sync_rate``
   (``counter_update.lua``,
   ``counter_sync.lua``, ``backends/synced.py``). Held by ``tests/test_differential.py``
   (stores alike), ``tests/test_windows.py`` (the fields ``backends/redis/keys.py`` names),
   ``tests/test_counter_api.py`` and ``tests/test_sync.py``.
4. Sliding-log and GCRA storage: the memory backend, the command engine and their scripts.
   Held by ``tests/test_differential.py`` (stores alike).
5. Concurrency slots: ``slots.lua``, ``backends/redis/command/slots.py`` and the memory
   backend. Held by ``tests/test_concurrency.py`` (every backend kind).
6. Settles (``ratelimit/core/settling.py``): ``settle_log`` and ``gcra_settled`` here and
   ``ratelimit/backends/windows.py``'s ``settle``, which the memory backend and the command engine
   (``backends/redis/command/settles.py``) run; ``settle_log.lua`` (with ``_log.lua``),
   ``settle_windows.lua``, ``settle_gcra.lua``; ``ratelimit_settle`` in
   ``backends/postgres/schema.sql``; ``backends/synced.py``. Held by
   ``tests/test_settle_reference.py`` (every engine against an exact reference),
   ``tests/test_settle_stores.py::test_postgres_settles_as_memory_does`` and the four
   processes of ``tests/test_settle_stores.py``.
"""

from __future__ import annotations

from ratelimit.algorithms.base import US_PER_MS, Algorithm, Counted, Outcome
from ratelimit.algorithms.gcra import (
    GCRA,
    Arrival,
    Gcra,
    gcra_burst,
    gcra_moved,
    gcra_next,
    gcra_outcome,
    gcra_rescaled,
    gcra_reset,
    gcra_settled,
    gcra_shared_next,
)
from ratelimit.algorithms.sliding_log import (
    MAX_LOG_COST,
    MAX_LOG_COUNT,
    SLIDING_LOG,
    SlidingLog,
    log_outcome,
    settle_log,
    window,
)
from ratelimit.algorithms.window_counters import (
    FIXED_WINDOW,
    SLIDING_WINDOW,
    WindowCounters,
    counter_outcome,
    counter_rate,
    counter_wait,
    not_before,
    window_index,
)
from ratelimit.errors import ConfigurationError

BY_NAME: dict[str, Algorithm] = {
    SLIDING_LOG: SlidingLog(SLIDING_LOG),
    SLIDING_WINDOW: WindowCounters(SLIDING_WINDOW, sliding=True),
    FIXED_WINDOW: WindowCounters(FIXED_WINDOW, sliding=False),
    GCRA: Gcra(GCRA),
}
"""Every algorithm, by the name ``Settings.algorithm`` takes."""

ALGORITHMS = tuple(BY_NAME)
"""The names, default first."""


def named(name: object) -> Algorithm:
    """The algorithm called ``name`` (an :class:`Algorithm` is returned as it is), or
    ``ConfigurationError`` naming the ones there are."""
    if isinstance(name, Algorithm):
        return name
    algorithm = BY_NAME.get(name) if isinstance(name, str) else None
    if algorithm is None:
        raise ConfigurationError(f"unknown algorithm {name!r}: use one of {', '.join(ALGORITHMS)}")
    return algorithm


__all__ = [
    "ALGORITHMS",
    "BY_NAME",
    "FIXED_WINDOW",
    "GCRA",
    "MAX_LOG_COST",
    "MAX_LOG_COUNT",
    "SLIDING_LOG",
    "SLIDING_WINDOW",
    "US_PER_MS",
    "Algorithm",
    "Arrival",
    "Counted",
    "Gcra",
    "Outcome",
    "SlidingLog",
    "WindowCounters",
    "counter_outcome",
    "counter_rate",
    "counter_wait",
    "gcra_burst",
    "gcra_moved",
    "gcra_next",
    "gcra_outcome",
    "gcra_rescaled",
    "gcra_reset",
    "gcra_settled",
    "gcra_shared_next",
    "log_outcome",
    "named",
    "not_before",
    "settle_log",
    "window",
    "window_index",
]
