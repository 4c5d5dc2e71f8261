"""Leases (``lease=``): one hot shared limit decided in-process, never over the limit.

:class:`LeasedBackend` stands in front of a store. For a leased limit, a call that finds no
lease asks the store for a slice of the limit in one decision, of the slice's whole cost
(:mod:`.sizing` sizes it): the store counts the slice at once, atomically, as it would count
that many calls, or refuses it. The calls that follow take their cost from the slice, with no
round trip, until it is used up or its hold ends; what is left then is given back by a
settle (the refund rules of :mod:`ratelimit.core.settling`: only what the reservation still
holds). Because the store counted every call of a slice before any was admitted, a leased
limit admits no more than the store would have, call by call; what leases cost is capacity
held unused in one process for at most a hold, which :mod:`.sizing` keeps small near the
limit (per-call decisions there, exact as without leases).

Leased: a decision that records (not a peek), of one cost on every identifier, of a tree of
single rules and ``|`` (``Or``), on the sliding log or the window counters. An ``&`` tree
(``And``: limited only when every side is) decides per call: a slice of it admitted would let
calls through on one side's room while counting them on the other's, which a lease could not
give back exactly. GCRA decides per call too: a slice taken at once lets the bucket refill
while its calls are still to come, so calls admitted from it later could pass the bucket
by its rate times the hold.

Every call is admitted no earlier than its slice was counted, and no later than when the
store counts it for good: the window counters end a lease where the store's window ends, so
that every call a slice admits is admitted in the window that counted it; the sliding log
stamps the calls a lease admitted again when it ends (recorded now, then the slice's
stamps taken back, in that order: the store over-counts for a moment, never under), so that
no stamp is older than its call. A call admitted from a lease settles (``settle=``,
``count_when=``) against it: a refund goes back to the lease while it lasts, an excess is
recorded at once.

A lease held when the store fails is spent (its calls were counted); then the failure policy
answers. ``reset`` ends this process's leases of its identifiers without giving back (the
store forgets their counts). ``aclose`` gives back every lease, then closes the store. A
process that dies holding a lease leaves it counted: it ages out with its window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import time
from typing import TYPE_CHECKING, Any

from ratelimit.algorithms import Algorithm
from ratelimit.backends.base import (
    Backend,
    Clock,
    Forwarded,
    SettleStore,
    check_settles,
    clock_of,
)
from ratelimit.backends.leases.sizing import Sizer
from ratelimit.core.decision import Decision, RuleState, make_decision
from ratelimit.core.plan import PLANS, CompiledTree, CounterUpdate, Identifier, Plan
from ratelimit.core.settling import Settlement, reservation, settlement
from ratelimit.rules.tree import And, Node, Rule

if TYPE_CHECKING:
    from ratelimit.backends.memory.admit import AdmitIdentified

_UNSEEN: Any = object()
"""A plan :class:`LeasedBackend` has not looked at yet."""

logger = logging.getLogger("ratelimit")

GIVE_BACK_WITHIN = 5.0
"""Seconds ``aclose`` waits for the give-backs under way."""


def leasable(compiled: CompiledTree) -> bool:
    """Whether calls of ``compiled`` may be leased: single rules and ``|`` only."""

    def plain(node: Node) -> bool:
        if isinstance(node, Rule):
            return True
        if isinstance(node, And):
            return False
        return all(plain(child) for child in node.children)

    return plain(compiled.tree)


def _shared_states(decided: Decision | None, left: float) -> tuple[RuleState, ...]:
    """The rules' states of a call admitted from a slice decided ``decided``, ``left``
    remaining in the lease after it: each rule has what the store said it had after the
    slice, and what the lease still holds."""
    if decided is None:
        return ()
    return tuple(state._replace(remaining=int(state.remaining + left)) for state in decided.states)


class LeaseShare:
    """A call admitted from a lease, as its decision's reservation: what settling it does
    (:meth:`settled`, which ``Decider.settle`` asks; a second settle finds the
    :class:`~ratelimit.core.settling.Settling` it left there, as for a call decided alone)."""

    __slots__ = ("cost", "generation", "lease", "plan")

    def __init__(self, lease: _Lease, plan: Plan) -> None:
        self.lease = lease
        self.generation = lease.generation
        self.plan = plan
        self.cost = plan.cost

    def settled(self, actual: float | tuple[float, ...]) -> Settlement:
        """Settle the call at ``actual`` (checked already): a refund goes back to its
        lease while the lease lasts (after it, what the lease gave back stands); the
        excess is the :class:`Settlement` to record now (empty: none)."""
        plan, lease = self.plan, self.lease
        actuals = actual if isinstance(actual, tuple) else (actual,) * len(plan.leaf_identifiers)
        refund = min(max(self.cost - a, 0.0) for a in actuals)
        if refund and lease.generation == self.generation and lease.reserved is not None:
            lease.left += refund
        deltas = tuple(
            max(a - self.cost, 0.0) if k >= 0 else 0.0
            for a, k in zip(actuals, plan.leaf_identifiers, strict=True)
        )
        return Settlement(plan, 0, deltas)


class _Lease:
    """One limit's lease in this process: what is left of its slice, until when, and what
    giving it back needs (``reserved``: the slice's decision)."""

    __slots__ = (
        "decided",
        "ends",
        "generation",
        "giving",
        "left",
        "most",
        "plans",
        "refilling",
        "remaining",
        "reserved",
        "rule",
        "sizer",
        "timer",
    )

    def take(self, cost: float, now: float) -> bool:
        """Take ``cost`` from the slice if it holds that much and has not ended at ``now``
        (the lease clock's reading)."""
        if self.left < cost or now >= self.ends:
            return False
        self.left -= cost
        self.sizer.asked(cost)
        return True

    def __init__(self, hold: float, most: float) -> None:
        self.left = 0.0
        self.ends = 0.0
        self.reserved: Decision | None = None
        """The slice's decision, until it is given back."""
        self.decided: Decision | None = None
        """The last slice's decision (its rules' states, for the calls it admits)."""
        self.remaining: float | None = None
        """What the store said the limit had left after the last slice (``None``: unknown)."""
        self.rule: Rule | None = None
        self.most = most
        self.sizer = Sizer(hold)
        self.refilling: asyncio.Future[None] | None = None
        self.giving: asyncio.Future[None] | None = None
        """The last give-back of this lease's slices, while it is written."""
        self.timer: asyncio.TimerHandle | None = None
        self.generation = 0
        self.plans: dict[float, Plan] = {}
        """The slice plans, by size."""


_FORWARDING: dict[tuple[type, type, frozenset[str]], type[LeasedBackend]] = {}
"""The class of the leased stores, by leased class, store class and the store's methods."""


def _forwarding(cls: type[LeasedBackend], store: object) -> type[LeasedBackend]:
    """A subclass of ``cls`` holding a :class:`~ratelimit.backends.base.Forwarded` for
    each public method of ``store`` that ``cls`` has not: the store's capabilities, and no
    more."""
    names = frozenset(
        name
        for name in dir(store)
        if not name.startswith("_")
        and not hasattr(cls, name)
        and callable(inspect.getattr_static(store, name, None))
    )
    kind = _FORWARDING.get((cls, type(store), names))
    if kind is None:
        methods = {name: Forwarded(name) for name in names}
        kind = _FORWARDING[cls, type(store), names] = type(cls.__name__, (cls,), methods)
    return kind


class LeasedBackend:
    """A store behind leases (``RateLimit(..., lease=seconds)``): see the module.

    ``hold``: seconds a lease lasts at most (0: limits decide per call unless
    :meth:`hold_for` says otherwise). ``clock``: the lease clock (default: the store's
    injected clock when it has one, else ``time.monotonic``). Every capability of the store
    (settle, overrides, slots, its algorithms) is the store's own."""

    def __new__(cls, store: Backend, hold: float, clock: Clock | None = None) -> LeasedBackend:
        return object.__new__(_forwarding(cls, store))

    def __init__(self, store: Backend, hold: float, clock: Clock | None = None) -> None:
        check_settles(store)
        self.store = store
        self.hold = hold
        self._holds: dict[tuple[str, str], float] = {}
        self._leases: dict[tuple[CompiledTree, tuple[Identifier, ...]], _Lease] = {}
        injected = clock_of(store)
        self._timed = clock is None and injected is None
        self._clock: Clock = clock or injected or time.monotonic
        self._giving: set[asyncio.Future[Any]] = set()
        self._by_one: dict[tuple[CompiledTree, Identifier], _Lease] = {}
        """The leases of single identifiers (:meth:`identified`)."""
        self._by_plan: dict[Plan, _Lease | None] = {}
        """The lease of each plan seen (``None``: decided per call), by identity (plans are
        shared: :data:`PLANS`)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def hold_for(self, namespace: str, key: str, seconds: float) -> None:
        """Lease the limit of ``key`` for ``seconds`` (``limit(..., lease=)``; 0: per call)."""
        self._holds[namespace, key] = seconds
        self._by_plan.clear()  # looked up again, with this hold

    async def decide(self, plan: Plan) -> Decision:
        lease = self._by_plan.get(plan, _UNSEEN)
        if lease is _UNSEEN:
            lease = self._leased(plan)
        if lease is None:  # decided per call
            return await self.store.decide(plan)
        cost = plan.cost
        while True:
            if lease.take(cost, self._clock()):
                left = lease.remaining
                return make_decision(
                    True, 0.0, lease.rule, None if left is None else int(left + lease.left),
                    plan.key, functools.partial(_shared_states, lease.decided, lease.left),
                    [LeaseShare(lease, plan)],
                )  # fmt: skip
            if lease.refilling is None:
                return await self._refill(lease, plan)
            await asyncio.shield(lease.refilling)  # a slice is on its way: then look again

    async def admits(self, plan: Plan) -> Decision | None:
        """:meth:`decide`, answering ``None`` for an admission (the direct path's), which
        a lease answers without building a decision."""
        lease = self._by_plan.get(plan)
        if lease is not None and lease.take(plan.cost, self._clock()):
            return None
        decision = await self.decide(plan)
        return None if decision.allowed else decision

    def admitter(self, compiled: CompiledTree, algorithm: Algorithm) -> None:
        """None: a call a lease cannot admit needs a coroutine (:meth:`admits`)."""
        return None

    def identified(self, compiled: CompiledTree, algorithm: Algorithm) -> AdmitIdentified:
        """The fused direct path's admission (:mod:`ratelimit.front.fused`): a call taken
        from the live lease of its identifier (``True``), else ``False``, nothing done, for
        the direct path to decide (which takes a new slice)."""
        leases, clock = self._by_one, self._clock

        def take(identifier: Identifier, cost: float = 1) -> bool:
            lease = leases.get((compiled, identifier))
            return lease is not None and lease.take(cost, clock())

        return take

    def _leased(self, plan: Plan) -> _Lease | None:
        """The lease of ``plan``'s limit in this process (made now if need be), or ``None``
        when its calls are decided one by one (see the module); kept by plan either way, so
        a plan's next call does not ask again."""
        hold = self._holds.get((plan.namespace, plan.key), self.hold) if self._holds else self.hold
        lease = None
        if (
            hold
            and plan.record
            and not plan.costs
            and plan.identifiers
            and plan.algorithm.leases
            and leasable(plan.compiled)
        ):
            lease = self._leases.get((plan.compiled, plan.identifiers))
            if lease is None:
                lease = self._lease(plan, hold)
        if len(self._by_plan) >= PLANS:
            self._by_plan.clear()
        self._by_plan[plan] = lease
        return lease

    def _lease(self, plan: Plan, hold: float) -> _Lease:
        if len(self._leases) >= PLANS:
            self._prune()
        rules = plan.compiled.rules
        resolved = [rules[leaf] for leaf, k in enumerate(plan.leaf_identifiers) if k >= 0]
        most = min(rule.burst or rule.count for rule in resolved)
        lease = self._leases[plan.compiled, plan.identifiers] = _Lease(hold, most)
        if len(plan.identifiers) == 1:
            self._by_one[plan.compiled, plan.identifiers[0]] = lease
        return lease

    def _prune(self) -> None:
        """Forget the leases holding nothing (no slice, none on its way or given back):
        one per limit and identifiers seen would otherwise grow without bound."""
        idle = [
            found
            for found, lease in self._leases.items()
            if lease.reserved is None
            and lease.refilling is None
            and (lease.giving is None or lease.giving.done())
        ]
        for found in idle:
            del self._leases[found]
        kept = {id(lease) for lease in self._leases.values()}
        for one in [k for k, lease in self._by_one.items() if id(lease) not in kept]:
            del self._by_one[one]  # in place: the fused paths hold this dict
        self._by_plan.clear()

    async def _refill(self, lease: _Lease, plan: Plan) -> Decision:
        """Take a new slice for a call of ``plan``, once the old one is given back: the
        store then holds no room of this process's twice (the sliding log's calls stamped
        again, then its slice taken back), and what came back counts in the next size.
        Callers meanwhile wait for this refill."""
        self._end(lease)
        giving = lease.giving
        if giving is not None and not giving.done():
            waited = lease.refilling = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait([giving])  # its errors are logged by _given
            finally:
                lease.refilling = None
                waited.set_result(None)
        cost = plan.cost
        now = self._clock()
        size = lease.sizer.size(now, cost, lease.remaining, lease.most)
        if size <= cost:  # one call: decided as without leases
            decision = await self.store.decide(plan)
            lease.remaining = decision.remaining if decision.allowed else 0
            return decision
        sliced = lease.plans.get(size)
        if sliced is None:
            sliced = lease.plans[size] = dataclasses.replace(plan, cost=size)
        lease.refilling = asyncio.get_running_loop().create_future()
        generation = lease.generation  # a reset meanwhile moves it
        try:
            decision = await self.store.decide(sliced)
        finally:
            lease.refilling.set_result(None)
            lease.refilling = None
        if decision.allowed and lease.generation != generation:  # the store forgot the slice
            return make_decision(
                True, 0.0, decision.rule, None, plan.key, None, [LeaseShare(lease, plan)]
            )  # the call, admitted before the reset as any call; its slice not used
        if not decision.allowed:  # no room for the slice: the call alone
            lease.remaining = 0
            decision = await self.store.decide(plan)
            if decision.allowed:
                lease.remaining = decision.remaining
            return decision
        lease.remaining = decision.remaining
        lease.rule = decision.rule
        lease.reserved = lease.decided = decision
        lease.left = size - cost
        lease.ends = now + self._held(lease.sizer.hold, decision)
        lease.generation += 1
        if self._timed:
            lease.timer = asyncio.get_running_loop().call_later(
                lease.ends - now, self._expired, lease, lease.generation
            )
        left = decision.remaining
        return make_decision(
            True, 0.0, decision.rule, None if left is None else int(left + lease.left),
            plan.key, functools.partial(_shared_states, decision, lease.left),
            [LeaseShare(lease, plan)],
        )  # fmt: skip

    @staticmethod
    def _held(hold: float, decision: Decision) -> float:
        """How long a slice may be used: ``hold``; for the window counters no further than
        the end of the store's window it was counted in; for the sliding log a quarter of
        the shortest span at most (its stamps must still count when they are stamped
        again: :meth:`_end`)."""
        reserved = decision._reservation
        if not reserved:
            return hold
        plan, at_us = reserved[0], reserved[1]
        rules = plan.compiled.rules
        for leaf, k in enumerate(plan.leaf_identifiers):
            if k >= 0:
                span_us = rules[leaf].span_ms * 1000
                if plan.algorithm.windowed:
                    hold = min(hold, (span_us - at_us % span_us) / 1_000_000)
                else:
                    hold = min(hold, span_us / 4_000_000)
        return hold

    def _expired(self, lease: _Lease, generation: int) -> None:
        if lease.generation == generation:
            self._end(lease)

    def _end(self, lease: _Lease) -> None:
        """End ``lease``: give back what is left of its slice (on the sliding log, its
        calls stamped again first)."""
        if lease.timer is not None:
            lease.timer.cancel()
            lease.timer = None
        decided, left = lease.reserved, lease.left
        lease.reserved = None
        lease.left = 0.0
        if decided is None:
            return
        reserved = reservation(decided)
        if reserved is None:
            return
        plan, at_us, counts, *times = reserved
        used = plan.cost - left
        if left <= 0 and not plan.algorithm.stamps:
            return
        if plan.algorithm.stamps and used > 0:  # the calls it admitted, stamped again now
            stamped = tuple(used if k >= 0 else 0.0 for k in plan.leaf_identifiers)
            writes = [Settlement(plan, 0, stamped), settlement(plan, at_us, counts, 0, *times)]
        else:
            writes = [settlement(plan, at_us, counts, used, *times)]
        if writes[-1].empty:
            return
        if lease.remaining is not None:
            lease.remaining += left
        task = lease.giving = asyncio.ensure_future(self._write(writes))
        self._giving.add(task)
        task.add_done_callback(self._given)

    async def _write(self, writes: list[Settlement]) -> None:
        """Record ``writes`` in order: each after the one before it is recorded."""
        store: SettleStore = self.store  # type: ignore[assignment]  # checked when made
        for write in writes:
            await store.settle(write)

    def _given(self, task: asyncio.Future[Any]) -> None:
        self._giving.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:  # what it held stays counted, and ages out with its window
            logger.warning("ratelimit: a lease could not be given back (%s)", error)

    async def reset(self, plan: Plan) -> None:
        """End this process's leases on ``plan``'s identifiers (nothing given back: the
        store forgets them), wait for their give-backs under way (a sliding log's calls
        stamped again after the reset would count calls made before it), then reset the
        store."""
        gone = set(plan.identifiers)
        writing = []
        for (_, identifiers), lease in self._leases.items():
            if gone.intersection(identifiers):
                if lease.timer is not None:
                    lease.timer.cancel()
                    lease.timer = None
                lease.reserved = None
                lease.left = 0.0
                lease.remaining = None
                lease.generation += 1  # a slice on its way is not used: the store forgets it
                lease.sizer.forget()
                if lease.giving is not None and not lease.giving.done():
                    writing.append(lease.giving)
        if writing:
            await asyncio.wait(writing, timeout=GIVE_BACK_WITHIN)
        await self.store.reset(plan)

    async def update_counter(self, update: CounterUpdate) -> float:
        return await self.store.update_counter(update)

    async def give_back(self) -> None:
        """End every lease, giving back what is left, and wait for the give-backs (at
        most :data:`GIVE_BACK_WITHIN` seconds)."""
        for lease in self._leases.values():
            self._end(lease)
        if self._giving:
            await asyncio.wait(list(self._giving), timeout=GIVE_BACK_WITHIN)

    async def aclose(self) -> None:
        """Give every lease back (:meth:`give_back`), then close the store."""
        await self.give_back()
        await self.store.aclose()
