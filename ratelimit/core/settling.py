"""Settling a call after it ran: its real cost replaces the estimate it reserved.

An admitted call recorded its cost (the reservation) on every identifier of its plan. Once
the real cost is known (the tokens a model used, the rows an export wrote), the difference
is recorded on those identifiers in one atomic step per store (:class:`Settlement`, a
backend's ``settle``):

- a **refund** (real below reserved) takes back what the reservation recorded, as long as
  it still counts: the sliding log removes hits of the reservation's time; the window
  counters subtract from the window the call was counted in (never below 0; nothing once
  that window has passed); GCRA pulls the arrival time back, never before now and never
  by more than the reservation pushed it;
- an **excess** (real above reserved) is recorded now, past the limit if need be: the work
  was done, so later calls wait it out (their ``retry_after`` says how long).

Only an admitted decision that recorded its cost can be settled (``Decision._reservation``);
a refused, degraded or shadow-refused one recorded nothing and settles as a no-op; one
settled already, peeked at, or admitted by ``background`` counting raises
:class:`~ratelimit.errors.SettleError`.

A settle's write runs to its end even when its caller is cancelled (``asyncio.wait_for``, a
client that left): the store records it, and settling the decision again at the same cost
waits for that write and answers what it answered (:class:`Settling`). Usage is never lost
to a cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from ratelimit.algorithms import Counted
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Cost, Plan
from ratelimit.errors import SettleError

CountWhen = Callable[[Any], "bool | Awaitable[bool]"]
"""``count_when=``: of a call's outcome (its result, or the exception it raised), whether
it counts (a call it does not count is refunded: settled to 0)."""


class Settlement(NamedTuple):
    """One settle for a backend: the reservation's ``plan``, the store's time it was
    decided at (``at_us``: for the window counters, the time after a clock that stepped
    back; it names the windows the call was counted in) and, per leaf of the tree, the
    hits to record (``deltas[i] > 0``: an excess, recorded now) or to take back
    (``< 0``: a refund, from what the reservation recorded). Leaves on one identifier (and,
    for GCRA, one arrival time) carry the same delta; unresolved leaves carry 0."""

    plan: Plan
    at_us: int
    deltas: tuple[float, ...]
    held: tuple[Counted, ...] = ()
    """Per leaf, until when the reservation still counts where the algorithm drains it
    (:meth:`~ratelimit.algorithms.Algorithm.held_until`: GCRA's arrival time as the
    reservation pushed it); empty when nothing is refunded."""
    times: tuple[int, ...] = ()
    """Per leaf, the store's time its part was decided at, for a decision made by parts on
    nodes of their own (:mod:`ratelimit.backends.redis.spanning`); empty: ``at_us``."""
    starts: tuple[Counted, ...] = ()
    """GCRA, a held part's refund: per leaf, the arrival time its push started from, so
    that the refund takes back exactly what it pushed (``settle_gcra.lua``); empty: none."""

    @property
    def empty(self) -> bool:
        """Whether there is nothing to record."""
        return not any(self.deltas)


class Settling:
    """A settle taken from its decision's reservation (which then holds only this): the
    cost it records and the future its caller awaits (``write``; ``None``: nothing to
    record), which the store's write completes when it ends (:meth:`follow`). A caller
    cancelled while waiting cancels only that future, never the write: :meth:`again`
    waits for the same write's answer, in a future of its own."""

    __slots__ = ("_outcome", "cancelled", "cost", "ended", "plan", "write")

    def __init__(self, plan: Plan, cost: Cost) -> None:
        self.plan = plan
        self.cost = cost
        self.write: asyncio.Future[bool] | None = None
        self.cancelled = False
        self.ended = False
        """Whether the write ended and its answer was given to :attr:`write`."""
        self._outcome: Callable[[asyncio.Future[Any]], bool] | None = None

    def follow(
        self, loop: asyncio.AbstractEventLoop, outcome: Callable[[asyncio.Future[Any]], bool]
    ) -> None:
        """Answer what ``outcome`` makes of the store's write once it ends (:meth:`finished`,
        its done callback): its value, or the error it raises."""
        self.write = loop.create_future()
        self._outcome = outcome

    def finished(self, source: asyncio.Future[Any]) -> None:
        """The store's write (``source``, after :meth:`follow`) ended."""
        self.ended = True
        write = self.write
        assert write is not None
        assert self._outcome is not None
        if write.done():  # its caller was cancelled, and has not run since: for again()
            write = self.write = source.get_loop().create_future()
            write.add_done_callback(_retrieved)
        if source.cancelled():
            write.cancel()  # the write was cancelled (the limiter closed past its wait)
            return
        try:
            write.set_result(self._outcome(source))
        except Exception as exc:  # the caller's error, or, once it left, the log's
            write.set_exception(exc)

    async def wait(self) -> bool:
        """What the write answers; a cancelled caller leaves it running (:meth:`again`)."""
        write = self.write
        if write is None:
            return True
        try:
            return await write
        except asyncio.CancelledError:
            if write.cancelled() and self.write is write and not self.ended:
                self.write = write.get_loop().create_future()  # the write goes on
                self.write.add_done_callback(_retrieved)
            # settled again later unless the write itself was cancelled
            self.cancelled = self.write is not write or not write.cancelled()
            _retrieved(write)
            raise

    async def again(self, key: str, cost: Cost) -> bool:
        """Settle once more at ``cost``: after a cancelled caller, what the same write
        answers; otherwise ``SettleError`` (settled already, or at another cost)."""
        if not self.cancelled:
            raise SettleError(f"this decision of key {key!r} was settled already")
        if cost != self.cost:
            raise SettleError(
                f"this decision of key {key!r} is being settled at {self.cost!r} (a caller "
                f"was cancelled while it was recorded), not {cost!r}"
            )
        settled = await self.wait()
        self.cancelled = False  # answered: settling once more raises
        return settled


