"""The memory backend's admissions for the direct paths (:mod:`ratelimit.front.direct`,
:mod:`ratelimit.front.fused`): for one limit's tree and algorithm, worked out when the limit
decorates, the function that decides and records one call without a coroutine and builds no
``Decision`` for an admitted one.

One body per shape: a call of cost 1 on one rule of a sliding log, of GCRA or of a window
counter is admitted inline, under the backend's lock, by what ``MemoryBackend._decide_one``
/ ``_decide_arrivals`` / ``_decide_windows`` do for an admitted call (:func:`identified`,
which the fused path calls with the identifier and the direct path through
:func:`admitter`). A call they would refuse (or a GCRA arrival time stored under another
rate, to rescale first; a window counter held newer than the clock) changes nothing and
goes, with every other call and tree, to ``MemoryBackend.admit``, which decides as
``decide`` does and says why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from ratelimit.algorithms import (
    FIXED_WINDOW,
    GCRA,
    SLIDING_LOG,
    SLIDING_WINDOW,
    US_PER_MS,
    Algorithm,
    gcra_burst,
)
from ratelimit.backends import windows
from ratelimit.backends.layout import gcra_field
from ratelimit.backends.memory.entries import Arrivals, Log, Windows
from ratelimit.core.decision import Decision
from ratelimit.core.plan import CompiledTree, Identifier, Plan
from ratelimit.rules.tree import Rule

Admit = Callable[[Plan], "Decision | None"]


class MemoryBackend(Protocol):
    """What these admissions read of ``backends.memory.MemoryBackend`` (its own parts: they
    run under its lock, as its ``decide`` does)."""

    _lock: threading.Lock
    _closed: bool
    _since_sweep: int
    _sweep_at: int
    _logs: dict[Identifier, Log]
    _arrivals: dict[Identifier, Arrivals]
    _windows: dict[Identifier, Windows]

    def _clock(self) -> float: ...
    def _sweep(self, now: int) -> None: ...
    def admit(self, plan: Plan) -> Decision | None: ...


def admitter(backend: MemoryBackend, compiled: CompiledTree, algorithm: Algorithm) -> Admit:
    """``backend``'s admission of plans of ``compiled`` under ``algorithm``: a call on a
    tree of one rule whose selector has a value goes to the admission of :func:`identified`
    (admitted inline, or refused with nothing changed) at cost 1, or at any cost from 1 to
    the rule's count but under GCRA; every other call (a refusal included, to be told why)
    to ``backend.admit``, which decides as ``decide`` does."""
    one = identified(backend, compiled, algorithm)
    general = backend.admit
    if one is None:
        return general
    most = compiled.rules[0].count if _ANY_COST.get(algorithm.name) else 1  # what it takes

    def admit(plan: Plan) -> Decision | None:
        cost = plan.cost
        if (
            (cost == 1 or 1 <= cost <= most)
            and plan.record
            and plan.identifiers
            and not plan.costs
            and one(plan.identifiers[0], cost)
        ):
            return None  # admitted and recorded inline
        return general(plan)

    return admit


AdmitIdentified = Callable[..., bool]
"""``admit(identifier)``: one call of cost 1 decided and recorded on ``identifier`` when
admitted (``True``); ``False``, having changed nothing at all, for the general path to
decide (a refusal, a closed backend, a GCRA arrival time stored under another rate).
``admit(identifier, cost)``: at ``cost`` (from 1 to the rule's count; the sliding log and
the window counters)."""


def identified(
    backend: MemoryBackend, compiled: CompiledTree, algorithm: Algorithm
) -> AdmitIdentified | None:
    """``backend``'s admission of one call of cost 1 on the identifier of ``compiled``'s one
    rule, or ``None`` for any other tree (the fused direct path, ``ratelimit/front/fused.py``)."""
    make = _IDENTIFIED.get(algorithm.name)
    if make is None or len(compiled.rules) != 1 or compiled.rules[0].count < 1:
        return None
    return make(backend, compiled.rules[0], getattr(algorithm, "sliding", False))


def _log_identified(backend: MemoryBackend, rule: Rule, _: bool) -> AdmitIdentified:
    # Log.record's admitted call of cost 1, and _decide_one's check; the refusal is told
    # before the sweep's count moves: a refused call leaves everything as it was, for the
    # general path to decide it again
    logs, clock = backend._logs, backend._clock
    acquire, release = backend._lock.acquire, backend._lock.release  # a with: 2x the cost
    count, span_us = rule.count, rule.span_ms * US_PER_MS

    def admit(identifier: Identifier, cost: int = 1) -> bool:
        acquire()
        try:
            if backend._closed:
                return False
            now = round(clock() * 1_000_000)
            log = logs.get(identifier)
            if log is not None and log.expires_us > now:
                hits = log.hits
                last = count - cost  # the hit that must be out of the window for these
                if len(hits) > last and hits[last] > now - span_us:
                    return False
            else:
                log = None
            since = backend._since_sweep + 1
            if since >= backend._sweep_at:
                backend._sweep(now)  # which may drop an expired log: made again below
            else:
                backend._since_sweep = since
            if log is None:
                log = logs[identifier] = Log()
                hits = log.hits
            kept = log.kept
            if kept != count:
                if kept > count:  # another limit keeps more of this log: Log.record's rule
                    log.record(now, cost, count, span_us)
                    return True
                log.kept = count
            if cost == 1:
                hits.appendleft(hits[0] if hits and hits[0] > now else now)
            else:
                hits.extendleft([hits[0] if hits and hits[0] > now else now] * cost)
            while len(hits) > count:  # more, kept by an And tree over its count: Log.record
                hits.pop()
            if now + span_us > log.expires_us:
                log.expires_us = now + span_us
            return True
        finally:
            release()

    return admit


def _arrival_identified(backend: MemoryBackend, rule: Rule, _: bool) -> AdmitIdentified:
    # _decide_arrivals' admitted call of cost 1 (Arrivals.write inline), the refusal told
    # before anything changes
    arrivals, clock = backend._arrivals, backend._clock
    acquire, release = backend._lock.acquire, backend._lock.release
    count, span = rule.count, rule.span_ms * US_PER_MS
    field, tolerance = gcra_field(rule), gcra_burst(rule) * span

    def admit(identifier: Identifier, cost: int = 1) -> bool:  # of cost 1 only
        acquire()
        try:
            if backend._closed:
                return False
            now = round(clock() * 1_000_000)
            entry = arrivals.get(identifier)
            if entry is not None and entry.expires_us > now:
                rates = entry.rates
                if rates.get(field, count) != count:
                    return False  # stored under another rate: rescaled first, generally
                tat = entry.tats.get(field)
                scaled = now * count
                stored = 0 if tat is None else tat[0] * count + tat[1]
            else:
                entry, stored, scaled = None, 0, now * count
            pushed = (stored if stored > scaled else scaled) + span
            if pushed - scaled > tolerance:
                return False
            since = backend._since_sweep + 1
            if since >= backend._sweep_at:
                backend._sweep(now)  # which may drop an expired entry: made again below
            else:
                backend._since_sweep = since
            if entry is None:
                entry = Arrivals()
            arrival = divmod(pushed, count)
            entry.tats[field] = arrival
            if field not in entry.rates:
                entry.rates[field] = count
                arrivals[identifier] = entry
            if arrival[0] >= entry.expires_us:
                entry.expires_us = arrival[0] + 1
            return True
        finally:
            release()

    return admit


def _window_identified(backend: MemoryBackend, rule: Rule, sliding: bool) -> AdmitIdentified:
    # _decide_windows' admitted call of cost 1 on one rule (counter_outcome's rate, inlined
    # with the same operations in the same order), the refusal told before anything
    # changes; a window held newer than now (the clock stepped back) goes the general way
    table, clock = backend._windows, backend._clock
    acquire, release = backend._lock.acquire, backend._lock.release
    count, size = rule.count, rule.span_ms * US_PER_MS
    empty = windows.empty

    def admit(identifier: Identifier, cost: float = 1) -> bool:
        acquire()
        try:
            if backend._closed:
                return False
            now = round(clock() * 1_000_000)
            index = now // size
            entry = table.get(identifier)
            slots = None
            if entry is not None and entry.expires_us > now:
                slots = entry.slots.get(size)
            else:
                entry = None
            current = previous = 0.0
            if slots is not None:
                for at in (1, 3):
                    held = slots[at]
                    if held is None:
                        continue
                    if held == index:
                        current = slots[at - 1]
                    elif held == index - 1:
                        previous = slots[at - 1]
                    elif held > index:
                        return False  # the clock stepped back: not_before, generally
            rate = current + previous * (size - (now - index * size)) / size if sliding else current
            if rate + cost > count:
                return False
            since = backend._since_sweep + 1
            if since >= backend._sweep_at:
                backend._sweep(now)  # which may drop an expired entry: made again below
            else:
                backend._since_sweep = since
            if entry is None:
                entry = Windows()
            if slots is None:
                slots = entry.slots[size] = empty()
            slot = (index & 1) << 1  # windows.hold, inlined
            slots[slot] = current + cost
            slots[slot + 1] = index
            if now + 2 * size > entry.expires_us:
                entry.expires_us = now + 2 * size
            table[identifier] = entry
            return True
        finally:
            release()

    return admit


_ANY_COST = {SLIDING_LOG: True, SLIDING_WINDOW: True, FIXED_WINDOW: True}
"""The admissions that take a cost above 1 (GCRA's takes 1: others decide generally)."""
_IDENTIFIED = {
    SLIDING_LOG: _log_identified,
    GCRA: _arrival_identified,
    SLIDING_WINDOW: _window_identified,
    FIXED_WINDOW: _window_identified,
}
