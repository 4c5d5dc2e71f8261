"""The memory backend's admissions for the direct path (:mod:`ratelimit.direct`): for one
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
from ratelimit.backends.memory_entries import Arrivals, Log
from ratelimit.decision import Decision
from ratelimit.plan import CompiledTree, Identifier, Plan
from ratelimit.rules import Rule

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
