"""The memory backend's admissions for the direct path (:mod:`ratelimit.front.direct`): for one
limit's tree and algorithm, worked out when the limit decorates, the function that decides
and records one call without a coroutine and builds no ``Decision`` for an admitted one.

One rule on a sliding log or GCRA is admitted inline, under the backend's lock, by what
``MemoryBackend._decide_one`` / ``_decide_arrivals`` do for an admitted call; a call they
would refuse (or a GCRA arrival time stored under another rate, to rescale first), a rule
whose selector has no value, and every other tree go to ``MemoryBackend.admit``, which
decides as ``decide`` does and says why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from ratelimit.algorithms import GCRA, SLIDING_LOG, US_PER_MS, Algorithm, gcra_burst
from ratelimit.backends.layout import gcra_field
from ratelimit.backends.memory.entries import Arrivals, Log
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

    def _clock(self) -> float: ...
    def _sweep(self, now: int) -> None: ...
    def _decide_one(self, plan: Plan, now: int) -> Decision: ...
    def _decide_arrivals(self, plan: Plan, now: int) -> Decision: ...
    def _refused(self, decision: Decision) -> Decision | None: ...
    def admit(self, plan: Plan) -> Decision | None: ...


def admitter(backend: MemoryBackend, compiled: CompiledTree, algorithm: Algorithm) -> Admit:
    """``backend``'s admission of plans of ``compiled`` under ``algorithm``."""
    if len(compiled.rules) == 1 and algorithm.name == SLIDING_LOG:
        return _log_admitter(backend, compiled.rules[0])
    if len(compiled.rules) == 1 and algorithm.name == GCRA:
        return _arrival_admitter(backend, compiled.rules[0])
    return backend.admit


def _log_admitter(backend: MemoryBackend, rule: Rule) -> Admit:
    lock, logs, general = backend._lock, backend._logs, backend.admit
    count, span_us = rule.count, rule.span_ms * US_PER_MS

    def admit(plan: Plan) -> Decision | None:
        if backend._closed or not plan.identifiers or not plan.record:
            return general(plan)
        identifier = plan.identifiers[0]
        cost = int(plan.cost)
        depth = count - cost + 1
        with lock:
            now = round(backend._clock() * 1_000_000)
            backend._since_sweep += 1
            if backend._since_sweep >= backend._sweep_at:
                backend._sweep(now)
            log = logs.get(identifier)
            if log is None or log.expires_us <= now:
                log = logs[identifier] = Log()  # an unrecorded one is swept when expired
            hits = log.hits
            if len(hits) >= depth and hits[depth - 1] > now - span_us:  # all inside: refused
                return backend._refused(backend._decide_one(plan, now))
            if cost == 1 and log.kept <= count:  # Log.record's common case, inline
                log.kept = count
                hits.appendleft(hits[0] if hits and hits[0] > now else now)
                while len(hits) > count:
                    hits.pop()
                if now + span_us > log.expires_us:
                    log.expires_us = now + span_us
            else:
                log.record(now, cost, count, span_us)
            return None

    return admit


def _arrival_admitter(backend: MemoryBackend, rule: Rule) -> Admit:
    lock, arrivals, general = backend._lock, backend._arrivals, backend.admit
    count, span = rule.count, rule.span_ms * US_PER_MS
    field, tolerance = gcra_field(rule), gcra_burst(rule) * span

    def admit(plan: Plan) -> Decision | None:
        if backend._closed or not plan.identifiers or not plan.record or plan.costs:
            return general(plan)
        identifier = plan.identifiers[0]
        moved = int(plan.cost) * span
        with lock:
            now = round(backend._clock() * 1_000_000)
            backend._since_sweep += 1
            if backend._since_sweep >= backend._sweep_at:
                backend._sweep(now)
            entry = arrivals.get(identifier)
            if entry is None or entry.expires_us <= now:
                entry = Arrivals()
            rates = entry.rates
            if rates.get(field, count) == count:  # else rescaled first, generally
                tats = entry.tats
                us, remainder = tats.get(field, (0, 0))
                scaled = now * count
                stored = us * count + remainder
                pushed = (stored if stored > scaled else scaled) + moved
                if pushed - scaled <= tolerance:  # Arrivals.write, inline
                    tats[field] = arrival = divmod(pushed, count)
                    if field not in rates:
                        rates[field] = count
                        arrivals[identifier] = entry
                    if arrival[0] >= entry.expires_us:
                        entry.expires_us = arrival[0] + 1
                    return None
            return backend._refused(backend._decide_arrivals(plan, now))

    return admit


AdmitIdentified = Callable[[Identifier], bool]
"""``admit(identifier)``: one call of cost 1 decided and recorded on ``identifier`` when
admitted (``True``); ``False``, having changed nothing at all, for the general path to
decide (a refusal, a closed backend, a GCRA arrival time stored under another rate)."""


def identified(
    backend: MemoryBackend, compiled: CompiledTree, algorithm: Algorithm
) -> AdmitIdentified | None:
    """``backend``'s admission of one call of cost 1 on the identifier of ``compiled``'s one
    rule, or ``None`` for any other tree (the fused direct path, ``ratelimit/front/fused.py``)."""
    make = _IDENTIFIED.get(algorithm.name)
    if make is None or len(compiled.rules) != 1 or compiled.rules[0].count < 1:
        return None
    return make(backend, compiled.rules[0])


def _log_identified(backend: MemoryBackend, rule: Rule) -> AdmitIdentified:
    # _log_admitter's admitted call, but the refusal is told before the sweep's count moves:
    # a refused call leaves everything as it was, for the general path to decide it again
    logs, clock = backend._logs, backend._clock
    acquire, release = backend._lock.acquire, backend._lock.release  # a with: 2x the cost
    count, span_us = rule.count, rule.span_ms * US_PER_MS
    last = count - 1  # the hit that must be out of the window for one more (cost 1)

    def admit(identifier: Identifier) -> bool:
        acquire()
        try:
            if backend._closed:
                return False
            now = round(clock() * 1_000_000)
            log = logs.get(identifier)
            if log is not None and log.expires_us > now:
                hits = log.hits
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
                    log.record(now, 1, count, span_us)
                    return True
                log.kept = count
            hits.appendleft(hits[0] if hits and hits[0] > now else now)
            while len(hits) > count:  # more, kept by an And tree over its count: Log.record
                hits.pop()
            if now + span_us > log.expires_us:
                log.expires_us = now + span_us
            return True
        finally:
            release()

    return admit


def _arrival_identified(backend: MemoryBackend, rule: Rule) -> AdmitIdentified:
    # _arrival_admitter's admitted call, the refusal told before anything changes
    arrivals, clock = backend._arrivals, backend._clock
    acquire, release = backend._lock.acquire, backend._lock.release
    count, span = rule.count, rule.span_ms * US_PER_MS
    field, tolerance = gcra_field(rule), gcra_burst(rule) * span

    def admit(identifier: Identifier) -> bool:
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


_IDENTIFIED = {SLIDING_LOG: _log_identified, GCRA: _arrival_identified}
