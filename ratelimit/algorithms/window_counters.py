"""``sliding-window`` (Kong, nginx limiters, Cloudflare) and ``fixed-window``: per identifier
and window size, the count of the current window and of the previous one.

The sliding rate is ``current + previous * (size - elapsed) / size``, with windows starting
at multiples of their size: O(1) memory per identifier, an approximation of the log. The
fixed window gives the previous window a weight of 0.

Stores: ``backends/memory/backend.py`` and ``ratelimit/backends/windows.py`` (the slot layout),
``backends/redis/lua/window_counters.lua`` (with ``_windows.lua``) and the command engine,
Postgres's ``ratelimit_decide``, and the synced counters of ``sync_rate``.
"""

from __future__ import annotations

import math

from ratelimit.algorithms.base import US_PER_MS, Algorithm, Counted, Outcome
from ratelimit.rules.tree import Rule

SLIDING_WINDOW = "sliding-window"
FIXED_WINDOW = "fixed-window"


def window_index(now_us: int, size_us: int) -> int:
    """Which window of ``size_us`` holds ``now_us``: windows start at multiples of size."""
    return now_us // size_us


def not_before(now_us: int, newest_index: int, size_us: int) -> int:
    """The time a window-counter decision is made at: ``now_us``, or the start of the newest
    window the store holds when that is later. A clock that stepped back reads as one that
    stopped at that window's start, where the previous window still weighs fully, so it
    never admits more than the counts allow."""
    return max(now_us, newest_index * size_us)


def counter_rate(
    current: float, previous: float, now_us: int, size_us: int, sliding: bool
) -> float:
    """The rate a counter rule sees now (Lua computes it with the same operations)."""
    if not sliding:
        return current
    elapsed = now_us - window_index(now_us, size_us) * size_us
    return current + previous * (size_us - elapsed) / size_us


def counter_outcome(
    rule: Rule, leaf: int, cost: float, counted: Counted, now_us: int, sliding: bool
) -> Outcome:
    """``counted`` is (current window's count, previous one's)."""
    current, previous = counted
    size = rule.span_ms * US_PER_MS
    elapsed = now_us - now_us // size * size
    # counter_rate(), inlined on this hot path: the same operations in the same order
    rate = current + previous * (size - elapsed) / size if sliding else current
    if rate + cost <= rule.count:
        return (False, 0, rule.count - rate, leaf)
    # what may be counted for the call to pass
    wait = counter_wait(current, previous, elapsed, size, rule.count - cost, sliding)
    return (True, math.ceil(wait), 0, leaf)


def counter_wait(
    current: float, previous: float, elapsed: int, size: int, room: float, sliding: bool
) -> float:
    """Microseconds until a window counter's rate, above ``room`` now, falls to ``room``:
    ``elapsed`` into the current window of ``size``, with nothing more counted meanwhile."""
    if current <= room and sliding:
        # within this window, once the previous window's weight has fallen far enough
        return size - size * (room - current) / previous - elapsed
    if sliding:
        # in the next window, once this window (then the previous one) weighs little enough
        return size - elapsed + size * (1 - room / current)
    return size - elapsed


class WindowCounters(Algorithm):
    """The window counters: ``sliding`` weighs the previous window in, else it weighs 0.
    Storage counts, per leaf, (current window's count, previous one's)."""

    __slots__ = ("sliding",)
    stores = "window counters"
    windowed = True
    whole_costs = False
    syncable = True

    def __init__(self, name: str, sliding: bool) -> None:
        super().__init__(name)
        self.sliding = sliding

    def outcome(self, rule: Rule, leaf: int, cost: float, counted: Counted, now_us: int) -> Outcome:
        return counter_outcome(rule, leaf, cost, counted, now_us, self.sliding)

    def reset_us(
        self, rule: Rule, counted: Counted, now_us: int, used: float, remaining: int
    ) -> float:
        span_us = rule.span_ms * US_PER_MS
        if remaining >= rule.count:  # nothing counted: the whole span ahead
            return span_us
        current, previous = counted  # until one more hit fits
        elapsed = now_us - now_us // span_us * span_us
        room = rule.count - remaining - 1
        after = counter_rate(current + used, previous, now_us, span_us, self.sliding)
        if after <= room:  # float rounding left `remaining` one short: it is there now
            return 0.0
        return counter_wait(current + used, previous, elapsed, span_us, room, self.sliding)
