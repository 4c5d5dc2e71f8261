"""Decisions by parts on the script engine: a call whose identifiers lie under more than one
hash tag on a Redis Cluster (:mod:`~ratelimit.backends.redis.spanning` says how, and why it
admits no call a serial run would refuse), its settles and its resets, one script call per
part. Every part's script is an ordinary one (its rules on its identifiers, one slot), sent
through the engine's pipeline like any decision's."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ratelimit.algorithms import GCRA, gcra_next
from ratelimit.backends.redis.errors import NOT_A_REPLY, not_a_reply
from ratelimit.backends.redis.resp import Command
from ratelimit.backends.redis.script.replies import read_reply
from ratelimit.backends.redis.script.scripts import check_command
from ratelimit.backends.redis.script.state import EngineState
from ratelimit.backends.redis.spanning import Part, Spanning, three_valued
from ratelimit.core.decision import Decision
from ratelimit.core.evaluation import leaf_limited, stored_verdict, tree_limited
from ratelimit.core.plan import Plan
from ratelimit.core.settling import Settlement, settlement

Read = tuple[bool, int, Sequence[tuple[float, float]]]
"""A part's script's verdict, time (us) and per leaf its two counts."""


class Parts(EngineState):
    """A mixin: deciding, settling and resetting a plan by its parts."""

    async def _decided_by_parts(self, plan: Plan, spanning: Spanning) -> Decision:
        parts = spanning.parts
        if not plan.record:  # a peek: every part read, nothing recorded
            reads = await asyncio.gather(*(self._read(part.peek) for part in parts))
            return self._verdict(plan, parts, reads, None)
        if spanning.conjunction:
            return await self._conjunction(plan, parts)
        return await self._pivoted(plan, parts)

    async def _conjunction(self, plan: Plan, parts: tuple[Part, ...]) -> Decision:
        """Each part decided in turn, the key's own last; the first to refuse refuses the
        call, and what the parts before it recorded is refunded."""
        reads: list[Read] = []
        for n, part in enumerate(parts):
            read = await self._read(part.decide)
            reads.append(read)
            if not read[0]:
                later = parts[n + 1 :]
                refunds = [
                    self._refund(p.decide, r) for p, r in zip(parts[:n], reads, strict=False)
                ]
                peeks = [self._read(p.peek) for p in later]
                done = await asyncio.gather(*peeks, *refunds)
                reads += done[: len(later)]  # type: ignore[arg-type]
                return self._verdict(plan, parts, reads, False)
        return self._verdict(plan, parts, reads, True)

    async def _pivoted(self, plan: Plan, parts: tuple[Part, ...]) -> Decision:
        """The parts but the last held, then the last (the pivot) recorded whatever it
        reads; the held parts checked when the pivot's rules leave the tree open; refused,
        every part refunded."""
        *others, pivot = parts
        held = list(await asyncio.gather(*(self._read(part.held) for part in others)))
        held.append(await self._read(pivot.held))
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
            for part, hold, (_, at, counts) in zip(others, held, checks, strict=False):
                for j, leaf in enumerate(part.leaves):
                    # limited when held already (GCRA caps a push past the burst, so the
                    # check cannot see all of it), or with the call's own hits in
                    limited[leaf] = leaf_limited(part.held, j, hold[1], hold[2]) or (
                        leaf_limited(part.check, j, at, counts)
                    )
            verdict = tree_limited(plan.compiled, limited.__getitem__)
        if verdict:
            await asyncio.gather(
                *(self._refund(part.held, read) for part, read in zip(parts, held, strict=True))
            )
        return self._verdict(plan, parts, held, not verdict)

    async def _read(self, plan: Plan, command: Command | None = None) -> Read:
        """One part's script call, sent through the pipeline; its reply read."""
        reply = await self._sent(plan, command)  # the old-layout check notes each part
        try:
            return read_reply(plan, reply)
        except NOT_A_REPLY as exc:
            await self._close_idle()
            raise not_a_reply(exc, f"to decide key {plan.key!r}") from exc

    async def _refund(self, plan: Plan, read: Read) -> None:
        """Take back what ``plan`` (a part) recorded when it read ``read``: a settle of it
        at cost 0; GCRA's exactly what each arrival time was pushed by, from where it was
        read (the burst may have capped a held part's push below whole intervals)."""
        _, at, counts = read
        if plan.algorithm.name != GCRA:
            await self.settle(settlement(plan, at, counts, 0))
            return
        deltas, held, starts = [], [], []
        for leaf, (rule, k) in enumerate(
            zip(plan.compiled.rules, plan.leaf_identifiers, strict=True)
        ):
            cost = plan.leaf_cost(leaf) if k >= 0 else 0
            tat = (int(counts[leaf][0]), int(counts[leaf][1]))
            deltas.append(-float(cost))
            held.append(gcra_next(rule, cost, tat, at))
            starts.append(max(tat, (at, 0)))
        await self.settle(Settlement(plan, at, tuple(deltas), tuple(held), starts=tuple(starts)))

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
