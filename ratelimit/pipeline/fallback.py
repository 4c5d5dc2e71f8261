"""``on_error="local"``: while the store fails, each process decides on its own share.

When a decision fails at the store (``BackendError``: unreachable, timed out, an error), a
limiter with ``on_error="local"`` decides the same call (the same rules, an override in
force included, the same key, selector values, cost and algorithm) on an in-process
:class:`~ratelimit.backends.memory.backend.MemoryBackend` of its own, made at the first failure,
with each rule's count (and GCRA burst) scaled to ``max(1, floor(count * local_share))``.
N processes with ``local_share=1/N`` then admit about the limit between them: an outage is
bounded instead of open (``"allow"``) or closed (``"deny"``).

Local decisions are real decisions (``rule`` — the limit's own rule, not its scaled copy
—, ``remaining`` and ``states`` of the local share, ``retry_after``) marked
``degraded=True``. They record nothing at the store and reserve nothing to settle; their
refusals are not kept in the denial cache (no degraded decision is), so that decisions go
back to the store as soon as it answers.

While the outage lasts, calls do not wait on the dead store: they are decided locally at
once, and one probe at a time (a question that counts nothing, bounded by the backend's
own ``timeout``) asks the store, at most every :data:`PROBE_EVERY` seconds of the monotonic
clock (an injected clock paces the decisions, never the probes). Once it
answers (the probe, or any other call), the outage ends and decisions go back to the
store. With the store healthy nothing of this runs: the only check is the one the failure
policy made already, on a failure or while an outage is under way.

Concurrency slots are taken the same way, on the local store with counts scaled alike,
and given back (and renewed) where they were taken. The command engine's lock timeouts
stay refusals, as under any ``on_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ratelimit.backends.base import Clock
from ratelimit.backends.memory.backend import MemoryBackend
from ratelimit.core.decision import Decision, RuleState, make_decision
from ratelimit.core.plan import PLANS, CompiledTree, Plan, compile_tree
from ratelimit.core.slots import SlotClaim
from ratelimit.errors import ConfigurationError
from ratelimit.rules.tree import Node, Rule

PROBE_EVERY = 0.2
"""Seconds between two probes of a failing store (at most one under way at a time), on the
monotonic clock (:func:`monotonic`), whatever clock the store decides on: a clock injected
for the decisions (tests) may never move, and the store must still be asked again."""

monotonic = time.monotonic
"""The clock the probes are paced on (tests put a fake one here)."""

SCALED_TREES = 4096
"""Scaled trees kept (one per tree decided locally); past it, the cache starts again."""


def scaled_count(count: int, share: float) -> int:
    """``count`` at ``share``: ``max(1, floor(count * share))`` (``1e-9`` forgives a share
    such as 0.29 whose product falls just short of a whole number)."""
    return max(1, math.floor(count * share + 1e-9))


def scaled_tree(node: Node, share: float) -> Node:
    """``node`` with every rule's count and burst at ``share`` (:func:`scaled_count`)."""
    if isinstance(node, Rule):
        burst = None if node.burst is None else scaled_count(node.burst, share)
        return dataclasses.replace(node, count=scaled_count(node.count, share), burst=burst)
    return type(node)(*(scaled_tree(child, share) for child in node.children))