def _retrieved(write: asyncio.Future[bool]) -> None:
    if write.done() and not write.cancelled():
        write.exception()  # the policy logged it; a caller still waiting gets it too


def held_arrival(settlement: Settlement, leaf: int) -> tuple[int, int]:
    """GCRA: the arrival time ``leaf``'s reservation pushed its rule's to (``(0, 0)``
    when nothing is refunded)."""
    if not settlement.held:
        return (0, 0)
    us, remainder = settlement.held[leaf]
    return int(us), int(remainder)


def reservation(decision: Decision) -> list[Any] | None:
    """What ``decision`` reserved, ``[plan, at_us, counts]`` (and per leaf its part's time,
    for a decision by parts: ``[plan, at_us, counts, times]``), or, once a settle took it,
    ``[Settling]``; ``None`` for a decision that recorded nothing (refused, degraded,
    shadow-refused)."""
    reserved = decision._reservation
    if reserved is None:
        if decision.allowed and not decision.degraded:
            raise SettleError(
                f"this decision of key {decision.key!r} recorded nothing to settle: it was "
                "a peek (record=False), or was admitted by background counting, which "
                "counts the call later (settle needs background=False)"
            )
        return None
    if not reserved:
        raise SettleError(f"this decision of key {decision.key!r} was settled already")
    return reserved


def settlement(
    plan: Plan,
    at_us: int,
    counts: Sequence[Counted],
    actual: Cost,
    times: tuple[int, ...] = (),
) -> Settlement:
    """The :class:`Settlement` of a reservation whose real cost was ``actual`` (one number
    on every rule, or one per leaf, as :data:`~ratelimit.core.plan.Cost`; checked already).
    ``times``: per leaf, the time its part was decided at (a decision by parts), else
    ``at_us`` for every leaf."""
    rules = plan.compiled.rules
    algorithm = plan.algorithm
    if len(rules) == 1 and plan.leaf_identifiers[0] == 0:  # one rule: by_leaf's loops, once
        rule, reserved, at = rules[0], plan.identifier_cost(0), times[0] if times else at_us
        delta = max(0.0, actual[0] if isinstance(actual, tuple) else actual) - reserved
        if delta >= 0:
            return Settlement(plan, at_us, (delta,), (), times)
        delta = -algorithm.refundable(rule, reserved, counts[0], at, -delta)
        until = algorithm.held_until(rule, reserved, counts[0], at)
        return Settlement(plan, at_us, (delta,), (until,) if delta < 0 else (), times)
    return by_leaf(plan, at_us, counts, actual, times)


def by_leaf(
    plan: Plan,
    at_us: int,
    counts: Sequence[Counted],
    actual: Cost,
    times: tuple[int, ...] = (),
) -> Settlement:
    """:func:`settlement` of any tree, leaf by leaf (a leaf's identifier settles the most
    any of its leaves really cost)."""
    rules, algorithm = plan.compiled.rules, plan.algorithm
    per_identifier = [0.0] * len(plan.identifiers)
    for leaf, k in enumerate(plan.leaf_identifiers):
        if k >= 0:
            real = actual[leaf] if isinstance(actual, tuple) else actual
            per_identifier[k] = max(per_identifier[k], real)
    deltas = []
    held: list[Counted] = []
    for leaf, k in enumerate(plan.leaf_identifiers):
        if k < 0:
            deltas.append(0.0)
            held.append((0, 0))
            continue
        reserved = plan.identifier_cost(k)
        delta = per_identifier[k] - reserved
        at = times[leaf] if times else at_us
        if delta < 0:
            delta = -algorithm.refundable(rules[leaf], reserved, counts[leaf], at, -delta)
        deltas.append(delta)
        held.append(algorithm.held_until(rules[leaf], reserved, counts[leaf], at))
    return Settlement(plan, at_us, tuple(deltas), tuple(held) if min(deltas) < 0 else (), times)
