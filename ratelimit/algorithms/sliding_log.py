"""``sliding-log`` (the default): per identifier the timestamps of its hits, newest first.
Exact; memory O(N) per identifier.

Stores: ``backends/memory/backend.py`` (a list), ``backends/redis/lua/sliding_log.lua`` and the
command engine (a Redis list). Postgres does not keep logs.
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence

from ratelimit.algorithms.base import US_PER_MS, Algorithm, Counted, Outcome
from ratelimit.errors import ConfigurationError
from ratelimit.rules.tree import Rule

SLIDING_LOG = "sliding-log"

MAX_LOG_COUNT = 100_000
"""Most hits a sliding-log rule may count: its list holds one timestamp per hit."""
MAX_LOG_COST = 1_000
"""Most hits one call may record on a sliding log: each is a timestamp written to Redis.
Both bounds keep one decision under about a millisecond of Redis time."""


def window(hits: Sequence[int], count: int, threshold_us: int) -> tuple[int, int]:
    """Hits newer than ``threshold_us`` among the newest ``count`` of a log (newest first),
    and the oldest of them (0 when there are none). When all ``count`` are newer, that is
    the count-th newest timestamp, which says when the call would pass.

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


def settle_log(
    hits: MutableSequence[int], delta: int, at_us: int, now_us: int, keep: int, span_us: int
) -> None:
    """Settle ``delta`` hits on a log (newest first), in place: a refund takes back up to
    ``-delta`` of the hits recorded at ``at_us`` (those still held); an excess records
    ``delta`` hits now (at most ``keep`` of them: more change no decision), past the limit.
    The log then keeps its newest ``keep`` hits, and every hit within ``span_us`` of now:
    an excess may leave more than ``keep`` there, and a later refund must not bring an
    older hit back into view that was cut."""
    if delta < 0:
        for _ in range(-delta):
            try:
                hits.remove(at_us)
            except ValueError:
                break
        return
    if delta == 0:
        return
    stamp = max(now_us, hits[0]) if hits else now_us
    for _ in range(min(delta, keep)):
        hits.insert(0, stamp)
    inside, _ = window(hits, len(hits), now_us - span_us)
    while len(hits) > max(keep, inside):
        hits.pop()


def log_outcome(rule: Rule, leaf: int, cost: float, counted: Counted, now_us: int) -> Outcome:
    """``counted`` is (hits among the newest ``count - cost + 1``, the oldest of them: when
    they are all inside the window, the call passes once it leaves)."""
    hits, nth_newest_us = counted
    if hits >= rule.count - cost + 1:
        return (True, int(nth_newest_us) + rule.span_ms * US_PER_MS - now_us, 0, leaf)
    return (False, 0, rule.count - hits, leaf)


class SlidingLog(Algorithm):
    """The sliding log. Storage counts, per leaf, (hits among the newest
    :meth:`~ratelimit.core.plan.Plan.depth`, the oldest of them)."""

    __slots__ = ()
    stores = "a sliding log"
    stamps = True

    def outcome(self, rule: Rule, leaf: int, cost: float, counted: Counted, now_us: int) -> Outcome:
        return log_outcome(rule, leaf, cost, counted, now_us)

    def reset_us(
        self, rule: Rule, counted: Counted, now_us: int, used: float, remaining: int
    ) -> float:
        span_us = rule.span_ms * US_PER_MS
        if remaining >= rule.count:  # nothing counted: the whole span ahead
            return span_us
        hits, oldest = counted  # until the oldest hit inside leaves
        return (oldest if hits else now_us) + span_us - now_us

    def check_rule(self, rule: Rule, cost: float) -> None:
        super().check_rule(rule, cost)
        if rule.count > MAX_LOG_COUNT:
            raise ConfigurationError(
                f"rule '{rule}' counts {rule.count} hits: the sliding log keeps a timestamp per "
                f"hit and takes rules of at most {MAX_LOG_COUNT} (so that no decision holds "
                "Redis up for more than about a millisecond); use algorithm='sliding-window' "
                "or 'fixed-window' for larger counts"
            )

    def check_cost(self, cost: float) -> None:
        if cost > MAX_LOG_COST:
            raise ConfigurationError(
                f"cost {cost} is too large for the sliding log, which writes a timestamp per "
                f"hit: it takes a cost of at most {MAX_LOG_COST} per call (so that no decision "
                "holds Redis up for more than about a millisecond); use "
                "algorithm='sliding-window' or 'fixed-window' for larger costs"
            )