class LocalFallback:
    """One limiter's local store, its scaled trees, and the probe of the failing store.

    ``probe``: a question to the store that counts nothing and raises when it fails
    (``Decider.ping``); ``spawn``: runs a coroutine off the caller's path, finished or
    cancelled when the limiter closes (``Decider.finish_later``). Both are set by the
    limiter once its decider is made.
    """

    def __init__(self, share: float) -> None:
        self.share = share
        self._injected: Clock | None = None
        self._store: MemoryBackend | None = None
        self._making = threading.Lock()
        self._scaled: dict[CompiledTree, CompiledTree] = {}
        self._plans: dict[Plan, tuple[Plan, int | None]] = {}
        """Each plan at this share (plans hash by identity), with the leaf whose share can
        never admit the call's cost, if one cannot."""
        self._next_probe = -math.inf
        self._probing = False
        self.local_claims: set[str] = set()
        """Tokens of the slot claims held on the local store."""
        self.probe: Callable[[], Awaitable[None]] | None = None
        self.spawn: Callable[[Awaitable[Any]], object] | None = None

    def attach(
        self,
        clock: Clock | None,
        probe: Callable[[], Awaitable[None]],
        spawn: Callable[[Awaitable[Any]], object],
    ) -> None:
        """Wire this fallback to its limiter: the clock its store decides on (``None``:
        ``time.monotonic``; the probes are paced on :func:`monotonic` whatever it is); the
        probe; what runs tasks."""
        self._injected = clock
        self.probe = probe
        self.spawn = spawn

    @property
    def store(self) -> MemoryBackend:
        """The local store, made at its first use with the limiter's clock, once: threads
        of the sync API whose calls failed together may reach it at once."""
        store = self._store
        if store is None:
            with self._making:
                if self._store is None:
                    self._store = MemoryBackend(clock=self._injected)
                store = self._store
        return store

    def scaled(self, compiled: CompiledTree) -> CompiledTree:
        """``compiled`` at this process's share, compiled once per tree."""
        scaled = self._scaled.get(compiled)
        if scaled is None:
            if len(self._scaled) >= SCALED_TREES:
                self._scaled.clear()
            scaled = compile_tree(scaled_tree(compiled.tree, self.share))
            self._scaled[compiled] = scaled
        return scaled

    async def decide(self, plan: Plan) -> Decision:
        """``plan`` decided on the local store at this process's share, ``degraded``; its
        rules are the limit's own (not their scaled copies)."""
        compiled = plan.compiled
        entry = self._plans.get(plan)
        if entry is None:
            if len(self._plans) >= PLANS:
                self._plans.clear()
            local = dataclasses.replace(plan, compiled=self.scaled(compiled))
            entry = self._plans[plan] = (local, _beyond(local))
        local, beyond = entry
        if beyond is not None:  # the call costs more than a rule's share can ever admit
            refusing = compiled.rules[beyond]
            span = refusing.span_ms / 1000
            state = RuleState(refusing, beyond, True, 0, span)
            refused = make_decision(False, span, refusing, 0, plan.key, (state,))
            return dataclasses.replace(refused, degraded=True)
        scaled = local.compiled
        decision = await self.store.decide(local)
        rule = decision.rule
        if rule is not None:
            rule = compiled.rules[_leaf_of(scaled, rule)]
        states = decision._states
        return dataclasses.replace(
            decision,
            rule=rule,
            degraded=True,
            _states=None if states is None else lambda: _own_states(decision, compiled),
            _reservation=None,  # recorded here only: nothing to settle at the store
        )

    async def take_slots(self, claim: SlotClaim) -> tuple[bool, tuple[int, ...]]:
        """Take ``claim``'s slots on the local store, each count at this share."""
        counts = tuple(scaled_count(count, self.share) for count in claim.counts)
        taken, held = await self.store.acquire_slots(dataclasses.replace(claim, counts=counts))
        if taken:
            self.local_claims.add(claim.token)
        # the holders as the claim's own counts read them: what is left stays the local one
        both = zip(held, claim.counts, counts, strict=True)
        return taken, tuple(n + full - mine for n, full, mine in both)

    def holds(self, claim: SlotClaim) -> bool:
        """Whether ``claim``'s slots were taken on the local store."""
        return claim.token in self.local_claims

    async def renew_slots(self, claim: SlotClaim) -> bool:
        return await self.store.renew_slots(claim)

    async def release_slots(self, claim: SlotClaim, *, revoke: bool = False) -> None:
        self.local_claims.discard(claim.token)
        await self.store.release_slots(claim, revoke=revoke)

    def spawn_quietly(self, work: Awaitable[Any]) -> None:
        """Run ``work`` off the caller's path; its failure is the outage's, logged already."""
        if self.spawn is None:  # not wired to a limiter: nothing runs it
            if asyncio.iscoroutine(work):
                work.close()
            return
        self.spawn(_quietly(work))

    def maybe_probe(self, answered: Callable[[], None]) -> None:
        """Start one probe of the store unless one is under way or the last began less
        than :data:`PROBE_EVERY` seconds ago; ``answered`` runs when the store answers."""
        now = monotonic()
        if self._probing or now < self._next_probe or self.probe is None or self.spawn is None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the sync API's direct path, in a caller's thread: the next
            return  # call goes to the limiter's loop (an outage is under way), which probes
        self._next_probe = now + PROBE_EVERY
        self._probing = True
        self.spawn(self._probe(self.probe, answered))

    async def _probe(
        self, probe: Callable[[], Awaitable[None]], answered: Callable[[], None]
    ) -> None:
        try:
            await probe()
        except Exception:  # still failing (or closed): the next call probes again later
            return
        finally:
            self._probing = False
        answered()


async def _quietly(work: Awaitable[Any]) -> None:
    with contextlib.suppress(Exception):
        await work


def _beyond(plan: Plan) -> int | None:
    """The first leaf of ``plan`` whose rule refuses its cost however little is counted
    (a share's count, or burst, below it), as :mod:`ratelimit.overrides.lowered` finds for an
    override: the store's evaluators take only costs a rule can admit at once."""
    for leaf, rule in enumerate(plan.compiled.rules):
        if plan.leaf_identifiers[leaf] < 0:  # its selector did not resolve: counts nothing
            continue
        try:
            plan.algorithm.check_rule(rule, plan.leaf_cost(leaf))
        except ConfigurationError:
            return leaf
    return None


def _leaf_of(scaled: CompiledTree, rule: Rule) -> int:
    """The position of ``rule`` (a rule of ``scaled``, by identity) among its rules."""
    for leaf, candidate in enumerate(scaled.rules):
        if candidate is rule:
            return leaf
    return scaled.rules.index(rule)


def _own_states(decision: Decision, compiled: CompiledTree) -> tuple[Any, ...]:
    """The local decision's states, each naming the limit's own rule."""
    return tuple(s._replace(rule=compiled.rules[s.leaf]) for s in decision.states)
