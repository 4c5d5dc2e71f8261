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

The stores' twins of each algorithm (its Lua, its SQL, the memory store's and the command
engine's code) are listed by folder: docs/architecture.md, "Stores and their features", read
from the folders by ``tests/test_layers.py``, with the tests that keep each row in agreement.
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
