"""``gcra`` (the generic cell rate algorithm: a token bucket kept as one number): per
identifier and rule the theoretical arrival time. ``N/span`` sustains N per span with bursts
of up to N (or the rule's ``burst``) at once. O(1) memory per identifier; exact.

Stores: ``backends/memory/backend.py``, ``backends/redis/lua/gcra.lua`` (and ``gcra_one.lua``, its
one-rule branch on its own: ``tests/test_gcra_one.py``) and the command engine (one string
per identifier and span, see ``backends/layout.py``, holding the count it was stored under:
a rule of another count on the same span, an override, carries it on,
:func:`gcra_rescaled`). Postgres does not keep arrival times.
"""

from __future__ import annotations

import math

from ratelimit.algorithms.base import US_PER_MS, Algorithm, Counted, Outcome
from ratelimit.errors import ConfigurationError
from ratelimit.rules.tree import MAX_SPAN_MS, Rule

GCRA = "gcra"

EXACT = 2**53
"""The scripts' numbers are doubles: whole numbers up to here are exact."""

Arrival = tuple[int, int]
"""A GCRA arrival time, exactly: whole microseconds and a remainder in ``1/count`` of a
microsecond (``0 <= remainder < count``); ``(0, 0)`` when nothing is stored. Exact, where a
float at today's 1.7e15 microseconds rounds to a quarter of one and would refuse the third
call of a ``3/s`` burst."""


def gcra_burst(rule: Rule) -> int:
    """How many hits a GCRA rule admits at once: its ``burst``, else its ``count``."""
    return rule.count if rule.burst is None else rule.burst


def gcra_outcome(rule: Rule, leaf: int, cost: float, tat: Arrival, now_us: int) -> Outcome:
    """A call of ``cost`` is admitted when the arrival time it pushes forward stays within
    ``burst`` intervals of now; the caller then stores :func:`gcra_next`. ``count/span``
    emits one hit every ``span / count``.

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
    admitting through another branch leaves this rule's bucket empty, not in debt), and
    never back (an excess a settle recorded past the tolerance stays)."""
    count, span = rule.count, rule.span_ms * US_PER_MS
    now = now_us * count
    stored = tat[0] * count + tat[1]
    pushed = min(max(stored, now) + int(cost) * span, now + gcra_burst(rule) * span)
    us, remainder = divmod(max(pushed, stored), count)  # a settle's debt stays: never back
    return us, remainder


def gcra_moved(rule: Rule, cost: float, tat: Arrival, now_us: int) -> int:
    """Whole hits by which admitting a call of ``cost`` at ``now_us`` moved the arrival time
    (less than ``cost`` when the burst's tolerance capped it): what a refund may take back."""
    count, span = rule.count, rule.span_ms * US_PER_MS
    now = now_us * count
    start = max(tat[0] * count + tat[1], now)
    pushed = min(start + int(cost) * span, now + gcra_burst(rule) * span)
    return max(pushed - start, 0) // span


MOST_AHEAD_US = MAX_SPAN_MS * US_PER_MS
"""Most an arrival time runs ahead of now: ten years."""


def gcra_rescaled(rule: Rule, tat: Arrival, stored_count: int, now_us: int) -> Arrival:
    """An arrival time stored under a rule of the same span and another count (an override
    changed the rate) as ``rule`` reads it: the hits it holds ahead of now carry on, each
    now one interval of ``rule`` (``span / count``), so raising ``2/h`` to ``5/h`` after 2
    calls leaves 3, and lowering ``5/h`` to ``2/h`` after 5 leaves none (until 3 have
    drained at the new rate). At most ten years ahead. In ``1/count`` of a microsecond
    the time ahead is the same number under every count (hits times the span); past
    2**53 it is computed in doubles, as ``gcra.lua`` does, to whole microseconds."""
    return rescaled_to(rule.count, tat, stored_count, now_us)


def rescaled_to(count: int, tat: Arrival, stored_count: int, now_us: int) -> Arrival:
    """:func:`gcra_rescaled` for a rule of ``count``."""
    us, remainder = tat
    if stored_count == count or us < now_us or (us == now_us and remainder == 0):
        return tat if stored_count == count else (0, 0)
    ahead = (us - now_us) * stored_count + remainder
    if ahead < EXACT:
        ahead_us, ahead_remainder = divmod(ahead, count)
    else:
        ahead_us, ahead_remainder = (
            math.floor((float(us - now_us) * stored_count + remainder) / count),
            0,
        )
    if ahead_us >= MOST_AHEAD_US:
        return now_us + MOST_AHEAD_US, 0
    return now_us + ahead_us, ahead_remainder


def gcra_shared_next(
    shapes: tuple[Rule, ...], cost: float, tat: Arrival, stored_count: int, now_us: int
) -> Arrival:
    """The arrival time to store, under ``shapes[0]``'s count (the smallest), after
    admitting a call of ``cost`` on an arrival time that rules of several shapes of one
    span read (each rescaled to its own count, :func:`gcra_rescaled`): each pushes it on
    by :func:`gcra_next`, and the one holding the most hits is kept, never less than
    what was stored."""
    count = shapes[0].count
    kept = rescaled_to(count, tat, stored_count, now_us)
    for rule in shapes:
        own = rescaled_to(rule.count, tat, stored_count, now_us)
        pushed = gcra_next(rule, cost, own, now_us)
        kept = max(kept, rescaled_to(count, pushed, rule.count, now_us))
    return kept


