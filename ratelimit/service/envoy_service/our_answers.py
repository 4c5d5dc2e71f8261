"""``ShouldRateLimit`` on a configuration of envoyproxy/ratelimit, decided by our algorithms
(``RATELIMIT_ALGORITHM`` with ``serve --envoy``).

Everything that picks the limits is its service's (:class:`~.answers.EnvoyAnswers`: the
configuration's matching, a request's own ``limit``, ``replaces``, ``unlimited``, shadow and
quota modes, headers, metadata, stats); how they are counted is ours:

- the request's enforced descriptors are one atomic decision, one tree: its normal
  descriptors' limits side by side (``|``: refused when any of them is over) and its quota
  descriptors under an ``&`` (refused only when every one of them is over), each descriptor's
  rules (:mod:`~ratelimit.service.envoy_config.ours`) counted per descriptor, its hits as
  its cost. A refused request counts nothing, anywhere; an admitted one counts on every
  descriptor's counters;
- a descriptor's own ``hits_addend`` of 0 asks whether one more request would be admitted,
  counting nothing (and refusing the request when it would not, as its service refuses one
  whose count is over);
- a limit of 0 requests, or below the descriptor's hits, refuses the request without
  asking the store;
- ``duration_until_reset`` of a refused descriptor is the time until its rules would admit
  the request (an ``&``'s first side to admit), not until a window ends: Envoy turns the
  largest into ``Retry-After``; ``current_limit`` is the descriptor's tightest rule;
- an ``always_count`` descriptor is decided first, apart, and counted whether or not it
  was refused (usage reported after the fact);
- descriptors in ``shadow_mode`` are decided apart, never refuse, and count only when the
  request was admitted; ``SHADOW_MODE`` decides the enforced ones in shadow;
- with ``RATELIMIT_LEASE`` the limiter leases (:mod:`ratelimit.backends.leases`): a
  decision whose descriptors all count the same hits is given one cost (a plan without
  per-identifier costs), which is answered from a lease unless an ``&`` (quota
  descriptors) joins it; descriptors of different hits are decided per request.

The store's failure is the request's error (``redis_error``), as its service answers one:
Envoy's ``failure_mode_deny`` then decides.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ratelimit.backends.redis.client import close_client
from ratelimit.core.decision import Decision, RuleState
from ratelimit.core.plan import CompiledTree, compile_tree
from ratelimit.errors import ConfigurationError
from ratelimit.front.limiter import RateLimit
from ratelimit.rules.tree import And, Node, Or, to_tree
from ratelimit.service.envoy_config import EnvoyConfig
from ratelimit.service.envoy_config.ours import SPANS
from ratelimit.service.envoy_service.answers import (
    RLS,
    Answering,
    EnvoyAnswers,
    Found,
    hits_of,
)
from ratelimit.service.envoy_service.counting import MemoryCounts
from ratelimit.service.envoy_service.stats import EnvoyStats
from ratelimit.service.proto.envoy import rls_pb2
from ratelimit.service.rules_file import DescriptorLimit, joined, per_selector
from ratelimit.service.statuses import Matched, below_cost, fill, filled


class LimiterStore:
    """The store of our answers: ``limiter``'s (and ``client``, when it was made for it)."""

    def __init__(self, limiter: RateLimit, client: Any, timeout: float | None) -> None:
        self.limiter = limiter
        self.client = client
        self.timeout = timeout

    async def ping(self) -> None:
        await self.limiter.ping(within=self.timeout)

    async def aclose(self) -> None:
        await self.limiter.aclose()
        if self.client is not None:
            await close_client(self.client)


KEPT = 4096
"""How many answers of each kind (can a limit admit these hits, a decision's tree) are
kept; all are forgotten when there are more."""


@dataclass(frozen=True, slots=True)
class _Asked:
    """A limited descriptor of the request, as our decision takes it."""

    n: int
    found: Found
    limit: DescriptorLimit
    value: str
    hits: int


