"""Settles on the command engine (``use_scripts=False``): each reads what its
``settle_*.lua`` reads, settles with the same Python the memory backend runs
(:func:`~ratelimit.algorithms.settle_log`, :func:`ratelimit.backends.windows.settle`,
:func:`~ratelimit.algorithms.gcra_settled`), and writes what the script writes, in a
transaction, under the engine's lock (see :mod:`ratelimit.core.settling`); a refund of a
call reserved before a reset (``resets.py``, its mark) takes nothing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable
from typing import Any

from ratelimit.algorithms import (
    FIXED_WINDOW,
    GCRA,
    SLIDING_LOG,
    SLIDING_WINDOW,
    US_PER_MS,
    gcra_burst,
    gcra_settled,
    not_before,
    settle_log,
)
from ratelimit.backends import windows
from ratelimit.backends.layout import arrival_slots, limits_per_identifier
from ratelimit.backends.redis.command.decisions import (
    INJECTED_CLOCK_KEEP_US,
    Engine,
    arrival_text,
    get_each,
    stored_arrival,
)
from ratelimit.backends.redis.keys import (
    arrival_keys,
    counter_key,
    kept_key,
    name_of,
    reset_key,
    slot_fields,
    window_fields,
)
from ratelimit.core.settling import Settlement, held_arrival


async def settle_logs(engine: Engine, settlement: Settlement) -> None:
    """Sliding log: the whole list read, settled, and written back in one ``MULTI``."""
    plan = settlement.plan
    spread = engine.spread and not plan.compiled.pinned
    keys = [name_of(identifier, spread) for identifier in plan.identifiers]
    kept_keys = [kept_key(identifier, spread) for identifier in plan.identifiers]

    def fill(read: Any) -> None:
        for key, kept in zip(keys, kept_keys, strict=True):
            read.lrange(key, 0, -1)
            read.pttl(key)
            read.get(kept)
        for identifier in plan.identifiers:
            read.get(reset_key(identifier, spread))

    replies = await engine._read(fill)
    now = await engine._now(replies, keys[0])
    marks = replies[3 * len(keys) :]
    write = engine._writes()
    for k, (key, kept, (keep, span_ms)) in enumerate(
        zip(keys, kept_keys, limits_per_identifier(plan), strict=True)
    ):
        delta = int(settlement.deltas[plan.leaf_identifiers.index(k)])
        hits = [int(t) for t in replies[3 * k]]
        ttl, held = int(replies[3 * k + 1]), int(replies[3 * k + 2] or 0)
        if delta == 0 or (delta < 0 and (not hits or reset_since(marks[k], settlement.at_us))):
            continue  # nothing to take back, or reserved before a reset, which forgot it
        settle_log(hits, delta, settlement.at_us, now, max(keep, held), span_ms * US_PER_MS)
        write.delete(key)
        if hits:
            write.rpush(key, *hits)
        if delta < 0:  # as LREM leaves it: the list's time to live, the companion as it was
            if hits and ttl > 0:
                write.pexpire(key, ttl)
            continue
        if ttl < span_ms:  # then two spans, as the script does
            ttl = 2 * span_ms
        write.pexpire(key, ttl)
        if keep > held:
            write.set(kept, keep, px=ttl)
        else:
            write.pexpire(kept, ttl)
    await write.execute()


async def settle_windows(engine: Engine, settlement: Settlement) -> None:
    """Window counters: each (key, size) read, settled and written as the script does."""
    plan = settlement.plan
    todo: dict[tuple[int, int], float] = {}
    for rule, k, delta in zip(
        plan.compiled.rules, plan.leaf_identifiers, settlement.deltas, strict=True
    ):
        if k >= 0 and delta:
            todo.setdefault((k, rule.span_ms * US_PER_MS), delta)
    if not todo:
        return
    spread = engine.spread and not plan.compiled.pinned
    keys = [counter_key(identifier, spread) for identifier in plan.identifiers]

    def fill(read: Any) -> None:
        for k, size in todo:
            read.hmget(keys[k], window_fields(size))
        for k, _size in todo:
            read.pttl(keys[k])
        for k, _size in todo:
            read.get(reset_key(plan.identifiers[k], spread))

    replies = await engine._read(fill)
    now = await engine._now(replies, keys[0])
    n = len(todo)
    held = [list(four) for four in replies[:n]]
    ttls = [int(ttl) for ttl in replies[n : 2 * n]]
    for (k, size), mark in zip(list(todo), replies[2 * n :], strict=True):
        if todo[k, size] < 0 and reset_since(mark, settlement.at_us):
            todo[k, size] = 0.0  # reserved before a reset, which forgot it
    if not any(todo.values()):
        return
    for four, (_k, size) in zip(held, todo, strict=True):  # the clock stepped back
        now = not_before(now, windows.newest(four), size)
    write = engine._writes()
    for four, ttl, ((k, size), delta) in zip(held, ttls, todo.items(), strict=True):
        at_index = settlement.at_us // size
        if not delta or (delta < 0 and at_index not in windows.held(four)):
            continue
        windows.settle(four, delta, at_index, now // size)
        index = at_index if delta < 0 else now // size
        count, held_index = slot_fields(size, index)
        current = windows.counted(four, index)[0]
        write.hset(keys[k], mapping={count: repr(current), held_index: index})
        ms = math.ceil(2 * size / 1000)
        if delta > 0 and ttl < ms:
            write.pexpire(keys[k], ms)
    await write.execute()


async def settle_arrivals(engine: Engine, settlement: Settlement) -> None:
    """GCRA: each arrival time read, settled and written as the script does."""
    plan = settlement.plan
    spread = engine.spread and not plan.compiled.pinned
    keys = arrival_keys(plan, spread)
    times, slots = arrival_slots(plan.compiled, plan.leaf_identifiers)
    marks = [reset_key(plan.identifiers[i], spread) for i, _, _ in times]
    replies = await engine._read(functools.partial(get_each, keys + marks))
    now = await engine._now(replies, keys[0])
    write = engine._writes()
    stores, resets = replies[: len(keys)], replies[len(keys) :]
    for position, (key, (_i, rule, _), stored) in enumerate(zip(keys, times, stores, strict=True)):
        leaf = slots.index(position)
        delta = int(settlement.deltas[leaf])
        if delta < 0 and reset_since(resets[position], settlement.at_us):
            continue  # reserved before a reset, which forgot it
        tat, count = stored_arrival(stored, rule)  # settled at the rate it holds now
        held = held_arrival(settlement, leaf)  # under the first leaf's count
        reserved = plan.compiled.rules[leaf]
        settled = gcra_settled(reserved, tat, delta, now, held, count)
        if delta == 0 or settled == tat:
            continue
        keep = settled[0] - now + 1
        if engine.clock is not None:  # Redis expires on real time, not on this clock
            tolerance_us = gcra_burst(reserved) * rule.span_ms * US_PER_MS // count
            keep = max(keep, tolerance_us + 1, INJECTED_CLOCK_KEEP_US)
        write.set(key, arrival_text(settled, count), px=math.ceil(keep / 1000))
    await write.execute()


def reset_since(mark: bytes | str | None, at_us: int) -> bool:
    """Whether a reset mark (:func:`~ratelimit.backends.redis.keys.reset_key`) says the
    identifier was reset after a call reserved at ``at_us``."""
    return mark is not None and int(mark) >= at_us


Settle = Callable[[Engine, Settlement], Awaitable[None]]

BY_ALGORITHM: dict[str, Settle] = {
    SLIDING_LOG: settle_logs,
    SLIDING_WINDOW: settle_windows,
    FIXED_WINDOW: settle_windows,
    GCRA: settle_arrivals,
}
"""How the command engine settles, by algorithm name."""
