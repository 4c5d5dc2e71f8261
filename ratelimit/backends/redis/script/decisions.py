"""Decisions on the script engine: the whole plan (every rule of the tree and every
identifier) in one call of its algorithm's script (``sliding_log.lua``,
``window_counters.lua`` or ``gcra.lua``, or for one rule on one key ``sliding_log_one.lua``
or ``gcra_one.lua``: :data:`~ratelimit.backends.redis.script.scripts.BY_ALGORITHM`), sent
alone or with the other calls of its event-loop turn (:mod:`.pipeline`). The script answers
its verdict and what it counted; the verdict stands, and
:func:`~ratelimit.core.evaluation.stored_verdict` reads the rest of the decision from the
counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratelimit.backends.redis.errors import NOT_A_REPLY, not_a_reply
from ratelimit.backends.redis.penalties import hold_key
from ratelimit.backends.redis.script.held import HELD_BACK, held_command, held_of
from ratelimit.backends.redis.script.parts import Parts
from ratelimit.backends.redis.script.replies import read_reply
from ratelimit.backends.redis.spanning import spanning
from ratelimit.core.decision import Decision
from ratelimit.core.evaluation import evaluate, stored_verdict
from ratelimit.core.plan import Identifier, Plan


class Decisions(Parts):
    """A mixin: the script engine's ``decide`` and ``admits``, and ``decide_unless_held``."""

    if TYPE_CHECKING:

        async def penalty_left(self, target: Identifier) -> float: ...  # RedisPenalties'

    async def decide(self, plan: Plan) -> Decision:
        if self._closed:
            self._open()
        if not plan.identifiers:
            return evaluate(plan, 0, [(0, 0)] * len(plan.compiled.rules))
        if self._spans and not plan.compiled.spreads:
            parts = spanning(plan)
            if parts is not None:
                return await self._decided_by_parts(plan, parts)
        reply = await self._sent(plan)
        try:
            allowed, now_us, counts = read_reply(plan, reply)
        except NOT_A_REPLY as exc:
            await self._close_idle()
            raise not_a_reply(exc, f"to decide key {plan.key!r}") from exc
        return stored_verdict(plan, allowed, now_us, counts)  # the script's verdict

    async def decide_unless_held(self, plan: Plan, hold: Identifier) -> Decision | float:
        """The seconds left of ``hold``'s penalty hold (a float) while it is in force, else
        :meth:`decide`'s decision of ``plan``: in one script call (the held variant of the
        plan's script, :mod:`.held`) where the hold's key shares the plan's slot, else the
        hold read first (``penalty_left``), as two calls."""
        if self._closed:
            self._open()
        if not plan.identifiers or (self._spans and not plan.compiled.pinned):
            left = await self.penalty_left(hold)  # another slot, or no key to join it to
            return left if left > 0 else await self.decide(plan)
        command = self._command(plan)
        if self.clock is None:  # a command kept per plan: its held variant kept too
            command = held_of(command, hold)
        else:
            command = held_command(command, hold_key(hold))
        reply = await self._sent(plan, command)
        try:
            if reply[0] == HELD_BACK:
                return int(reply[1]) / 1_000_000
            allowed, now_us, counts = read_reply(plan, reply)
        except NOT_A_REPLY as exc:
            await self._close_idle()
            raise not_a_reply(exc, f"to decide key {plan.key!r}") from exc
        return stored_verdict(plan, allowed, now_us, counts)

    async def admits(self, plan: Plan) -> Decision | None:
        """``None`` when the store admitted (and recorded) ``plan``, else what :meth:`decide`
        answers: for a caller that never reads an admission (the direct path,
        :func:`ratelimit.front.direct.asker`), nothing is built from the script's counts."""
        if self._closed or not plan.identifiers or (self._spans and not plan.compiled.spreads):
            decision = await self.decide(plan)
            return None if decision.allowed else decision
        reply = await self._sent(plan)
        shape = 2 + 2 * len(plan.compiled.rules)  # verdict, time, two counts per rule
        if reply.__class__ is list and len(reply) == shape and reply[0] == 1:
            return None  # the script's verdict: admitted
        try:
            allowed, now_us, counts = read_reply(plan, reply)
        except NOT_A_REPLY as exc:
            await self._close_idle()
            raise not_a_reply(exc, f"to decide key {plan.key!r}") from exc
        return stored_verdict(plan, allowed, now_us, counts)