class OurAnswers(EnvoyAnswers):
    """:class:`~.answers.EnvoyAnswers` counting with ``limiter`` (our algorithm, its store;
    ``timeout``: each decision's deadline)."""

    def __init__(
        self,
        config: EnvoyConfig | None,
        limiter: RateLimit,
        stats: EnvoyStats,
        answering: Answering | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(config, MemoryCounts(), stats, answering or Answering())
        self.limiter = limiter
        self.timeout = timeout
        self._descriptor_limits: dict[tuple[str, str], DescriptorLimit] = {}
        self._admitting: dict[tuple[int, int], bool] = {}  # by id: each limit is kept
        self._trees: dict[
            tuple[tuple[tuple[int, str], ...], int], tuple[CompiledTree, tuple[int, ...]]
        ] = {}

    async def _counted(
        self, request: rls_pb2.RateLimitRequest, found: Sequence[Found | None]
    ) -> list[RLS.DescriptorStatus]:
        statuses = [RLS.DescriptorStatus(code=RLS.OK) for _ in request.descriptors]
        asked = [self._asked(request, n, one) for n, one in enumerate(found) if one is not None]
        over: dict[int, bool] = {}  # whether each descriptor's own rules refuse it
        alone: list[_Asked] = []  # decided before the others: blocked, or only asked
        for a in asked:
            if a.hits and a.found.limit.always_count and not a.found.limit.shadow_mode:
                decision = await self._always(request.domain, a)
                over[a.n] = filled(_matched([a]), decision, statuses, _nowhere(statuses))[0]
                alone.append(a)
            elif a.hits and not self._admits(a):
                self._blocked(a, statuses[a.n])
                over[a.n] = True
                alone.append(a)
            elif not a.hits:
                decision = await self._decide(request.domain, [a], record=False)
                over[a.n] = filled(_matched([a]), decision, statuses, _nowhere(statuses))[0]
                alone.append(a)
        counted = [a for a in asked if a not in alone]
        enforced = [a for a in counted if not a.found.limit.shadow_mode]
        normal = [a for a in enforced if not self._quota(a)]
        quotas = [a for a in enforced if self._quota(a)]
        told = [a for a in alone if not a.found.limit.shadow_mode]
        refused = any(over[a.n] for a in told if not self._quota(a))
        quota_told = [a for a in told if self._quota(a)]
        if quota_told and not quotas and all(over[a.n] for a in quota_told):
            refused = True  # every quota descriptor is over
        free = any(not over[a.n] for a in quota_told)  # a quota passed: the others cannot refuse
        group = normal if free else [*normal, *quotas]
        admitted = not refused
        if group:
            decision = await self._decide(
                request.domain,
                group,
                record=not refused,
                quotas=0 if free else len(quotas),
                shadow=self.answering.shadow_mode,
            )
            limited = filled(_matched(group), decision, statuses, _nowhere(statuses))
            over.update((a.n, r) for a, r in zip(group, limited, strict=True))
            admitted = admitted and (decision.allowed or decision.shadow)
        apart = [a for a in counted if a not in group]  # shadow ones, and free quota ones
        for a in apart:
            decision = await self._decide(request.domain, [a], record=admitted, shadow=True)
            over[a.n] = filled(_matched([a]), decision, statuses, _nowhere(statuses))[0]
            if over[a.n] and not a.found.limit.shadow_mode:
                statuses[a.n].code = RLS.OVER_LIMIT  # a quota over, which cannot refuse
        for a in asked:
            self._told(a, statuses[a.n], over[a.n])
        return statuses

    def _quota(self, asked: _Asked) -> bool:
        return self.answering.quota_mode or asked.found.limit.quota_mode

    def _asked(self, request: rls_pb2.RateLimitRequest, n: int, one: Found) -> _Asked:
        descriptor = request.descriptors[n]
        parts = []
        for i, entry in enumerate(descriptor.entries):
            shared = one.shared[i] if i < len(one.shared) else ""
            parts += [entry.key, shared or entry.value]
        value = joined(parts)  # fields apart: a value holding "_" is never another's
        return _Asked(n, one, self._ours(one), value, hits_of(request, descriptor))

    def _ours(self, one: Found) -> DescriptorLimit:
        """The descriptor limit (rules, counted per descriptor under a selector of its stat
        key) of a limit; one per (key, rules), kept."""
        limit = one.limit
        rules = limit.rules
        if not rules and limit.requests_per_unit and limit.unit:  # a request's own limit
            rules = f"{limit.requests_per_unit}/{SPANS[limit.unit]}"
        cached = self._descriptor_limits.get((limit.full_key, rules))
        if cached is None:
            digest = hashlib.sha1(limit.full_key.encode()).hexdigest()[:16]
            selector = f"e_{digest}"
            tree: Node = to_tree(rules) if rules else to_tree("1/1s")  # "": admits nothing
            cached = DescriptorLimit(
                "", (), tree, per_selector(tree, selector), selector, limit.shadow_mode, 0
            )
            self._descriptor_limits[(limit.full_key, rules)] = cached
        return cached

    def _admits(self, asked: _Asked) -> bool:
        """Whether the descriptor's rules can admit its hits at all (a limit of 0, or one
        below its hits, never does)."""
        one = asked.found.limit
        if not one.rules and not (one.requests_per_unit and one.unit):
            return False
        known = self._admitting.get((id(asked.limit), asked.hits))
        if known is not None:
            return known
        try:
            self.limiter.check(compile_tree(asked.limit.rules), asked.hits)
        except ConfigurationError:
            admits = False
        else:
            admits = True
        if len(self._admitting) >= KEPT:
            self._admitting.clear()
        self._admitting[(id(asked.limit), asked.hits)] = admits
        return admits

    def _blocked(self, asked: _Asked, status: RLS.DescriptorStatus) -> None:
        """A descriptor whose rules never admit its hits: ``OVER_LIMIT``, counting nothing
        (``OK`` in shadow mode), its rules reported exhausted for their window."""
        compiled = compile_tree(asked.limit.rules)
        one = asked.found.limit
        if not one.rules and not (one.requests_per_unit and one.unit):
            status.code = RLS.OK if one.shadow_mode else RLS.OVER_LIMIT
            status.current_limit.CopyFrom(
                RLS.RateLimit(name=one.name, requests_per_unit=0, unit=_unit(one.unit))
            )
            if one.unit:
                status.duration_until_reset.seconds = one.seconds
            return
        _, tightest = below_cost(compiled, (), lambda rule: False)
        code = RLS.OK if one.shadow_mode else RLS.OVER_LIMIT
        fill(status, code, asked.limit, tightest.rule, tightest)

    async def _decide(
        self,
        domain: str,
        asked: Sequence[_Asked],
        *,
        record: bool,
        quotas: int = 0,
        shadow: bool = False,
        always: bool = False,
    ) -> Decision:
        """One decision of ``asked`` (its last ``quotas`` under an ``&``), each descriptor
        its own hits (``record=False``: one request's worth, only asked; ``always``: counted
        even when refused)."""
        values: dict[str, str] = {}
        names: dict[str, dict[str, str]] = {}
        used: list[tuple[DescriptorLimit, str]] = []
        costs: list[int] = []
        for a in asked:
            named = names.setdefault(a.limit.selector, {})
            selector = named.get(a.value)
            if selector is None:
                selector = f"{a.limit.selector}#{len(named)}" if named else a.limit.selector
                named[a.value] = selector
                values[selector] = a.value
            used.append((a.limit, selector))
        compiled, leaves = self._compiled(tuple(used), quotas)
        for a, count in zip(asked, leaves, strict=True):
            costs += [a.hits if record else 1] * count
        # one cost when every descriptor counts the same: a plan that leases
        cost = costs[0] if len(set(costs)) == 1 else tuple(costs)
        selected = tuple(values[s] for s in compiled.selectors)
        key = f"envoy/{domain}"
        if not always:
            return await self.limiter.decide(
                compiled,
                key,
                selected,
                cost=cost,
                shadow=shadow,
                record=record,
                within=self.timeout,
            )
        try:
            self.limiter.check(compiled, cost)
        except ConfigurationError:  # above what its rules admit at once: counted, refused
            await self.limiter.record(compiled, key, selected, cost=cost)
            return await self.limiter.decide(
                compiled, key, selected, record=False, within=self.timeout
            )
        decision = await self.limiter.decide(
            compiled, key, selected, cost=cost, within=self.timeout
        )
        if not decision.allowed and not decision.degraded:
            await self.limiter.record(compiled, key, selected, cost=cost)  # never lost
        return decision

    def _compiled(
        self, used: tuple[tuple[DescriptorLimit, str], ...], quotas: int
    ) -> tuple[CompiledTree, tuple[int, ...]]:
        """The tree of a decision: each limit's rules under the selector it counts under
        here, the last ``quotas`` under an ``&``, the others beside them; and how many
        rules each limit has. Kept: a service sees the same few combinations again."""
        ids = tuple((id(limit), selector) for limit, selector in used)
        known = self._trees.get((ids, quotas))
        if known is not None:
            return known
        trees: list[Node] = [
            limit.tree if selector == limit.selector else per_selector(limit.rules, selector)
            for limit, selector in used
        ]
        plain, quota = trees[: len(trees) - quotas], trees[len(trees) - quotas :]
        if len(quota) > 1:
            plain.append(And(*quota))
        else:
            plain += quota
        tree = plain[0] if len(plain) == 1 else Or(*plain)
        leaves = tuple(len(compile_tree(limit.rules).rules) for limit, _ in used)
        found = compile_tree(tree, pinned=True), leaves
        if len(self._trees) >= KEPT:
            self._trees.clear()
        self._trees[(ids, quotas)] = found
        return found

    async def _always(self, domain: str, asked: _Asked) -> Decision:
        """An ``always_count`` descriptor: decided, and its hits counted whether or not it
        was refused (usage reported after the fact, such as tokens at a stream's end)."""
        return await self._decide(domain, [asked], record=True, always=True)

    def _told(self, asked: _Asked, status: RLS.DescriptorStatus, over: bool) -> None:
        """The descriptor's stats, and its ``current_limit`` named as its service names it
        (``over``: whether its own rules refused it, which a shadow one's status hides)."""
        one, stats, hits = asked.found.limit, asked.found.stats, asked.hits
        status.current_limit.name = one.name
        stats.total_hits.add(hits)
        if over:
            stats.over_limit.add(hits)
            if one.shadow_mode:
                stats.shadow_mode.add(hits)
            return
        stats.within_limit.add(hits)
        allowed = status.current_limit.requests_per_unit
        near = math.floor(allowed * self.answering.near_limit_ratio)
        if allowed and allowed - status.limit_remaining > near:
            stats.near_limit.add(hits)


def _unit(name: str) -> RLS.RateLimit.Unit.ValueType:
    return RLS.RateLimit.Unit.Value(name) if name else RLS.RateLimit.UNKNOWN


def _nowhere(statuses: Sequence[object]) -> list[list[RuleState]]:
    """Where :func:`~ratelimit.service.statuses.filled` puts the states it read (for the
    TOML service's headers): not used here."""
    return [[] for _ in statuses]


def _matched(asked: Sequence[_Asked]) -> list[Matched]:
    return [(a.n, a.limit, a.value, a.hits) for a in asked]
