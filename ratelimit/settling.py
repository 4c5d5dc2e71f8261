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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ratelimit.algorithms import Counted
from ratelimit.decision import Decision
from ratelimit.errors import SettleError
from ratelimit.plan import Cost, Plan


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

    @property
    def empty(self) -> bool:
        """Whether there is nothing to record."""
        return not any(self.deltas)


def reservation(decision: Decision) -> list[Any] | None:
    """What ``decision`` reserved, ``[plan, at_us, counts]`` (the settle empties it once
    taken: settling again raises ``SettleError``); ``None`` for a decision that recorded
    nothing (refused, degraded, shadow-refused)."""
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


def settlement(plan: Plan, at_us: int, counts: Sequence[Counted], actual: Cost) -> Settlement:
    """The :class:`Settlement` of a reservation whose real cost was ``actual`` (one number
    on every rule, or one per leaf, as :data:`~ratelimit.plan.Cost`; checked already)."""
    rules = plan.compiled.rules
    per_identifier = [0.0] * len(plan.identifiers)
    for leaf, k in enumerate(plan.leaf_identifiers):
        if k >= 0:
            real = actual[leaf] if isinstance(actual, tuple) else actual
            per_identifier[k] = max(per_identifier[k], real)
    deltas = []
    for leaf, k in enumerate(plan.leaf_identifiers):
        if k < 0:
            deltas.append(0.0)
            continue
        reserved = plan.identifier_cost(k)
        delta = per_identifier[k] - reserved
        if delta < 0:
            delta = -plan.algorithm.refundable(rules[leaf], reserved, counts[leaf], at_us, -delta)
        deltas.append(delta)
    return Settlement(plan, at_us, tuple(deltas))
