"""The denial cache (an edge limiter's circuit breaker): a refusal remembered until it would lift.

A denied decision is kept in-process for exactly that call (rules, key, selector values,
cost, algorithm) until its ``retry_after`` runs out, and the same call is refused from here
without asking the storage. This can never admit a call the storage would refuse: only
refusals are cached, and admitted calls always go to the storage. A refund through this
limiter's ``increment(..., -1)`` forgets the refusals of that key; room freed elsewhere (a
refund from another process, keys deleted by hand) can leave a call refused here a little
longer than needed. Bounded: the oldest entries go first.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Protocol

from ratelimit.core.decision import Decision, RuleState, make_decision


class Call(Hashable, Protocol):
    """What names a call in the cache (a :class:`~ratelimit.pipeline.decider.CallKey`)."""

    @property
    def namespace(self) -> str: ...

    @property
    def key(self) -> str: ...


class DenialCache:
    """Refusals by call, until they lift. ``size`` 0 turns the cache off."""

    def __init__(self, size: int = 10_000, clock: Callable[[], float] | None = None) -> None:
        self.size = size
        self._clock = clock or time.monotonic
        self.longest: float | None = None
        """Seconds a refusal is held at most (``None``: until its ``retry_after``): with
        leases, room held in another process's lease comes back within its hold, and the
        store is asked again then (:mod:`ratelimit.backends.leases`)."""
        self._until: OrderedDict[Call, tuple[float, Decision, float]] = OrderedDict()
        self.held = self._until
        """The refusals held, by call (read-only: its truth says whether any is)."""
        self._keys: dict[tuple[str, str], int] = {}
        """How many refusals are held per (namespace, key): a refund of a key with none
        (most refunds: every settle below its reservation) walks nothing."""

    def __len__(self) -> int:
        return len(self._until)

    def get(self, call: Call) -> Decision | None:
        """The refusal still standing for ``call``, with its ``retry_after`` brought up to
        date, or ``None``."""
        if not self._until:
            return None
        entry = self._until.get(call)
        if entry is None:
            return None
        kept, decision, until = entry
        now = self._clock()
        if kept <= now:
            del self._until[call]
            self._dropped(call)
            return None
        left = until - now
        states = functools.partial(_later, decision, decision.retry_after - left)
        return make_decision(False, left, decision.rule, 0, decision.key, states)

    def forget(self, namespace: str, key: str) -> None:
        """Drop every refusal of one (namespace, key): room was given back there."""
        if self._keys.pop((namespace, key), None) is None:
            return
        for call in [c for c in self._until if c.key == key and c.namespace == namespace]:
            del self._until[call]

    def clear(self) -> None:
        """Drop every refusal held (counters were reset somewhere)."""
        self._until.clear()
        self._keys.clear()

    def remember(self, call: Call, decision: Decision) -> None:
        """Keep a refusal until its ``retry_after`` has passed."""
        if self.size <= 0 or decision.allowed or decision.degraded or decision.retry_after <= 0:
            return
        held = self._until
        if call not in held:
            named = (call.namespace, call.key)
            self._keys[named] = self._keys.get(named, 0) + 1
        now = self._clock()
        until = now + decision.retry_after
        longest = self.longest
        held[call] = (until if longest is None else min(until, now + longest), decision, until)
        held.move_to_end(call)
        while len(held) > self.size:
            self._dropped(held.popitem(last=False)[0])

    def _dropped(self, call: Call) -> None:
        """Count out a refusal no longer held."""
        named = (call.namespace, call.key)
        left = self._keys[named] - 1
        if left:
            self._keys[named] = left
        else:
            del self._keys[named]


def _later(decision: Decision, elapsed: float) -> tuple[RuleState, ...]:
    """The storage's per-rule states of a refusal, ``elapsed`` seconds on: the same counts
    (what came back meanwhile is not known here), their times that much shorter."""
    return tuple(
        state._replace(reset_after=max(state.reset_after - elapsed, 0.0))
        for state in decision.states
    )
