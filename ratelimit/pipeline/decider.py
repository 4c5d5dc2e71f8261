"""The decision pipeline: denial cache, background counting, failure policy, backend, hooks.

A :class:`~ratelimit.RateLimit` makes one :class:`Decider` for itself. The decorator and
``async with`` of :mod:`ratelimit.front.limit` name a call with a :class:`CallKey` and ask
:meth:`Decider.decide`; the HTTP middleware, the service and your own front ends ask
:meth:`RateLimit.decide <ratelimit.RateLimit.decide>`, which does the same. A plain limit's
decorated calls take a shorter way where they can (:mod:`ratelimit.front.direct` through
:meth:`Decider.ask`, :mod:`ratelimit.front.fused`), and come here for anything it does not
cover; docs/architecture.md names every way in and what keeps each deciding as this one.
Concurrency slots take, renew and give back through
:meth:`Decider.take_slots` and its siblings, under the same failure policy and hooks.

Example::

    tree = compile_tree(to_tree("user:5/s"))
    decision = await rl.decide(tree, "search", ("vova",))
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, cast

from ratelimit.algorithms import Algorithm
from ratelimit.backends.base import Backend, SettleStore, SlotStore, check_settles, holds_slots
from ratelimit.backends.leases import LeasedBackend, LeaseShare
from ratelimit.backends.synced import SyncedBackend
from ratelimit.core.checks import LEASE_WITH_SYNC_RATE
from ratelimit.core.costs import per_leaf
from ratelimit.core.decision import Decision, HeldDecision, make_decision
from ratelimit.core.plan import CompiledTree, Cost, CounterUpdate, Plan, cached_plan, compile_tree
from ratelimit.core.settling import Settlement, Settling, reservation, settlement
from ratelimit.core.slots import SlotClaim
from ratelimit.errors import (
    BackendError,
    ConfigurationError,
    LimiterClosedError,
    LockTimeoutError,
    RateLimitError,
)
from ratelimit.overrides.cache import OverrideCache
from ratelimit.overrides.lowered import Never, Overriding, refusal
from ratelimit.pipeline import settle_writes
from ratelimit.pipeline.background import BackgroundCounter
from ratelimit.pipeline.denials import DenialCache
from ratelimit.pipeline.hooks import Hooks
from ratelimit.pipeline.policy import FailurePolicy
from ratelimit.rules.tree import Rule


class CallKey(NamedTuple):
    """What identifies one call. Calls with equal keys share one plan, and one cached
    refusal in the denial cache."""

    compiled: CompiledTree
    namespace: str
    key: str
    values: tuple[str | None, ...]
    """Selector values, in the order of ``compiled.selectors``."""
    cost: Cost
    """What the call counts: one number, or one per leaf (:data:`~ratelimit.core.plan.Cost`)."""
    algorithm: Algorithm | str
    """The algorithm, or its name."""


Asker = Callable[[Plan], Awaitable[Decision]]
"""What asks the store for a plan's decision in :meth:`Decider.decide`'s place."""

SLOT_RETRY = 0.25
"""``retry_after`` of a call refused for want of a slot: when it looks again (at most)."""

_PING = compile_tree(Rule(1, 1000))
PING_KEY = "ratelimit.store"
"""The key :meth:`Decider.ping` asks about (recording nothing)."""

shadow_logger = logging.getLogger("ratelimit.shadow")
logger = logging.getLogger("ratelimit")
"""Where shadow refusals are logged (INFO), one line each: filter or silence it by name."""

_clock = time.perf_counter

FINISH_WITHIN = 10.0
"""How long closing a limiter waits for the slot give-backs still under way (seconds)."""

new_call_key = tuple.__new__
"""``new_call_key(CallKey, (compiled, namespace, ...))``: a :class:`CallKey` built in C."""


class Decider:
    """One limiter's pipeline: a refusal still standing is answered from the denial cache;
    with background counting a call is admitted at once and counted later; otherwise the
    backend decides, under the failure policy. Every decision reaches the hooks.

    Once ``closed`` (``RateLimit.aclose`` sets it), every call raises ``LimiterClosedError``.
    ``closed`` is the limiter's one record of being closed; a backend keeps its own only
    because it can be used, and closed, without a limiter.
    """

    __slots__ = (
        "_unfinished",
        "algorithm",
        "backend",
        "background",
        "closed",
        "denials",
        "hooks",
        "namespace",
        "overrides",
        "policy",
    )

    def __init__(
        self,
        namespace: str,
        algorithm: Algorithm,
        backend: Backend,
        policy: FailurePolicy,
        denials: DenialCache,
        hooks: Hooks,
        background: BackgroundCounter | None,
        overrides: OverrideCache | None = None,
    ) -> None:
        self.namespace = namespace
        self.overrides = overrides
        """The limiter's copy of its overrides (``None``: its store keeps none)."""
        self.algorithm = algorithm
        self.backend = backend
        self.policy = policy
        self.denials = denials
        self.hooks = hooks
        self.background = background
        self.closed = False
        self._unfinished: set[asyncio.Future[Any]] = set()

    def finish_later(
        self, work: Awaitable[Any], then: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> asyncio.Future[Any]:
        """Run ``work`` off its caller's path (a slot given back after its caller left),
        and finish it before the limiter closes (:meth:`finish`); ``then``: called with it
        once it ended (in the same callback: one per settle, not two). Its errors are its
        own to log."""
        task = asyncio.ensure_future(work)
        unfinished = self._unfinished
        unfinished.add(task)  # kept until done: the loop holds tasks only weakly
        if then is None:
            task.add_done_callback(unfinished.discard)
        else:
            task.add_done_callback(functools.partial(_ended_then, unfinished.discard, then))
        return task

    async def finish(self, seconds: float = FINISH_WITHIN) -> None:
        """Wait for the work :meth:`finish_later` runs (and any it starts meanwhile) for up
        to ``seconds``; cancel what is left (a slot not given back then ends with its
        lease), so that nothing is left pending when the event loop closes."""
        deadline = asyncio.get_running_loop().time() + seconds
        while self._unfinished:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                for task in self._unfinished:
                    task.cancel()
                await asyncio.gather(*self._unfinished, return_exceptions=True)
                return
            await asyncio.wait(list(self._unfinished), timeout=left)

    def check_open(self) -> None:
        """Raise ``LimiterClosedError`` once the limiter was closed."""
        if self.closed:
            raise LimiterClosedError()

    async def decide(
        self,
        call: CallKey,
        record: bool = True,
        shadow: bool = False,
        within: float | None = None,
        override: Overriding = False,
        hold: Asker | None = None,
    ) -> Decision:
        """Decide ``call``; with ``record=False`` only say what would be decided. With
        ``shadow``, a refusal comes back marked ``shadow=True`` (and is logged): the front
        end lets the call through. Nothing else changes: a refused call records nothing,
        and the refusal is remembered in the denial cache as any other. ``within``: seconds
        the whole decision may take, past which the failure policy answers. ``override``:
        ``call``'s rules are an override's (the decision says so); a rule of them instead:
        one that can never admit the call's cost, which it refuses without asking the
        storage; or :class:`~ratelimit.overrides.lowered.Never`: the call's own rules can
        never admit its cost (refused alike, :mod:`ratelimit.overrides.lowered`).
        ``hold``: asks the store in the backend's ``decide``'s place (a penalty's, which
        reads its hold in the same step: :mod:`ratelimit.penalties.penalizer`); a
        :class:`HeldDecision` it answers is told to the hooks and returned as it is (not a
        refusal of the rules)."""
        if within is not None:
            return await self._decide_within(call, record, shadow, within, override)
        if self.closed:
            raise LimiterClosedError()
        started = _clock() if self.hooks.timed else 0.0
        decision = (  # still refused: the storage is not asked again
            self.denials.get(call)
            if override.__class__ is bool
            else refusal(call.compiled, call.key, override)  # type: ignore[arg-type]
        )
        if decision is None and self.background is not None and record:
            self.background.submit(call, cached_plan(*call))  # admitted now, counted later
            decision = make_decision(True, 0.0, None, None, call.key)
        elif decision is None:
            decision = await self.ask(cached_plan(*call, record), hold)
            if decision.__class__ is HeldDecision:
                if self.hooks:
                    self.hooks(decision, _clock() - started if started else 0.0)
                return decision
            if not decision.allowed:
                self.denials.remember(call, decision)
        if override and override.__class__ is not Never:
            decision = dataclasses.replace(decision, override=True)
        if shadow and not decision.allowed:
            decision = _shadowed(decision)
        if self.hooks:
            self.hooks(decision, _clock() - started if started else 0.0)
        return decision

    def refused(
        self, call: CallKey, decision: Decision, shadow: bool, started: float | None = None
    ) -> Decision:
        """What :meth:`decide` does with a refusal the store gave the direct path
        (:mod:`ratelimit.front.direct`): remembered in the denial cache, let through marked
        ``shadow`` (logged) under ``shadow``, and told to the hooks when ``started`` is
        given (:meth:`tell`)."""
        self.denials.remember(call, decision)
        if shadow:
            decision = _shadowed(decision)
        if started is not None:
            self.tell(decision, started)
        return decision

    @property
    def told(self) -> bool:
        """Whether hooks read its decisions (the direct path then builds them whole)."""
        return bool(self.hooks)

    def started(self) -> float:
        """When a decision the direct path will :meth:`tell` started, for timed hooks
        (``0.0``: none is timed, and the clock is not read)."""
        return _clock() if self.hooks.timed else 0.0

    def tell(self, decision: Decision, started: float) -> None:
        """Tell the hooks of a decision of the direct path, as :meth:`decide` does (it took
        since ``started``: :meth:`started`)."""
        if self.hooks:
            self.hooks(decision, _clock() - started if started else 0.0)

    async def ask(self, plan: Plan, hold: Asker | None = None) -> Decision:
        """The store's decision of ``plan`` (asked by ``hold``, when given: :meth:`decide`),
        or the failure policy's when it fails."""
        if self.policy.outage_started is not None:  # an outage under way: rarely
            return await self.policy.decide(self.backend, plan)
        try:
            return await (self.backend.decide(plan) if hold is None else hold(plan))
        except BackendError as exc:
            return await self.policy.failed_plan(exc, plan)
        except LockTimeoutError as exc:
            return self.policy.lock_timed_out(exc, plan.key)

    async def _decide_within(
        self, call: CallKey, record: bool, shadow: bool, within: float, override: Overriding
    ) -> Decision:
        started = _clock()
        try:
            return await asyncio.wait_for(
                self.decide(call, record, shadow, override=override), within
            )
        except TimeoutError:  # the hooks never saw it: they see the policy's answer
            late = BackendError(f"the decision of key {call.key!r} took over {within:g} s")
            decision = await self.policy.failed_plan(late, cached_plan(*call, record))
            if self.hooks:
                self.hooks(decision, _clock() - started)
            return decision

    async def ping(self, within: float | None) -> None:
        """Ask the backend a question that counts nothing, past the denial cache and the
        policy: ``BackendError`` when it fails or does not answer within ``within``
        seconds (a lock held past it included); an answer ends an outage."""
        self.check_open()
        plan = cached_plan(_PING, self.namespace, PING_KEY, (), 1, self.algorithm, False)
        try:
            await asyncio.wait_for(self.backend.decide(plan), within)
        except TimeoutError:
            raise BackendError(f"the storage did not answer within {within:g} s") from None
        self.policy.answered()

    # --- concurrency slots: the same policy and hooks, their own store calls ---

    def slot_store(self) -> SlotStore:
        """The backend, which holds concurrency slots; ``ConfigurationError`` if it holds
        none (Postgres, ``sync_rate``, a backend object without slots)."""
        backend = self.backend
        if not holds_slots(backend):
            raise ConfigurationError(
                f"this storage ({type(backend).__name__}) holds no concurrency slots: "
                "use memory:// or Redis"
            )
        return backend

    async def take_slots(
        self, claim: SlotClaim, give_back: Callable[[SlotClaim, bool], None]
    ) -> tuple[Decision, int | None]:
        """Take ``claim``'s slots under the failure policy; hooks see the decision. Returns
        it and, when refused for want of a slot, the index of the fullest identifier.

        The take runs until the store answers it, even when the caller is cancelled
        meanwhile; only then is what it took given back (``give_back(claim, revoke)``). A
        give-back sent before that could reach the store first (on another connection) and
        leave the take holding a slot that nobody gives back. A take that failed (its answer
        lost) may still reach the store later: its give-back revokes the claim, so that
        such a take takes nothing."""
        taking = self.finish_later(self.policy.take_slots(self.slot_store(), claim))
        fullest = None
        try:
            taken, held, degraded = await asyncio.shield(taking)
        except asyncio.CancelledError:
            taking.add_done_callback(functools.partial(_taken_after_leaving, give_back, claim))
            raise
        except BackendError as exc:
            give_back(claim, True)
            decision = self.policy.failed(exc, claim.key)
        except LockTimeoutError as exc:  # the command engine's lock stayed held: nothing taken
            decision = self.policy.lock_timed_out(exc, claim.key)
        else:
            if not degraded:  # else taken on on_error="local"'s own store
                self.policy.answered()
            left = [count - n for n, count in zip(held, claim.counts, strict=True)]
            if taken:
                decision = make_decision(True, 0.0, None, min(left) - 1, claim.key)
            else:
                decision = make_decision(False, SLOT_RETRY, None, 0, claim.key)
                fullest = left.index(min(left))
            decision = self.policy.taken_locally(decision) if degraded else decision
        if self.hooks:
            self.hooks(decision, 0.0)
        return decision, fullest

    async def renew_slots(self, claim: SlotClaim) -> bool:
        """Renew ``claim``'s lease; ``False`` when it ran out first. Raises as the store
        does (``BackendError``, ``LockTimeoutError``, ``LimiterClosedError``)."""
        return await (self.policy.holding(claim, False) or self.slot_store()).renew_slots(claim)

    async def release_slots(self, claim: SlotClaim, revoke: bool = False) -> None:
        """Give ``claim``'s slots back (``revoke``: and make a take arriving later take
        nothing). Raises as the store does."""
        store = self.policy.holding(claim, revoke) or self.slot_store()  # where it was taken
        await store.release_slots(claim, revoke=revoke)

    def lease_for(self, key: str, seconds: float) -> None:
        """Lease the limit of ``key`` for ``seconds`` (``limit(..., lease=)``; 0: per
        call), putting leases in front of the backend when it has none yet (the limiter's
        ``lease`` setting was 0): limits made before keep deciding as they did."""
        backend = self.backend
        if not isinstance(backend, LeasedBackend):
            if not seconds:
                return
            if isinstance(backend, SyncedBackend):
                raise ConfigurationError(
                    f"limit(lease=) on a limiter with sync_rate: {LEASE_WITH_SYNC_RATE}"
                )
            backend = self.backend = LeasedBackend(backend, 0)
        backend.hold_for(self.namespace, key, seconds)
        if seconds:  # room held in leases elsewhere comes back within a hold
            self.denials.longest = max(self.denials.longest or 0.0, seconds)

    def check_settling(self, settle: object, name: str = "settle", of: str = "result") -> None:
        """``settle=`` (or ``name=``, a callable of the call's ``of``, which settles: as
        ``count_when=``) can work here: a callable, a store that settles, and no background
        counting (which admits a call before it counts it: nothing to settle yet)."""
        if not callable(settle):
            raise TypeError(f"{name} must be a callable of the call's {of}, not {settle!r}")
        if self.background is not None:
            raise ConfigurationError(
                "settle= needs background=False: background counting admits a call before "
                "its cost is recorded, so there is no reservation to settle"
            )
        check_settles(self.backend)

    async def settle(self, decision: Decision, actual: object) -> bool:
        """Settle an admitted call at its real cost ``actual`` (a number, or a mapping from
        units to amounts: :data:`~ratelimit.core.costs.CostValue`), as
        :mod:`ratelimit.core.settling` says. ``True`` when recorded (or nothing was owed);
        ``False`` when the decision recorded nothing (refused, degraded) or the storage
        failed (logged; raised under ``on_error="raise"``). A refund lifts the key's cached
        refusals."""
        self.check_open()
        reserved = reservation(decision)
        if reserved is None:
            return False
        if isinstance(reserved[0], Settling):  # taken: a caller cancelled, or a second settle
            again: Settling = reserved[0]
            compiled, algorithm = again.plan.compiled, again.plan.algorithm
            cost = per_leaf(compiled, actual, algorithm, "the settled cost", settled=True)
            return await again.again(decision.key, cost)
        if reserved[0].__class__ is LeaseShare:  # admitted from a lease: settled against it
            share: LeaseShare = reserved[0]
            plan = share.plan
            cost = per_leaf(plan.compiled, actual, plan.algorithm, "the settled cost", settled=True)
            settling = share.settled(cost)  # its excess; a refund goes back to the lease
        else:
            plan, at_us, counts, *times = reserved
            if actual.__class__ is int and actual >= 0:  # the commonest: passes check_actual
                cost = actual
            else:
                cost = per_leaf(
                    plan.compiled, actual, plan.algorithm, "the settled cost", settled=True
                )
            if cost == plan.cost and not plan.costs:  # what was reserved: nothing to write
                reserved[:] = [Settling(plan, cost)]  # a second settle raises
                return True
            settling = settlement(plan, at_us, counts, cost, *times)
        taken = Settling(plan, cost)
        reserved[:] = [taken]  # a second settle raises
        if settling.empty:
            return True
        written = settle_writes.written_now(self, settling)  # memory://: no task
        if written is not None:
            return written
        settle_writes.start(self, taken, settling)  # a cancelled caller leaves it running
        return await taken.wait()

    async def record(self, call: CallKey) -> bool:
        """Count ``call`` whatever its rules say, past the limit if need be (a usage report
        that must never be lost); ``False`` when the storage failed (as a settle: logged,
        raised under ``on_error="raise"``)."""
        self.check_open()
        plan = cached_plan(*call)
        backend = cast(SettleStore, self.backend)  # checked by RateLimit.record
        excess = tuple(0.0 if k < 0 else plan.identifier_cost(k) for k in plan.leaf_identifiers)
        return await self.policy.settle(backend, Settlement(plan, 0, excess))

    async def reset(self, call: CallKey) -> None:
        """Forget the hits counted for ``call``'s identifiers, and refusals of its key: here
        at once, in every other process of the store within ``override_refresh``
        (:meth:`~ratelimit.overrides.cache.OverrideCache.lift`)."""
        self.check_open()
        await self.backend.reset(cached_plan(*call))
        self.denials.forget(call.namespace, call.key)
        if self.overrides is not None:
            try:
                await self.overrides.lift()
            except (RateLimitError, OSError) as exc:
                logger.warning(
                    "ratelimit: key %r reset, but other processes were not told (%s): their "
                    "cached refusals of it stand until they expire",
                    call.key,
                    exc,
                )

    async def update_counter(self, update: CounterUpdate) -> float:
        """The counter API: add to a window counter and return the rate after it; a refund
        (a negative value) lifts the cached refusals of its key."""
        self.check_open()
        rate = await self.backend.update_counter(update)
        if update.value < 0:
            self.denials.forget(update.identifier.namespace, update.identifier.key)
        return rate


def _ended_then(
    discard: Callable[[asyncio.Future[Any]], None],
    then: Callable[[asyncio.Future[Any]], None],
    task: asyncio.Future[Any],
) -> None:
    discard(task)
    then(task)


def _shadowed(decision: Decision) -> Decision:
    """A refusal let through in shadow mode, logged."""
    shadow_logger.info(
        "ratelimit: shadow mode let through a call of key %r refused by %s",
        decision.key,
        "on_error" if decision.degraded else f"rule '{decision.rule}'",
    )
    return dataclasses.replace(decision, shadow=True)


def _taken_after_leaving(
    give_back: Callable[[SlotClaim, bool], None], claim: SlotClaim, taking: asyncio.Future[Any]
) -> None:
    """The take of a caller that was cancelled ended: give back what it took."""
    if taking.cancelled():
        give_back(claim, True)  # the loop is ending: unknown
        return
    error = taking.exception()
    if error is None:
        if taking.result()[0]:
            give_back(claim, False)
    elif isinstance(error, BackendError):
        give_back(claim, True)
