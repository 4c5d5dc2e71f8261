"""The decision pipeline every front end calls: denial cache, background counting, failure
policy, backend, hooks.

A front end (the decorator and ``async with`` of :mod:`ratelimit.limit`; the HTTP middleware
and the rate-limit service to come) names a call with a :class:`CallKey` and asks
:meth:`Decider.decide`. It never reaches into a backend, the denial cache or the queue.

Example::

    tree = compile_tree(to_tree("user:5/s"))
    decision = await rl.decider.decide(CallKey(tree, "shop", "search", ("vova",), 1, "sliding-log"))
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable
from typing import Any, NamedTuple

from ratelimit.algorithms import Algorithm
from ratelimit.backends.base import Backend
from ratelimit.background import BackgroundCounter
from ratelimit.decision import Decision, make_decision
from ratelimit.denials import DenialCache
from ratelimit.errors import LimiterClosedError
from ratelimit.hooks import Hooks
from ratelimit.plan import CompiledTree, Cost, CounterUpdate, cached_plan
from ratelimit.policy import FailurePolicy


class CallKey(NamedTuple):
    """What identifies one call. Calls with equal keys share one plan, and one cached
    refusal in the denial cache."""

    compiled: CompiledTree
    namespace: str
    key: str
    values: tuple[str | None, ...]
    """Selector values, in the order of ``compiled.selectors``."""
    cost: Cost
    """What the call counts: one number, or one per leaf (:data:`~ratelimit.plan.Cost`)."""
    algorithm: Algorithm | str
    """The algorithm, or its name."""


shadow_logger = logging.getLogger("ratelimit.shadow")
"""Where shadow refusals are logged (INFO), one line each: filter or silence it by name."""

_clock = time.perf_counter

FINISH_WITHIN = 10.0
"""How long closing a limiter waits for the slot give-backs still under way (seconds)."""

new_call_key = tuple.__new__
"""``new_call_key(CallKey, (compiled, namespace, ...))``: a :class:`CallKey` built in C, at a
third of the cost of its Python ``__new__``, for the hot path."""


class Decider:
    """One limiter's pipeline: a refusal still standing is answered from the denial cache;
    with background counting a call is admitted at once and counted later; otherwise the
    backend decides, under the failure policy. Every decision reaches the hooks.

    After :meth:`close`, every call raises ``LimiterClosedError``.
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
    ) -> None:
        self.namespace = namespace
        self.algorithm = algorithm
        self.backend = backend
        self.policy = policy
        self.denials = denials
        self.hooks = hooks
        self.background = background
        self.closed = False
        self._unfinished: set[asyncio.Future[Any]] = set()

    def finish_later(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        """Run ``work`` off its caller's path (a slot given back after its caller left),
        and finish it before the limiter closes (:meth:`finish`). Its errors are its own
        to log."""
        task = asyncio.ensure_future(work)
        self._unfinished.add(task)  # kept until done: the loop holds tasks only weakly
        task.add_done_callback(self._unfinished.discard)
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

    async def decide(self, call: CallKey, record: bool = True, shadow: bool = False) -> Decision:
        """Decide ``call``; with ``record=False`` only say what would be decided. With
        ``shadow``, a refusal comes back marked ``shadow=True`` (and is logged): the front
        end lets the call through. Nothing else changes: a refused call records nothing,
        and the refusal is remembered in the denial cache as any other."""
        if self.closed:
            raise LimiterClosedError()
        started = _clock() if self.hooks.timed else 0.0
        decision = self.denials.get(call)  # still refused: the storage is not asked again
        if decision is None and self.background is not None and record:
            self.background.submit(call, cached_plan(*call))  # admitted now, counted later
            decision = make_decision(True, 0.0, None, None, call.key)
        elif decision is None:
            decision = await self.policy.decide(self.backend, cached_plan(*call, record))
            if not decision.allowed:
                self.denials.remember(call, decision)
        if shadow and not decision.allowed:
            decision = dataclasses.replace(decision, shadow=True)
            shadow_logger.info(
                "ratelimit: shadow mode let through a call of key %r refused by %s",
                decision.key,
                "on_error" if decision.degraded else f"rule '{decision.rule}'",
            )
        if self.hooks:
            self.hooks(decision, _clock() - started if started else 0.0)
        return decision

    async def reset(self, call: CallKey) -> None:
        """Forget the hits counted for ``call``'s identifiers, and refusals of its key."""
        self.check_open()
        await self.backend.reset(cached_plan(*call))
        self.denials.forget(call.namespace, call.key)

    async def update_counter(self, update: CounterUpdate) -> float:
        """The counter API: add to a window counter and return the rate after it; a refund
        (a negative value) lifts the cached refusals of its key."""
        self.check_open()
        rate = await self.backend.update_counter(update)
        if update.value < 0:
            self.denials.forget(update.identifier.namespace, update.identifier.key)
        return rate
