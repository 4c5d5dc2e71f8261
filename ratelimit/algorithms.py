"""The four algorithms, as one rule's outcome from what storage counted.

- ``sliding-log`` (default): per identifier the timestamps of its hits. Exact;
  memory O(N) per identifier.
- ``sliding-window`` (Kong, nginx limiters, Cloudflare): per identifier and window size, the
  count of the current window and of the previous one. The rate is
  ``current + previous * (size - elapsed) / size``, with windows starting at multiples of
  their size. O(1) memory per identifier; an approximation of the log.
- ``fixed-window``: the same with the previous window's weight 0.
- ``gcra`` (the generic cell rate algorithm: a token bucket kept as one number): per
  identifier and rule the theoretical arrival time. ``N/span`` sustains N per span with
  bursts of up to N (or the rule's ``burst``) at once. O(1) memory per identifier; exact.

A call is admitted by a rule when what is already counted plus the call's cost stays within
the rule's count. Storage scripts compute the same "limited" flag with the same floating
point operations in the same order, so every backend decides alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ratelimit.rules import Rule

SLIDING_LOG = "sliding-log"
SLIDING_WINDOW = "sliding-window"
FIXED_WINDOW = "fixed-window"
GCRA = "gcra"
ALGORITHMS = (SLIDING_LOG, SLIDING_WINDOW, FIXED_WINDOW, GCRA)

US_PER_MS = 1000

# One rule's outcome: limited, retry after (us), what is left before this call (None: no
# limit applies), binding leaf index (None: no rule applies).
Outcome = tuple[bool, int, float | None, int | None]


def window(hits: Sequence[int], count: int, threshold_us: int) -> tuple[int, int]:
    """Sliding log: hits newer than ``threshold_us`` among the newest ``count`` of a log
    (newest first), and the oldest of them (0 when there are none). When all ``count`` are
    newer, that is the count-th newest timestamp, which says when the call would pass.

    A binary search: the same one the Lua script runs with LINDEX. The oldest hit inside
    is always one the search has read, so it costs nothing more.
    """
    n = min(len(hits), count)
    if n == 0:
        return 0, 0
    last = hits[n - 1]
    if last > threshold_us:
        return n, last
    lo, hi, oldest = 0, n - 1, 0
    while lo < hi:
        mid = (lo + hi) // 2
        stamp = hits[mid]
        if stamp <= threshold_us:
            hi = mid
        else:
            lo, oldest = mid + 1, stamp
    return lo, oldest


def log_outcome(
    rule: Rule, leaf: int, cost: float, counted: tuple[float, float], now_us: int
) -> Outcome:
    """Sliding log: ``counted`` is (hits among the newest ``count - cost + 1``, the oldest
    of them: when they are all inside the window, the call passes once it leaves)."""
    hits, nth_newest_us = counted
    if hits >= rule.count - cost + 1:
        return (True, int(nth_newest_us) + rule.span_ms * US_PER_MS - now_us, 0, leaf)
    return (False, 0, rule.count - hits, leaf)


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
    rule: Rule,
    leaf: int,
    cost: float,
    counted: tuple[float, float],
    now_us: int,
    sliding: bool,
) -> Outcome:
    """Sliding or fixed window: ``counted`` is (current window's count, previous one's)."""
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


Arrival = tuple[int, int]
"""A GCRA arrival time, exactly: whole microseconds and a remainder in ``1/count`` of a
microsecond (``0 <= remainder < count``); ``(0, 0)`` when nothing is stored. Exact, where a
float at today's 1.7e15 microseconds rounds to a quarter of one and would refuse the third
call of a ``3/s`` burst."""


def gcra_burst(rule: Rule) -> int:
    """How many hits a GCRA rule admits at once: its ``burst``, else its ``count``."""
    return rule.count if rule.burst is None else rule.burst


def gcra_outcome(rule: Rule, leaf: int, cost: float, tat: Arrival, now_us: int) -> Outcome:
    """GCRA, a token bucket kept as one arrival time per identifier and rule. ``count/span``
    emits one hit every ``span / count``; up to the rule's burst may come at once. A call
    of ``cost`` is admitted when the arrival time it pushes forward stays within ``burst``
    intervals of now; the caller then stores :func:`gcra_next`.

    Python's integers keep every quantity exact, in ``1/count`` of a microsecond;
    ``gcra.lua`` reaches the same answers with (microseconds, remainder) pairs.
    """
    count, span = rule.count, rule.span_ms * US_PER_MS
    now = now_us * count
    start = max(tat[0] * count + tat[1], now)
    ahead = start + int(cost) * span - now  # how far the arrival time would run ahead
    tolerance = gcra_burst(rule) * span
    if ahead > tolerance:
        return (True, -((tolerance - ahead) // count), 0, leaf)  # ceil: whole microseconds
    return (False, 0, (tolerance - (start - now)) // span, leaf)


def gcra_next(rule: Rule, cost: float, tat: Arrival, now_us: int) -> Arrival:
    """The arrival time to store after admitting a call of ``cost``: pushed ``cost``
    intervals on, but never more than the burst's tolerance ahead of now (an ``And`` tree
    admitting through another branch leaves this rule's bucket empty, not in debt)."""
    count, span = rule.count, rule.span_ms * US_PER_MS
    now = now_us * count
    pushed = max(tat[0] * count + tat[1], now) + int(cost) * span
    us, remainder = divmod(min(pushed, now + gcra_burst(rule) * span), count)
    return us, remainder


def gcra_reset(rule: Rule, tat: Arrival, now_us: int, remaining: int) -> float:
    """Microseconds until a GCRA rule with arrival time ``tat`` has ``remaining + 1`` hits
    to give (its bucket refills one hit per interval)."""
    count, span = rule.count, rule.span_ms * US_PER_MS
    now = now_us * count
    room = gcra_burst(rule) * span - (max(tat[0] * count + tat[1], now) - now)
    return ((remaining + 1) * span - room) / count
