"""Resets on Postgres: one call of ``ratelimit_reset`` (``schema.sql``) forgets what a plan's
keys counted and marks each key reset, which a settle's refund of a call reserved before
reads."""

from __future__ import annotations

from ratelimit.backends.layout import reset_keep_us
from ratelimit.backends.naming import identifier_key
from ratelimit.backends.postgres.schema import RESET
from ratelimit.backends.postgres.statements import Statements
from ratelimit.core.plan import Plan


class Resets(Statements):
    """A mixin: the Postgres store's ``reset``."""

    async def reset(self, plan: Plan) -> None:
        keys = [identifier_key(identifier) for identifier in plan.identifiers]
        if keys:
            keep = reset_keep_us(plan)
            await self._guarded(
                lambda db: db.fetchval(RESET, keys, keep, self._now()),
                f"reset key {plan.key!r}",
            )
