"""Settles on Postgres (:mod:`ratelimit.core.settling`): one call of ``ratelimit_settle``
(``schema.sql``) adds each (key, window size)'s delta, atomically: a refund takes back from
the window the reservation was counted in while it is held, never below 0, and nothing when
the key was reset since."""

from __future__ import annotations

from ratelimit.algorithms import US_PER_MS
from ratelimit.backends.naming import identifier_key
from ratelimit.backends.postgres.schema import SETTLE
from ratelimit.backends.postgres.statements import Statements
from ratelimit.core.settling import Settlement


class Settles(Statements):
    """A mixin: the Postgres store's ``settle``."""

    async def settle(self, settlement: Settlement) -> None:
        plan = settlement.plan
        todo: dict[tuple[str, int], float] = {}
        for rule, k, delta in zip(
            plan.compiled.rules, plan.leaf_identifiers, settlement.deltas, strict=True
        ):
            if k >= 0 and delta:
                key = identifier_key(plan.identifiers[k])
                todo.setdefault((key, rule.span_ms * US_PER_MS), float(delta))
        if not todo:
            return
        args = (
            [key for key, _ in todo],
            [size for _, size in todo],
            list(todo.values()),
            settlement.at_us,
            self._now(),
        )
        await self._guarded(
            lambda db: db.fetchval(SETTLE, *args),
            f"settle key {plan.key!r}",
        )
