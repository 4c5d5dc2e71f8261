"""The algorithms on the command engine (``use_scripts=False``): each reads what
its Lua script reads, decides with :func:`~ratelimit.core.evaluation.evaluate`, and writes what the
script writes, in a transaction, under the engine's lock (or none, with ``disable_locks``).

:data:`BY_ALGORITHM` is the engine's table of what it supports: one line per algorithm.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from ratelimit.algorithms import (
    FIXED_WINDOW,
    GCRA,
    SLIDING_LOG,
    SLIDING_WINDOW,
    US_PER_MS,
    Arrival,
    gcra_burst,
    gcra_rescaled,
    gcra_shared_next,
    not_before,
    window,
    window_index,
)
from ratelimit.backends import windows
from ratelimit.backends.base import Clock
from ratelimit.backends.layout import arrival_shapes, arrival_slots, limits_per_identifier
from ratelimit.backends.redis.command import slots as command_slots
from ratelimit.backends.redis.keys import (
    arrival_keys,
    counter_key,
    kept_key,
    name_of,
    slot_fields,
    window_fields,
)
from ratelimit.core.decision import Decision
from ratelimit.core.evaluation import evaluate
from ratelimit.core.plan import Plan
from ratelimit.errors import BackendError
from ratelimit.rules.tree import Rule

HEAD = 64  # entries of each log read in the first round trip
INJECTED_CLOCK_KEEP_US = 3_600_000_000
"""GCRA under an injected clock (tests): Redis expires keys on real time, not on that clock,
so an arrival time is kept an hour at least (``gcra.lua`` does the same)."""


class Engine(command_slots.Engine, Protocol):
    """What these decisions use of the command engine."""

    clock: Clock | None


async def decide_logs(engine: Engine, plan: Plan, may_write: bool = True) -> Decision:
    """Sliding log: the same lists as ``sliding_log.lua``; deep logs are read past their head
    only when a rule must look that far."""
    spread = engine.spread and not plan.compiled.pinned
    keys = [name_of(identifier, spread) for identifier in plan.identifiers]
    kept_keys = [kept_key(identifier, spread) for identifier in plan.identifiers]
    limits = limits_per_identifier(plan)
    rules = plan.compiled.rules
    deep = [
        (leaf, i)
        for leaf, (rule, i) in enumerate(zip(rules, plan.leaf_identifiers, strict=True))
        if i >= 0 and plan.depth(leaf) > HEAD
    ]

    def fill(read: Any) -> None:
        for key, kept, (keep, _span) in zip(keys, kept_keys, limits, strict=True):
            read.lrange(key, 0, min(keep, HEAD) - 1)
            read.pttl(key)
            read.get(kept)
        for leaf, i in deep:
            read.lindex(keys[i], plan.depth(leaf) - 1)

    replies = await engine._read(fill)
    now = await engine._now(replies, keys[0])
    heads = [[int(t) for t in replies[3 * i]] for i in range(len(keys))]
    ttls = [int(replies[3 * i + 1]) for i in range(len(keys))]
    held = [int(replies[3 * i + 2] or 0) for i in range(len(keys))]
    nth = {leaf: replies[3 * len(keys) + n] for n, (leaf, _i) in enumerate(deep)}

    counts: list[tuple[int, int]] = []
    for leaf, (rule, i) in enumerate(zip(rules, plan.leaf_identifiers, strict=True)):
        if i < 0:
            counts.append((0, 0))
            continue
        threshold = now - rule.span_ms * US_PER_MS
        counts.append(
            await _window(engine, keys[i], heads[i], nth.get(leaf), plan.depth(leaf), threshold)
        )
    decision = evaluate(plan, now, counts)
    if decision.allowed and plan.record:
        if not may_write:
            raise _cannot_record(plan)
        over = {
            i
            for leaf, (i, (hits, _)) in enumerate(zip(plan.leaf_identifiers, counts, strict=True))
            if i >= 0 and hits >= plan.depth(leaf)
        }
        write = engine._writes()
        for k, (key, kept, head, ttl, count, (keep, span_ms)) in enumerate(
            zip(keys, kept_keys, heads, ttls, held, limits, strict=True)
        ):
            stamp = max(now, head[0]) if head else now
            for left in range(min(int(plan.identifier_cost(k)), keep), 0, -1000):
                write.lpush(key, *[stamp] * min(left, 1000))
            # never below what another limit on this log asked to keep; not at all where a
            # rule on it was over its count (an And admitted the call through another rule),
            # so that a settle's refund never brings a cut hit's place into view (the script
            # keeps every hit within the span; older ones go at the next trim)
            if k not in over:
                write.ltrim(key, 0, max(keep, count) - 1)
            extended = ttl < span_ms  # then two spans, as the script does
            if extended:
                ttl = 2 * span_ms
                write.pexpire(key, ttl)
            if keep > count:
                write.set(kept, keep, px=ttl)
            elif extended:
                write.pexpire(kept, ttl)
        await write.execute()
    return decision


async def decide_windows(engine: Engine, plan: Plan, may_write: bool = True) -> Decision:
    """Sliding or fixed window: the same counters as ``window_counters.lua``."""
    spread = engine.spread and not plan.compiled.pinned
    keys = [counter_key(identifier, spread) for identifier in plan.identifiers]
    sizes = plan.windows

    def fill(read: Any) -> None:
        for key, sizes_of in zip(keys, sizes, strict=True):
            for size in sizes_of:
                read.hmget(key, window_fields(size))
            read.pttl(key)

    replies = await engine._read(fill)
    now = await engine._now(replies, keys[0])
    fields: list[dict[int, Sequence[Any]]] = []  # per key, per size: its four fields
    ttls: list[int] = []
    for sizes_of in sizes:
        fields.append({size: replies.pop(0) for size in sizes_of})
        ttls.append(int(replies.pop(0)))
    for by_size in fields:  # a window newer than now: the clock stepped back
        for size, four in by_size.items():
            now = not_before(now, windows.newest(four), size)
    held = [  # per key, per size: (current, previous)
        {size: windows.counted(four, window_index(now, size)) for size, four in by_size.items()}
        for by_size in fields
    ]
    counts = [
        (0.0, 0.0) if i < 0 else held[i][rule.span_ms * US_PER_MS]
        for rule, i in zip(plan.compiled.rules, plan.leaf_identifiers, strict=True)
    ]
    decision = evaluate(plan, now, counts)
    if decision.allowed and plan.record:
        if not may_write:
            raise _cannot_record(plan)
        write = engine._writes()
        for k, (key, counted, ttl) in enumerate(zip(keys, held, ttls, strict=True)):
            cost = plan.identifier_cost(k)
            for size, (current, _previous) in counted.items():
                index = window_index(now, size)
                count, held_index = slot_fields(size, index)
                write.hset(key, mapping={count: repr(current + cost), held_index: index})
            ms = math.ceil(2 * max(counted) / 1000)
            if ttl < ms:
                write.pexpire(key, ms)
        await write.execute()
    return decision


async def decide_arrivals(engine: Engine, plan: Plan, may_write: bool = True) -> Decision:
    """GCRA: the same arrival times as ``gcra.lua``, one string per (identifier, span), each
    leaf reading it rescaled to its own count; admitted, it is written as
    :func:`~ratelimit.algorithms.gcra_shared_next` pushes it; refused, a key read under
    another count is written as read, as the script does."""
    keys = arrival_keys(plan, engine.spread and not plan.compiled.pinned)
    times, slots = arrival_slots(plan.compiled, plan.leaf_identifiers)
    replies = await engine._read(functools.partial(get_each, keys))
    now = await engine._now(replies, keys[0])
    stored = [
        stored_arrival(value, rule) for value, (_, rule, _) in zip(replies, times, strict=True)
    ]
    counts: list[Arrival] = [
        (0, 0) if k < 0 else gcra_rescaled(rule, *stored[k], now)
        for rule, k in zip(plan.compiled.rules, slots, strict=True)
    ]
    decision = evaluate(plan, now, counts)
    if not plan.record:
        return decision
    if decision.allowed and not may_write:
        raise _cannot_record(plan)
    write = engine._writes()
    shapes = arrival_shapes(plan.compiled, plan.leaf_identifiers)
    for key, (i, rule, _), (tat, count), of in zip(keys, times, stored, shapes, strict=True):
        if decision.allowed:
            pushed = gcra_shared_next(of, plan.identifier_cost(i), tat, count, now)
        elif may_write and count != rule.count:
            pushed = gcra_rescaled(rule, tat, count, now)  # held as this rule reads it
        else:
            continue
        keep = max(pushed[0] - now + 1, 1)
        if engine.clock is not None:  # Redis expires on real time, not on this clock
            tolerance_us = gcra_burst(rule) * rule.span_ms * US_PER_MS // rule.count
            keep = max(keep, tolerance_us + 1, INJECTED_CLOCK_KEEP_US)
        write.set(key, arrival_text(pushed, rule.count), px=math.ceil(keep / 1000))
    if len(write):
        await write.execute()
    return decision


async def _window(
    engine: Engine, key: str, head: Sequence[int], nth: bytes | None, count: int, threshold: int
) -> tuple[int, int]:
    """``window()`` over the newest ``count`` entries of a log (a rule's depth), reading
    past the head of the log only when it must."""
    if count <= HEAD or len(head) < HEAD:
        return window(head, count, threshold)
    if nth is not None and int(nth) > threshold:
        return count, int(nth)
    counted = window(head, HEAD, threshold)
    if counted[0] < HEAD:
        return counted  # an old entry within the head ends the window
    rest = [int(t) for t in await engine.client.lrange(key, HEAD, count - 1)]
    return window([*head, *rest], count, threshold)


def get_each(keys: Sequence[str], read: Any) -> None:
    """``GET`` each key in the read pipeline: ``MGET``, which a Redis Cluster pipeline
    refuses (redis-py blocks it there), although the keys share one slot."""
    for key in keys:
        read.get(key)


def stored_arrival(stored: bytes | str | None, rule: Rule) -> tuple[Arrival, int]:
    """A stored arrival time as stored, and the count it was stored under (``(0, 0)`` and
    ``rule``'s count when none is)."""
    if stored is None:
        return (0, 0), rule.count
    text = stored.decode() if isinstance(stored, bytes) else stored
    us, _, rest = text.partition(":")
    remainder, _, count = rest.partition(":")
    return (int(us), int(remainder or 0)), int(count or rule.count)


def arrival_text(arrival: Arrival, count: int) -> str:
    """What ``gcra.lua`` writes: ``us:rem:count``, ``count`` the one it is stored under."""
    return f"{arrival[0]}:{arrival[1]}:{count}"


def _cannot_record(plan: Plan) -> BackendError:
    return BackendError(
        f"redis refuses writes (maxmemory with noeviction): the hit of key {plan.key!r} "
        "cannot be recorded"
    )


Decide = Callable[[Engine, Plan, bool], Awaitable[Decision]]

BY_ALGORITHM: dict[str, Decide] = {
    SLIDING_LOG: decide_logs,
    SLIDING_WINDOW: decide_windows,
    FIXED_WINDOW: decide_windows,
    GCRA: decide_arrivals,
}
"""The algorithms the command engine decides, by name."""
