"""Settles on the memory backend (:class:`~ratelimit.backends.base.SettleStore` for
:class:`~ratelimit.backends.memory.backend.MemoryBackend`): the Python the command engine runs
(:func:`~ratelimit.algorithms.settle_log`, :func:`ratelimit.backends.windows.settle`,
:func:`~ratelimit.algorithms.gcra_settled`) on the backend's dicts, and the marks its
``reset`` leaves, which a refund of a call reserved before it reads (see
:mod:`ratelimit.core.settling`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from ratelimit.algorithms import (
    FIXED_WINDOW,
    GCRA,
    SLIDING_LOG,
    SLIDING_WINDOW,
    US_PER_MS,
    gcra_settled,
    not_before,
    settle_log,
)
from ratelimit.backends import windows
from ratelimit.backends.layout import arrival_slots, limits_per_identifier
from ratelimit.backends.memory.entries import Arrivals, Log, Tables, Windows, live
from ratelimit.core.plan import Identifier
from ratelimit.core.settling import Settlement, held_arrival


class SettleTables(Tables):
    """A mixin: the memory backend's settles, on its host's dicts, under its lock."""

    def _reset_since(self, identifier: Identifier, at_us: int, now: int) -> bool:
        """Whether ``identifier`` was reset after a call reserved at ``at_us`` (a refund of
        it then takes nothing: what it reserved was forgotten)."""
        mark = self._resets.get(identifier)
        return mark is not None and mark[0] >= at_us and mark[1] > now

    def _settle_logs(self, settlement: Settlement, now: int) -> None:
        plan = settlement.plan
        rules = plan.compiled.rules
        if len(rules) == 1:  # one rule (resolved: a settlement has something to record)
            self._settle_log(settlement, now, 0, rules[0].count, rules[0].span_ms)
            return
        for k, (keep, span_ms) in enumerate(limits_per_identifier(plan)):
            self._settle_log(settlement, now, k, keep, span_ms)

    def _settle_log(
        self, settlement: Settlement, now: int, k: int, keep: int, span_ms: int
    ) -> None:
        """Settle identifier ``k``'s log, kept to ``keep`` hits over ``span_ms``."""
        plan = settlement.plan
        identifier = plan.identifiers[k]
        delta = int(settlement.deltas[plan.leaf_identifiers.index(k)])
        if delta < 0 and self._reset_since(identifier, settlement.at_us, now):
            return  # reserved before a reset, which forgot it (its hits' time too)
        log = live(self._logs, identifier, now, Log)
        if keep < log.kept:
            keep = log.kept
        else:
            log.kept = keep
        settle_log(log.hits, delta, settlement.at_us, now, keep, span_ms * US_PER_MS)
        if delta > 0:
            log.expires_us = max(log.expires_us, now + span_ms * US_PER_MS)
            self._logs[identifier] = log

    def _settle_windows(self, settlement: Settlement, now: int) -> None:
        plan = settlement.plan
        entries = [live(self._windows, identifier, now, Windows) for identifier in plan.identifiers]
        settled = {}  # per (identifier, size): its delta
        for rule, k, delta in zip(
            plan.compiled.rules, plan.leaf_identifiers, settlement.deltas, strict=True
        ):
            if k >= 0 and delta:
                if delta < 0 and self._reset_since(plan.identifiers[k], settlement.at_us, now):
                    continue
                size = rule.span_ms * US_PER_MS
                settled[k, size] = delta
                now = not_before(now, entries[k].newest(size), size)  # as a decision would
        for (k, size), delta in settled.items():
            entry = entries[k]
            slots = entry.slots.setdefault(size, windows.empty())
            windows.settle(slots, delta, settlement.at_us // size, now // size)
            if delta > 0:
                entry.expires_us = max(entry.expires_us, now + 2 * size)
                self._windows[plan.identifiers[k]] = entry

    def _settle_arrivals(self, settlement: Settlement, now: int) -> None:
        plan = settlement.plan
        times, slots = arrival_slots(plan.compiled, plan.leaf_identifiers)
        for position, (k, rule, field) in enumerate(times):
            leaf = slots.index(position)
            delta = int(settlement.deltas[leaf])
            identifier = plan.identifiers[k]
            if not delta or (delta < 0 and self._reset_since(identifier, settlement.at_us, now)):
                continue
            entry = self._arrivals.get(identifier)
            if entry is None or entry.expires_us <= now:
                entry = Arrivals()
            held = held_arrival(settlement, leaf)  # under the first leaf's count
            tat, count = entry.stored(field, rule)  # settled at the rate it holds now
            reserved = plan.compiled.rules[leaf]
            settled = gcra_settled(reserved, tat, delta, now, held, count)
            if settled != tat:
                entry.write(field, rule, settled, count)
                self._arrivals[identifier] = entry

    _SETTLE: ClassVar[dict[str, Callable[[SettleTables, Settlement, int], None]]] = {
        SLIDING_LOG: _settle_logs,
        SLIDING_WINDOW: _settle_windows,
        FIXED_WINDOW: _settle_windows,
        GCRA: _settle_arrivals,
    }
