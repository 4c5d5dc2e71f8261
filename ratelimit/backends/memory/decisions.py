"""Decisions on the memory backend: per algorithm, what the Redis scripts do (a sliding log,
window counters, GCRA arrival times), on the backend's dicts, under its lock. The direct
path's admissions of the same (``admit.py``) decide an admitted call inline; the rest come
here."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ratelimit.algorithms import (
    FIXED_WINDOW,
    GCRA,
    SLIDING_LOG,
    SLIDING_WINDOW,
    US_PER_MS,
    Arrival,
    gcra_rescaled,
    gcra_shared_next,
    log_outcome,
    not_before,
    window,
    window_index,
)
from ratelimit.backends.layout import arrival_shapes, arrival_slots, limits_per_identifier
from ratelimit.backends.memory.entries import Arrivals, Log, Tables, Windows, live
from ratelimit.core.decision import Decision
from ratelimit.core.evaluation import decided, evaluate
from ratelimit.core.plan import Plan


class DecisionTables(Tables):
    """A mixin: the memory backend's decisions, one routine per algorithm
    (:data:`_DECIDE`). Its host runs them under its lock."""

    def _decide_log(self, plan: Plan, now: int) -> Decision:
        """Sliding log: one rule by the shortcut, a tree by the general path."""
        if len(plan.leaf_identifiers) == 1 and plan.identifiers:
            return self._decide_one(plan, now)
        return self._decide_logs(plan, now)

    def _decide_logs(self, plan: Plan, now: int) -> Decision:
        """Sliding logs: every leaf of the tree counted, then recorded when admitted."""
        logs = [live(self._logs, identifier, now, Log) for identifier in plan.identifiers]
        counts: list[tuple[int, int]] = []
        rules = plan.compiled.rules
        for leaf, (rule, i) in enumerate(zip(rules, plan.leaf_identifiers, strict=True)):
            if i < 0:
                counts.append((0, 0))
            else:
                threshold = now - rule.span_ms * US_PER_MS
                counts.append(window(logs[i].hits, plan.depth(leaf), threshold))
        decision = evaluate(plan, now, counts)
        if decision.allowed and plan.record:
            over = [False] * len(logs)  # a rule of the log over its count: see Log.record
            for leaf, (i, (hits, _)) in enumerate(zip(plan.leaf_identifiers, counts, strict=True)):
                if i >= 0 and hits >= plan.depth(leaf):
                    over[i] = True
            for k, (identifier, log, (keep, span_ms)) in enumerate(
                zip(plan.identifiers, logs, limits_per_identifier(plan), strict=True)
            ):
                cost = int(plan.identifier_cost(k))
                log.record(now, cost, keep, span_ms * US_PER_MS, over[k])
                self._logs[identifier] = log
        return decision

    def _decide_one(self, plan: Plan, now: int) -> Decision:
        """A single rule on a sliding log: what :meth:`_decide_logs` does, without the tree."""
        identifier = plan.identifiers[0]
        rule = plan.compiled.rules[0]
        log = self._logs.get(identifier)
        if log is None or log.expires_us <= now:
            log = self._logs[identifier] = Log()  # an unrecorded one is swept when expired
        span_us = rule.span_ms * US_PER_MS
        counted = window(log.hits, rule.count - int(plan.cost) + 1, now - span_us)
        decision = decided(plan, log_outcome(rule, 0, plan.cost, counted, now), now, (counted,))
        if decision.allowed and plan.record:
            log.record(now, int(plan.cost), rule.count, span_us)
        return decision

    def _decide_windows(self, plan: Plan, now: int) -> Decision:
        entries = [live(self._windows, identifier, now, Windows) for identifier in plan.identifiers]
        for rule, i in zip(plan.compiled.rules, plan.leaf_identifiers, strict=True):
            if i >= 0:  # a window newer than now: the clock stepped back
                size = rule.span_ms * US_PER_MS
                now = not_before(now, entries[i].newest(size), size)
        counts: list[tuple[float, float]] = []
        for rule, i in zip(plan.compiled.rules, plan.leaf_identifiers, strict=True):
            size = rule.span_ms * US_PER_MS
            counts.append((0.0, 0.0) if i < 0 else entries[i].counted(size, now // size))
        decision = evaluate(plan, now, counts)
        if decision.allowed and plan.record:
            sizes = plan.windows
            for k, (identifier, entry, sizes_of) in enumerate(
                zip(plan.identifiers, entries, sizes, strict=True)
            ):
                cost = plan.identifier_cost(k)
                for size in sizes_of:
                    index = window_index(now, size)
                    current, _ = entry.counted(size, index)
                    entry.hold(size, index, current + cost)
                entry.expires_us = max(entry.expires_us, now + 2 * max(sizes_of))
                self._windows[identifier] = entry
        return decision

    def _decide_arrivals(self, plan: Plan, now: int) -> Decision:
        """GCRA: every leaf's arrival time read, then pushed on when admitted."""
        entries = [live(self._arrivals, i, now, Arrivals) for i in plan.identifiers]
        times, slots = arrival_slots(plan.compiled, plan.leaf_identifiers)
        stored = [entries[i].stored(field, rule) for i, rule, field in times]
        counts: list[Arrival] = [
            (0, 0) if k < 0 else gcra_rescaled(rule, *stored[k], now)
            for rule, k in zip(plan.compiled.rules, slots, strict=True)
        ]
        decision = evaluate(plan, now, counts)
        if plan.record:
            shapes = arrival_shapes(plan.compiled, plan.leaf_identifiers)
            for (i, rule, field), (tat, count), of in zip(times, stored, shapes, strict=True):
                entry = entries[i]
                if decision.allowed:
                    cost = plan.identifier_cost(i)
                    entry.write(field, rule, gcra_shared_next(of, cost, tat, count, now))
                elif count != rule.count:  # held as this rule reads it: gcra.lua
                    entry.write(field, rule, gcra_rescaled(rule, tat, count, now))
                else:
                    continue
                self._arrivals[plan.identifiers[i]] = entry
        return decision

    _DECIDE: ClassVar[dict[str, Callable[[DecisionTables, Plan, int], Decision]]] = {
        SLIDING_LOG: _decide_log,
        SLIDING_WINDOW: _decide_windows,
        FIXED_WINDOW: _decide_windows,
        GCRA: _decide_arrivals,
    }

    algorithms: ClassVar[frozenset[str]] = frozenset(_DECIDE)
    """The algorithms this backend decides: each one's code, by name, in ``_DECIDE``."""
