"""What a plan reads and writes in a store, named the same way by every store that keeps it:
GCRA arrival-time fields (one per identifier and span), window-counter names in this
process, the span and depth each identifier's stored hits must cover, and how long a
reset's mark is kept. (How a store names an identifier is
:mod:`~ratelimit.backends.naming`; the window slots' layout is :mod:`ratelimit.backends.windows`.)
"""

from __future__ import annotations

import functools

from ratelimit.algorithms import counter_rate, gcra_burst
from ratelimit.core.plan import PLANS, CompiledTree, CounterUpdate, Identifier, Plan
from ratelimit.rules.tree import Rule


@functools.lru_cache(maxsize=4096)
def gcra_field(rule: Rule) -> str:
    """The name of one rule's arrival time among its identifier's: its span in ms, so that
    every rule of one span on one identifier reads it whatever its count, burst or place in
    the tree, and an override changing the rate carries the bucket on (the stored count
    rescales it, :func:`~ratelimit.algorithms.gcra_rescaled`)."""
    return str(rule.span_ms)


ArrivalTime = tuple[int, Rule, str]
"""One arrival time a GCRA plan reads: (identifier index, the rule of its span it is stored
under: the smallest count, then the smallest burst; its field)."""


def _shape(rule: Rule) -> tuple[int, int]:
    return rule.count, gcra_burst(rule)


@functools.lru_cache(maxsize=4096)
def arrival_slots(
    compiled: CompiledTree, leaf_identifiers: tuple[int, ...]
) -> tuple[tuple[ArrivalTime, ...], tuple[int, ...]]:
    """GCRA: the arrival times one plan reads (:data:`ArrivalTime`), in order; and per leaf
    the position of its own among them (``-1`` when its selector did not resolve). Every
    leaf of one span on one identifier reads the same arrival time (:func:`gcra_field`),
    rescaled to its own count, so that no order or shape of the rules of a span forgets
    what was used; it is stored under the smallest count of them, which drains slowest
    (:func:`arrival_shapes`)."""
    positions: dict[tuple[int, int], int] = {}
    times: list[ArrivalTime] = []
    slots = []
    for rule, i in zip(compiled.rules, leaf_identifiers, strict=True):
        if i < 0:
            slots.append(-1)
            continue
        position = positions.setdefault((i, rule.span_ms), len(times))
        if position == len(times):
            times.append((i, rule, gcra_field(rule)))
        elif _shape(rule) < _shape(times[position][1]):
            times[position] = (i, rule, times[position][2])
        slots.append(position)
    return tuple(times), tuple(slots)


@functools.lru_cache(maxsize=4096)
def arrival_shapes(
    compiled: CompiledTree, leaf_identifiers: tuple[int, ...]
) -> tuple[tuple[Rule, ...], ...]:
    """GCRA: per arrival time of :func:`arrival_slots`, the shapes (count, burst) of the
    rules that read it, one rule of each, the one it is stored under first (for
    :func:`~ratelimit.algorithms.gcra_shared_next`)."""
    times, slots = arrival_slots(compiled, leaf_identifiers)
    shapes: list[dict[tuple[int, int], Rule]] = [{_shape(rule): rule} for _, rule, _ in times]
    for rule, position in zip(compiled.rules, slots, strict=True):
        if position >= 0:
            shapes[position].setdefault(_shape(rule), rule)
    return tuple(tuple(of.values()) for of in shapes)


def window_name(identifier: Identifier, size_us: int) -> str:
    """The name of one (identifier, window size) in stores of this process."""
    return f"{identifier!r}/{size_us}"


@functools.lru_cache(maxsize=PLANS)
def window_names(plan: Plan) -> tuple[tuple[str, ...], ...]:
    """Window counters: a :func:`window_name` per (identifier, size) in ``plan.windows``,
    kept per plan (plans hash by identity and are shared), so its text and hash are
    computed once."""
    return tuple(
        tuple(window_name(identifier, size) for size in sizes)
        for identifier, sizes in zip(plan.identifiers, plan.windows, strict=True)
    )


def limits_per_identifier(plan: Plan) -> list[tuple[int, int]]:
    """Per identifier: (largest count, largest span in ms) of the rules counting on it."""
    limits = [(0, 0)] * len(plan.identifiers)
    for rule, i in zip(plan.compiled.rules, plan.leaf_identifiers, strict=True):
        if i >= 0:
            count, span = limits[i]
            limits[i] = (max(count, rule.count), max(span, rule.span_ms))
    return limits


def counter_update_rate(
    update: CounterUpdate, current: float, previous: float, now_us: int
) -> float:
    """The counter API: the rate after ``update``, from the window counts before it
    (storage scripts do the same)."""
    current += update.value
    if update.weight is None:
        return counter_rate(current, previous, now_us, update.size_us, sliding=True)
    return current + previous * update.weight


def reset_keep_us(plan: Plan) -> int:
    """How long a reset's mark on ``plan``'s identifiers is kept at least: as long as a call
    reserved under ``plan`` before it could still be refunded (two windows of the largest
    span; a GCRA rule's burst tolerance), so that such a refund takes nothing counted after
    the reset. Each store keeps it longer while what the reset forgot would still have been
    kept (a call reserved under other rules, an override's or the limit's own)."""
    keep = 0
    for rule in plan.compiled.rules:
        span_us = rule.span_ms * 1000
        keep = max(keep, 2 * span_us, -(-gcra_burst(rule) * span_us // rule.count))
    return keep


INJECTED_CLOCK_KEEP_MS = 3_600_000
"""With an injected clock (tests), Redis still expires on its own: marks last an hour at
least, as arrival times do."""


def reset_keep_ms(plan: Plan, injected: bool) -> int:
    """:func:`reset_keep_us` in whole milliseconds for Redis's ``PX`` (``injected``: a
    clock of the caller's, whose time Redis's expiry does not follow)."""
    keep = -(-reset_keep_us(plan) // 1000)
    return max(keep, INJECTED_CLOCK_KEEP_MS) if injected else keep