EXCESS_BURSTS = 1000
"""Most a settle's excess pushes a GCRA arrival time on: this many bursts (and never more
than ten years ahead of now). Past it, later calls wait no longer."""


def gcra_settled(
    rule: Rule,
    tat: Arrival,
    delta: int,
    now_us: int,
    held: Arrival = (0, 0),
    stored_count: int | None = None,
) -> Arrival:
    """The arrival time after a settle of ``delta`` hits at ``now_us``: an excess pushes it
    on from now, past the burst's tolerance (the work was done), by at most
    :data:`EXCESS_BURSTS` bursts and to at most ten years ahead; a refund pulls it back by
    ``-delta`` intervals, but never by more than the reservation still holds (``held``,
    the arrival time it pushed the rule's to, less now: what has drained since never
    comes back) and never before now. ``gcra.lua``'s settle computes it a burst at a time,
    each step exact in doubles.

    ``tat`` is as stored, under ``stored_count`` (``rule``'s when ``None``), and so is the
    result: an override may have changed the rate since the reservation, and the bucket
    keeps draining at the rate it holds now. The hits settled, and those ``held`` (under
    ``rule``'s count) still holds, count as hits of ``stored_count`` (as a rescale carries
    them on, :func:`gcra_rescaled`)."""
    count, span = rule.count, rule.span_ms * US_PER_MS
    if stored_count is not None and stored_count != count:
        held = rescaled_to(stored_count, held, count, now_us)
        count = stored_count
    now = now_us * count
    stored = tat[0] * count + tat[1]
    if delta > 0:
        hits = min(delta, EXCESS_BURSTS * gcra_burst(rule))
        moved = min(max(stored, now) + hits * span, now + MAX_SPAN_MS * US_PER_MS * count)
    else:
        still = held[0] * count + held[1] - now  # what the reservation holds yet
        if stored <= now or still <= 0:
            return tat  # nothing left to take back: the bucket is full, or it drained
        moved = max(stored + delta * span, stored - still, now)
    us, remainder = divmod(moved, count)
    return us, remainder


def gcra_reset(rule: Rule, tat: Arrival, now_us: int, remaining: int) -> float:
    """Microseconds until a GCRA rule with arrival time ``tat`` has ``remaining + 1`` hits
    to give (its bucket refills one hit per interval)."""
    count, span = rule.count, rule.span_ms * US_PER_MS
    now = now_us * count
    room = gcra_burst(rule) * span - (max(tat[0] * count + tat[1], now) - now)
    return ((remaining + 1) * span - room) / count


def check_gcra_rule(rule: Rule, cost: float) -> None:
    """A GCRA rule its scripts decide exactly, that can admit a call of ``cost``."""
    burst = gcra_burst(rule)
    if cost > burst:
        raise ConfigurationError(
            f"cost {cost} is above the burst of rule '{rule}' ({burst} at once): such a call "
            "could never be admitted"
        )
    if burst * rule.span_ms > MAX_SPAN_MS * rule.count:
        raise ConfigurationError(
            f"rule '{rule}': a burst of {burst} takes longer than 3650 days to refill at "
            f"{rule.count} per span; use a smaller burst"
        )
    if burst * rule.count >= EXACT:
        raise ConfigurationError(
            f"rule '{rule}': GCRA keeps time in 1/count of a microsecond, and burst times "
            f"count ({burst} x {rule.count}) must stay under 2**53 to stay exact"
        )


class Gcra(Algorithm):
    """GCRA. Storage counts, per leaf, its rule's arrival time (:data:`Arrival`)."""

    __slots__ = ()
    stores = "a GCRA arrival time"
    bursts = True
    leases = False  # a slice counted when taken, its calls running up to a hold later,
    # would let the bucket refill for a while it was in use: per call (see leases)

    def outcome(self, rule: Rule, leaf: int, cost: float, counted: Counted, now_us: int) -> Outcome:
        tat_us, remainder = counted
        return gcra_outcome(rule, leaf, cost, (int(tat_us), int(remainder)), now_us)

    def reset_us(
        self, rule: Rule, counted: Counted, now_us: int, used: float, remaining: int
    ) -> float:
        # until the bucket holds one more, or, full, the span
        if remaining >= gcra_burst(rule):
            return rule.span_ms * US_PER_MS
        tat = (int(counted[0]), int(counted[1]))
        if used:
            tat = gcra_next(rule, used, tat, now_us)
        return gcra_reset(rule, tat, now_us, remaining)

    def check_rule(self, rule: Rule, cost: float) -> None:
        check_gcra_rule(rule, cost)  # the burst bounds the cost, not the count

    def refundable(
        self, rule: Rule, reserved: float, counted: Counted, at_us: int, refund: float
    ) -> float:
        tat = (int(counted[0]), int(counted[1]))
        return min(refund, gcra_moved(rule, reserved, tat, at_us))

    def held_until(self, rule: Rule, reserved: float, counted: Counted, at_us: int) -> Counted:
        tat = (int(counted[0]), int(counted[1]))
        return gcra_next(rule, reserved, tat, at_us)
