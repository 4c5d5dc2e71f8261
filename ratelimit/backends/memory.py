"""The in-process backend (``memory://``): the sliding log of the Redis script, in a dict.

Decisions in one process only; nothing is shared with other processes. Safe for many
coroutines and threads at once (a decision takes no await between counting and recording).
Identifiers whose logs have expired are swept away, so memory follows the live identifiers.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from ratelimit.algorithms import US_PER_MS, window
from ratelimit.backends.base import Clock, clock_us
from ratelimit.decision import Decision
from ratelimit.plan import (
    Identifier,
    Plan,
    evaluate,
    limits_per_identifier,
)


class _Log:
    """One identifier's hit timestamps (microseconds, newest first) and its expiry."""

    __slots__ = ("expires_us", "hits")

    def __init__(self) -> None:
        self.hits: deque[int] = deque()
        self.expires_us = 0


class MemoryBackend:
    """Sliding logs in this process's memory.

    ``clock`` (seconds, default ``time.monotonic``) may be replaced by a fake one in tests;
    ``sweep_every`` is how many decisions pass between sweeps of expired identifiers.

    Example::

        rl = RateLimit(MemoryBackend())      # the same as RateLimit.from_url("memory://")
    """

    def __init__(self, *, clock: Clock | None = None, sweep_every: int = 1024) -> None:
        self._clock: Clock = clock or time.monotonic
        self._logs: dict[Identifier, _Log] = {}
        self._lock = threading.Lock()
        self._sweep_every = max(1, sweep_every)
        self._since_sweep = 0

    def __len__(self) -> int:
        """How many identifiers hold live logs."""
        return len(self._logs)

    async def decide(self, plan: Plan) -> Decision:
        with self._lock:
            return self._decide(plan)

    def _decide(self, plan: Plan) -> Decision:
        now = clock_us(self._clock)
        self._since_sweep += 1
        if self._since_sweep >= self._sweep_every:
            self._sweep(now)
        logs = [self._live(identifier, now) for identifier in plan.identifiers]
        counts: list[tuple[int, int]] = []
        for rule, i in zip(plan.compiled.rules, plan.leaf_identifiers, strict=True):
            if i < 0:
                counts.append((0, 0))
            else:
                threshold = now - rule.span_ms * US_PER_MS
                counts.append(window(logs[i].hits, plan.depth(rule), threshold))
        decision = evaluate(plan, now, counts)
        if decision.allowed:
            for identifier, log, (keep, span_ms) in zip(
                plan.identifiers, logs, limits_per_identifier(plan), strict=True
            ):
                hits = log.hits
                stamp = max(now, hits[0]) if hits else now
                hits.extendleft([stamp] * min(int(plan.cost), keep))
                while len(hits) > keep:
                    hits.pop()
                log.expires_us = max(log.expires_us, now + span_ms * US_PER_MS)
                self._logs[identifier] = log
        return decision

    def _live(self, identifier: Identifier, now: int) -> _Log:
        log = self._logs.get(identifier)
        if log is None or log.expires_us <= now:
            return _Log()
        return log

    def _sweep(self, now: int) -> None:
        self._since_sweep = 0
        expired = [i for i, log in self._logs.items() if log.expires_us <= now]
        for identifier in expired:
            del self._logs[identifier]

    async def aclose(self) -> None:
        with self._lock:
            self._logs.clear()
