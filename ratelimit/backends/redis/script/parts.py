"""Decisions by parts on the script engine: a call whose identifiers lie under more than one
hash tag on a Redis Cluster (:mod:`~ratelimit.backends.redis.spanning` says how, and why it
admits no call a serial run would refuse), its settles and its resets, one script call per
part. Every part's script is an ordinary one (its rules on its identifiers, one slot), sent
through the engine's pipeline like any decision's."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

from ratelimit.algorithms import GCRA, US_PER_MS, Arrival, gcra_next
from ratelimit.backends.redis.errors import NOT_A_REPLY, not_a_reply
from ratelimit.backends.redis.resp import Command
from ratelimit.backends.redis.script.replies import read_reply
from ratelimit.backends.redis.script.scripts import check_command, hold_command
from ratelimit.backends.redis.script.state import EngineState
from ratelimit.backends.redis.spanning import Part, Spanning, three_valued
from ratelimit.core.decision import Decision
from ratelimit.core.evaluation import leaf_limited, stored_verdict, tree_limited
from ratelimit.core.plan import Plan
from ratelimit.core.settling import Settlement, settlement
from ratelimit.rules.tree import Rule

Read = tuple[bool, int, Sequence[tuple[float, float]]]
"""A part's script's verdict, time (us) and per leaf its two counts."""

Turns = weakref.WeakValueDictionary[tuple[asyncio.AbstractEventLoop, str], asyncio.Lock]
"""Per event loop and held part's tag, the lock an engine's calls take turns by (kept while
used)."""


class Parts(EngineState):
    """A mixin: deciding, settling and resetting a plan by its parts."""

    _turns: Turns | None = None

    async def _decided_by_parts(self, plan: Plan, spanning: Spanning) -> Decision:
        if not plan.record:  # a peek: every part read, nothing recorded
            parts = spanning.every_part
            reads = await asyncio.gather(*(self._read(part.peek) for part in parts))
            return self._verdict(plan, parts, reads, None)
        if spanning.conjunction:
            return await self._conjunction(plan, spanning)
        limited, held = await self._pivoted(plan, spanning.parts)
        return self._verdict(plan, spanning.parts, held, not limited)

    async def _conjunction(self, plan: Plan, spanning: Spanning) -> Decision:
        """Each part decided in turn, the key's own last, then each child that spans tags
        (:class:`~ratelimit.backends.redis.spanning.Nested`) by its pivot; the first to
        refuse refuses the call, what the steps before it recorded is refunded, and the
        parts after it are read (for the decision's figures)."""
        parts, every = spanning.parts, spanning.every_part
        reads: list[Read] = []
        refunds: list[Callable[[], Awaitable[None]]] = []
        for part in parts:
            read = await self._read(part.decide)
            reads.append(read)
            if not read[0]:
                return await self._refused(plan, every, reads, refunds)
            refunds.append(functools.partial(self._refund, part.decide, read))
        for nest in spanning.nested:
            limited, held = await self._pivoted(nest.plan, nest.spanning.parts)
            reads += held
            if limited:  # its own parts refunded already
                return await self._refused(plan, every, reads, refunds)
            refunds += [
                functools.partial(self._refund, part.held, read, True)
                for part, read in zip(nest.spanning.parts, held, strict=True)
            ]
        return self._verdict(plan, every, reads, True)

    async def _refused(
        self,
        plan: Plan,
        every: tuple[Part, ...],
        reads: list[Read],
        refunds: list[Callable[[], Awaitable[None]]],
    ) -> Decision:
        """A conjunction refused: what its steps recorded taken back, the parts it did not
        reach read."""
        later = await asyncio.gather(
            *(self._read(part.peek) for part in every[len(reads) :]),
            *(refund() for refund in refunds),
        )
        peeked = cast(list[Read], later[: len(every) - len(reads)])
        return self._verdict(plan, every, [*reads, *peeked], False)

    async def _pivoted(self, plan: Plan, parts: tuple[Part, ...]) -> tuple[bool, list[Read]]:
        """:meth:`_pivot`, one call at a time per held part in this engine: calls in
        flight on one value see each other's held hits and may all refuse (a serial run
        admits some), so this engine's calls on it take turns (other processes' still
        overlap: only refusing more, never admitting more)."""
        names = sorted({part.tag for part in parts[:-1]})
        async with contextlib.AsyncExitStack() as turns:
            for name in names:
                await turns.enter_async_context(self._turn(name))
            return await self._pivot(plan, parts)

    def _turn(self, name: str) -> asyncio.Lock:
        """This engine's turn on the held part under tag ``name`` (in the running loop)."""
        turns = self._turns
        if turns is None:
            turns = self._turns = weakref.WeakValueDictionary()
        key = (asyncio.get_running_loop(), name)
        lock = turns.get(key)
        if lock is None:
            lock = turns[key] = asyncio.Lock()
        return lock

    async def _pivot(self, plan: Plan, parts: tuple[Part, ...]) -> tuple[bool, list[Read]]:
        """The parts but the last held, then the last (the pivot) recorded whatever it
        reads; the held parts checked when the pivot's rules leave the tree open; refused,
        every part refunded. Whether ``plan``'s tree is limited, and what each part read
        when held."""
        *others, pivot = parts
        held = list(await asyncio.gather(*(self._hold(part) for part in others)))
        held.append(await self._hold(pivot))
        limited: dict[int, bool] = {
            leaf: False for leaf, k in enumerate(plan.leaf_identifiers) if k < 0
        }
        _, now, counts = held[-1]
        for j, leaf in enumerate(pivot.leaves):
            limited[leaf] = leaf_limited(pivot.held, j, now, counts)
        verdict = three_valued(plan.compiled, limited)
        if verdict is None:
            checks = await asyncio.gather(
                *(
                    self._read(part.check, check_command(part.check, at, self.spread))
                    for part, (_, at, _) in zip(others, held, strict=False)
                )
            )
            for part, (_, at, counts) in zip(others, checks, strict=True):
                for j, leaf in enumerate(part.leaves):  # with the call's own hits in
                    limited[leaf] = leaf_limited(part.check, j, at, counts)
            verdict = tree_limited(plan.compiled, limited.__getitem__)
        pairs = list(zip(parts, held, strict=True))
        if verdict:
            await asyncio.gather(*(self._refund(part.held, read, True) for part, read in pairs))
        return verdict, held

    async def _hold(self, part: Part) -> Read:
        """A part held: recorded whatever it reads. GCRA's push goes past the burst's
        tolerance where a rule is over (``gcra.lua``'s ``"3"``), so that every later check
        sees it, and stays there when the call is admitted through another rule: that
        rule's bucket is left in debt by the call's cost, where one script would leave it
        at its tolerance (it refuses longer, never more calls through). Bringing it back
        would be computed from what the hold read, which may count calls still in flight
        that a serial run puts after this one, and so could forget hits later calls rely
        on."""
        return await self._read(part.held, hold_command(part.held, self.clock, self.spread))

    async def _read(self, plan: Plan, command: Command | None = None) -> Read:
        """One part's script call, sent through the pipeline; its reply read."""
        reply = await self._sent(plan, command)  # the old-layout check notes each part
        try:
            return read_reply(plan, reply)
        except NOT_A_REPLY as exc:
            await self._close_idle()
            raise not_a_reply(exc, f"to decide key {plan.key!r}") from exc

    async def _refund(self, plan: Plan, read: Read, held: bool = False) -> None:
        """Take back what ``plan`` (a part) recorded when it read ``read``: a settle of it
        at cost 0; GCRA's exactly what each arrival time was pushed by, from where it was
        read (``held``: uncapped, else as an admission pushes it, capped at the burst)."""
        _, at, counts = read
        if plan.algorithm.name != GCRA:
            await self.settle(settlement(plan, at, counts, 0))
            return
        arrivals = _arrivals(plan, counts)
        ends = [gcra_pushed(rule, cost, tat, at, capped=not held) for rule, cost, tat in arrivals]
        starts = [max(tat, (at, 0)) for _, _, tat in arrivals]
        await self._pulled_back(plan, at, ends, starts)

    async def _pulled_back(
        self, plan: Plan, at: int, ends: list[Arrival], starts: list[Arrival]
    ) -> None:
        """A settle pulling each arrival time back by exactly ``end - start`` (never before
        now): ``settle_gcra.lua`` with the pushes' ends and starts (its ARGV[8])."""
        deltas = tuple(
            -float(plan.leaf_cost(leaf)) if k >= 0 and end > start else 0.0
            for leaf, (k, end, start) in enumerate(
                zip(plan.leaf_identifiers, ends, starts, strict=True)
            )
        )
        if any(deltas):
            await self.settle(Settlement(plan, at, deltas, tuple(ends), starts=tuple(starts)))

    def _verdict(
        self, plan: Plan, parts: tuple[Part, ...], reads: Sequence[Read], allowed: bool | None
    ) -> Decision:
        """The call's decision from what its parts read (``allowed``: the verdict, else the
        counts' own); an admission reserves, per leaf, its part's time for a settle."""
        rules = len(plan.compiled.rules)
        counts: list[tuple[float, float]] = [(0, 0)] * rules
        times = [0] * rules
        now = max(read[1] for read in reads)
        for part, (_, at, read) in zip(parts, reads, strict=False):
            for j, leaf in enumerate(part.leaves):
                counts[leaf] = read[j]
                times[leaf] = at
        if allowed is None:
            allowed = not tree_limited(
                plan.compiled, lambda leaf: leaf_limited(plan, leaf, now, counts)
            )
        decision = stored_verdict(plan, allowed, now, counts, report=False)
        if decision._reservation is not None:
            decision._reservation.append(tuple(times))
        return decision


def _arrivals(
    plan: Plan, counts: Sequence[tuple[float, float]]
) -> list[tuple[Rule, float, Arrival]]:
    """Per leaf of a GCRA part: its rule, what the call counts on it (0 where its selector
    did not resolve) and the arrival time it read."""
    return [
        (rule, plan.leaf_cost(leaf) if k >= 0 else 0, (int(read[0]), int(read[1])))
        for leaf, (rule, k, read) in enumerate(
            zip(plan.compiled.rules, plan.leaf_identifiers, counts, strict=True)
        )
    ]


def gcra_pushed(rule: Rule, cost: float, tat: Arrival, at: int, capped: bool = False) -> Arrival:
    """Where a push of ``cost`` from ``tat`` at ``at`` ends: ``cost`` intervals on from
    ``max(tat, at)``; ``capped``, as an admission pushes it (:func:`gcra_next`)."""
    if capped:
        return gcra_next(rule, cost, tat, at)
    count, span = rule.count, rule.span_ms * US_PER_MS
    start = max(tat[0] * count + tat[1], at * count)
    us, remainder = divmod(start + int(cost) * span, count)
    return us, remainder
