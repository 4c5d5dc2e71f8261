"""The two APIs the service answers, as plain async functions of a request message (the
gRPC servicers in :mod:`ratelimit.service.server` only translate errors):

- ratio's ``RateLimit(owner, resource)``: ``RATELIMIT_RULES`` decided for that pair;
- Envoy's RLS v3 ``ShouldRateLimit``: each descriptor mapped to its rules by the rules file,
  every enforced descriptor of one request decided together in one atomic decision (one
  script on Redis: every tree decided here is compiled pinned, so that a descriptor's
  counters stay in its domain's one Redis Cluster slot whichever descriptors came with
  it, and ratio's key in one slot whatever override applies), shadow descriptors in a
  second one that never refuses; the answer carries the ``RateLimit`` headers Envoy
  passes on to its client (:mod:`ratelimit.service.envoy_headers`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ratelimit.algorithms import SLIDING_LOG
from ratelimit.core.checks import check_cost
from ratelimit.core.decision import Decision, NeverAdmitted, RuleState
from ratelimit.core.extras import needs_extra
from ratelimit.core.plan import CompiledTree, compile_tree
from ratelimit.errors import ConfigurationError, RuleSyntaxError
from ratelimit.front.limiter import RateLimit
from ratelimit.overrides.cache import Override
from ratelimit.rules.tree import Node, Or, Rule, map_rules, to_tree
from ratelimit.service.config import MAX_DESCRIPTORS
from ratelimit.service.envoy_headers import header_values
from ratelimit.service.rules_file import (
    DescriptorLimit,
    RulesFile,
    joined,
    per_selector,
    selector_of,
)
from ratelimit.service.statuses import Matched, below_cost, fill, filled

if TYPE_CHECKING:
    from ratelimit.service.prometheus import ServiceMetrics

with needs_extra("server"):
    from ratelimit.service.proto import ratio_pb2
    from ratelimit.service.proto.envoy import rls_pb2
    from ratelimit.service.proto.envoy.common_pb2 import RateLimitDescriptor

PAIR = "owner_resource"
"""The selector a ratio rule without one counts under: per (owner, resource) pair."""
RATIO_KEY = "ratio"
RLS = rls_pb2.RateLimitResponse
ENVOY_SPANS = {1: "s", 2: "m", 3: "h", 4: "d", 5: "30d", 6: "365d", 7: "7d"}
"""A ``RateLimitOverride``'s unit (``envoy.type.v3.RateLimitUnit``) as a span: a month is
30 days and a year 365, as Envoy's reference service counts them."""
logger = logging.getLogger("ratelimit.service")


class InvalidRequest(ValueError):
    """A request the service cannot decide (answered ``INVALID_ARGUMENT``)."""


class UnknownDomain(LookupError):
    """A domain the rules file does not name (answered ``NOT_FOUND``)."""


def ratio_tree(text: str, algorithm: str = SLIDING_LOG) -> CompiledTree:
    """``RATELIMIT_RULES`` for ratio's API: a rule without a selector counts per (owner,
    resource) pair, as ratio does; ``owner:`` and ``resource:`` rules per owner or resource."""
    tree = to_tree(text)
    try:
        check_cost(compile_tree(tree), 1, algorithm)
    except ConfigurationError as exc:
        raise ConfigurationError(f"RATELIMIT_RULES={text!r}: {exc}") from None
    for leaf in compile_tree(tree).rules:
        if leaf.selector not in (None, "owner", "resource"):
            raise ConfigurationError(
                f"RATELIMIT_RULES={text!r}: selector {leaf.selector!r} is unknown to ratio's "
                "API, which gives owner and resource"
            )
    return compile_tree(
        map_rules(
            tree, lambda rule: rule if rule.selector else dataclasses.replace(rule, selector=PAIR)
        ),
        pinned=True,  # an override may name other selectors: one layout for the key
    )


@dataclass
class Handlers:
    """What the servicers call. ``rules`` is swapped whole on a reload.
    ``response_headers``: Envoy's answers carry the headers of
    :mod:`ratelimit.service.envoy_headers` for its client."""

    limiter: RateLimit
    ratio: CompiledTree
    rules: RulesFile | None
    timeout: float
    max_descriptors: int = MAX_DESCRIPTORS
    metrics: ServiceMetrics | None = None
    response_headers: bool = True

    async def rate_limit(self, request: ratio_pb2.RateLimitRequest) -> ratio_pb2.RateLimitResponse:
        if not request.owner or not request.resource:
            raise InvalidRequest("owner and resource must both be given")
        values = {"owner": request.owner, "resource": request.resource}
        found = await self.limiter.overrides.find(RATIO_KEY, values)
        overridden = None if found is None else self._ratio_override(found)
        compiled = overridden or self.ratio
        values[PAIR] = joined((request.owner, request.resource))
        decision = await self.limiter.decide(
            compiled,
            RATIO_KEY,
            tuple(values[s] for s in compiled.selectors),
            shadow=False,
            within=self.timeout,
            override=overridden is not None,
        )
        if self.metrics is not None:
            self.metrics.ratio(decision, PAIR)
        over = not decision.allowed and not decision.shadow
        code = ratio_pb2.RateLimitResponse.OVER_LIMIT if over else ratio_pb2.RateLimitResponse.OK
        return ratio_pb2.RateLimitResponse(
            code=code,
            remaining=max(decision.remaining or 0, 0),
            retry_after=decision.retry_after,
            degraded=decision.degraded,
        )

    def envoy_key(self, domain: str) -> str:
        """The key of a domain's decisions (``envoy/<domain>``), ``envoy/(unknown)`` for a
        domain the rules file lacks (a label never made of what a request sent)."""
        rules = self.rules
        known = rules is not None and domain in rules.domains
        return f"envoy/{domain}" if known else "envoy/(unknown)"

    def _ratio_override(self, found: Override) -> CompiledTree | None:
        """An override's rules for ratio's API, as ``RATELIMIT_RULES`` reads them; ``None``
        (logged) when they cannot be (a selector ratio does not give)."""
        try:
            return ratio_tree(found.rules, self.limiter.algorithm)
        except ConfigurationError as exc:
            logger.warning("ratelimit: override %s not applied: %s", found, exc)
            return None

    async def should_rate_limit(self, request: rls_pb2.RateLimitRequest) -> RLS:
        rules = self.rules
        if not request.domain:
            raise InvalidRequest("domain must be given")
        if not request.descriptors:
            raise InvalidRequest("at least one descriptor must be given")
        if len(request.descriptors) > self.max_descriptors:
            raise InvalidRequest(
                f"{len(request.descriptors)} descriptors: a request may have at most "
                f"{self.max_descriptors} (RATELIMIT_MAX_DESCRIPTORS)"
            )
        if rules is None or request.domain not in rules.domains:
            raise UnknownDomain(f"domain {request.domain!r} has no limits in the rules file")
        matched: list[Matched] = []
        blocked: list[int] = []  # descriptors whose own limit is 0 requests: refused
        for n, descriptor in enumerate(request.descriptors):
            entries = [(e.key, e.value) for e in descriptor.entries]
            if not entries or any(not key or not value for key, value in entries):
                raise InvalidRequest(
                    f"descriptor {n}: every descriptor has entries, each with a key and a value"
                )
            limit, zero = await self._limit_of(rules, request.domain, descriptor, entries, n)
            if zero:
                blocked.append(n)
            elif limit is not None:
                cost = _cost(request.hits_addend, descriptor, n)
                # a limit's keys hold no "=" (it pins a value), so the first one splits
                value = joined(f"{key}={value}" for key, value in entries)
                matched.append((n, limit, value, cost))
        lowered = self._lowered(matched)
        if lowered:
            matched = [item for item in matched if item[0] not in lowered]
        statuses = [RLS.DescriptorStatus(code=RLS.OK) for _ in request.descriptors]
        overall = RLS.OVER_LIMIT if blocked else RLS.OK
        for n in blocked:
            statuses[n].code = RLS.OVER_LIMIT
            if self.metrics is not None:
                entries = [(e.key, e.value) for e in request.descriptors[n].entries]
                self.metrics.blocked(request.domain, rules.match(request.domain, entries))
            statuses[n].current_limit.CopyFrom(RLS.RateLimit(name="0", requests_per_unit=0))
        reported: list[list[RuleState]] = [[] for _ in request.descriptors]
        refusals: list[Decision] = []
        for item in lowered.values():
            refusal = await self._refuse_lowered(request.domain, item, statuses, reported)
            if refusal is not None:
                overall = RLS.OVER_LIMIT
                refusals.append(refusal)
        # always_count descriptors first, in one decision, counted refused or not; then
        # the enforced ones in one atomic decision, each counting its own hits_addend, and
        # nothing when the request was refused (by an always_count one too); then shadow
        # ones, never refused, and counting nothing when the request was refused
        groups: dict[tuple[bool, bool], list[Matched]] = {}
        for item in sorted(matched, key=lambda item: (item[1].shadow, not item[1].always)):
            groups.setdefault((item[1].shadow, item[1].always), []).append(item)
        for (shadow, always), group in groups.items():
            record = overall == RLS.OK or always
            decision = await self._decide_group(request.domain, group, shadow, record, always)
            if not decision.allowed and not decision.shadow:
                overall = RLS.OVER_LIMIT
                refusals.append(decision)
            limited = filled(group, decision, statuses, reported)
            if self.metrics is not None:
                self.metrics.descriptors(
                    request.domain, group, decision, statuses, limited, reported
                )
        answer = RLS(overall_code=overall, statuses=statuses)
        if self.response_headers:
            spans = [ENVOY_SPANS[request.descriptors[n].limit.unit] for n in blocked]
            answer.response_headers_to_add.extend(header_values(reported, spans, refusals))
        return answer

    def _lowered(self, matched: list[Matched]) -> dict[int, Matched]:
        """Of ``matched``, by position in the request, the descriptors whose override (kept
        in the store, or the request's own ``limit``) was lowered below their
        ``hits_addend``, or whose rules-file limit (without ``always_count``) has a rule that
        never admits it: they refuse the request, counting nothing. Checked before anything
        is counted."""
        lowered: dict[int, Matched] = {}
        for item in matched:
            _, limit, _, cost = item
            if limit.always:
                continue  # counted and answered OVER_LIMIT (_decide_group)
            try:
                self.limiter.check(compile_tree(limit.rules), cost)
            except ConfigurationError:
                lowered[item[0]] = item
        return lowered

    async def _refuse_lowered(
        self,
        domain: str,
        item: Matched,
        statuses: list[RLS.DescriptorStatus],
        reported: list[list[RuleState]],
    ) -> Decision | None:
        """Answer a descriptor whose override is below its ``hits_addend``: ``OVER_LIMIT``
        (``OK`` on a shadow limit), counting nothing, reported with the state of its rules
        as they are (asked without counting), the rules below the cost exhausted until
        their window has passed; the refusal, for ``Retry-After`` (``None``: shadow)."""
        n, limit, value, cost = item
        compiled = compile_tree(limit.tree, pinned=True)
        peek = await self.limiter.decide(
            compiled,
            f"envoy/{domain}",
            (value,),
            shadow=False,
            record=False,
            within=self.timeout,
            override=True,
        )
        states, tightest = below_cost(compiled, peek.states, lambda rule: self._fits(rule, cost))
        reported[n] = list(states)
        code = RLS.OK if limit.shadow else RLS.OVER_LIMIT
        fill(statuses[n], code, limit, tightest.rule, tightest)
        if self.metrics is not None:
            self.metrics.blocked(domain, limit, shadow=limit.shadow)
        if limit.shadow:
            return None
        wait = tightest.reset_after
        if not limit.override:  # the rules file's own: never admitted, no Retry-After
            why = f"its hits_addend ({cost}) is more than rule '{tightest.rule}' admits at once"
            return NeverAdmitted(False, wait, tightest.rule, 0, peek.key, _states=states, why=why)
        return Decision(False, wait, tightest.rule, 0, peek.key, override=True, _states=states)

    def _fits(self, rule: Rule, cost: int) -> bool:
        try:
            self.limiter.check(compile_tree(rule), cost)
        except ConfigurationError:
            return False
        return True

    async def _limit_of(
        self,
        rules: RulesFile,
        domain: str,
        descriptor: RateLimitDescriptor,
        entries: list[tuple[str, str]],
        n: int,
    ) -> tuple[DescriptorLimit | None, bool]:
        """The limit of one descriptor and whether it admits nothing (a ``limit`` of 0
        requests). An override kept in the store (key ``envoy/<domain>``, the descriptor's
        entries its values) replaces the rules-file limit's rules; else the request's own
        ``limit`` (Envoy's ``RateLimitOverride``) does, or applies alone, as Envoy's
        reference service does, to a descriptor no limit matches; else the rules file's."""
        limit = rules.match(domain, entries)
        if limit is not None:
            found = await self.limiter.overrides.find(f"envoy/{domain}", dict(entries))
            if found is not None:
                replaced = _stored_override(limit, found)
                if replaced is not None:
                    return replaced, False
        if not descriptor.HasField("limit"):
            return limit, False
        count, unit = descriptor.limit.requests_per_unit, descriptor.limit.unit
        span = ENVOY_SPANS.get(unit)
        if span is None:
            raise InvalidRequest(
                f"descriptor {n}: limit.unit {unit} is not a unit this service knows "
                "(SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR)"
            )
        if count == 0:
            return None, True
        try:
            tree = to_tree(f"{count}/{span}")
        except RuleSyntaxError as exc:
            raise InvalidRequest(f"descriptor {n}: limit: {exc}") from None
        if limit is None:
            pattern = tuple((key, None) for key, _ in entries)
            selector = selector_of(domain, pattern)
            limit = DescriptorLimit(domain, pattern, tree, tree, selector, False, 0, request=True)
        tree_per = per_selector(tree, limit.selector)
        return dataclasses.replace(
            limit, rules=tree, tree=tree_per, shadow=False, override=True
        ), False

    async def _decide_group(
        self,
        domain: str,
        group: list[Matched],
        shadow: bool,
        record: bool,
        always: bool = False,
    ) -> Decision:
        # one leaf set per descriptor, each leaf counting its descriptor's hits_addend; one
        # limit with another value in the same request counts under ``selector#n``: on that
        # value's own counter (see cached_plan), the one a request naming it anywhere else
        # counts on. A descriptor repeated in one request counts once, at its largest cost.
        trees: list[Node] = []
        costs: list[int] = []
        values: dict[str, str] = {}
        names: dict[str, dict[str, str]] = {}  # per limit: value -> its selector here
        for _, limit, value, cost in group:
            named = names.setdefault(limit.selector, {})
            selector = named.get(value)
            if selector is None:
                selector = f"{limit.selector}#{len(named)}" if named else limit.selector
                named[value] = selector
                values[selector] = value
            own = selector == limit.selector
            trees.append(limit.tree if own else per_selector(limit.rules, selector))
            costs += [cost] * len(compile_tree(limit.rules).rules)
        # pinned: a descriptor's counters stay in the domain's slot whichever came with it
        compiled = compile_tree(trees[0] if len(trees) == 1 else Or(*trees), pinned=True)
        # one cost when every descriptor counts the same: a plan that leases (RATELIMIT_LEASE)
        per_leaf = costs[0] if len(set(costs)) == 1 else tuple(costs)
        key, selected = f"envoy/{domain}", tuple(values[s] for s in compiled.selectors)
        try:  # the others were checked before anything was counted (_lowered)
            self.limiter.check(compiled, per_leaf)
        except ConfigurationError:  # an always_count report above the limit: counted, over
            await self.limiter.record(compiled, key, selected, cost=per_leaf)
            return await self.limiter.decide(
                compiled, key, selected, shadow=shadow, record=False, within=self.timeout
            )
        decision = await self.limiter.decide(
            compiled,
            key,
            selected,
            cost=per_leaf,
            shadow=shadow,
            record=record,
            within=self.timeout,
            override=any(item[1].override for item in group),
        )
        if always and not decision.allowed and not decision.degraded:
            await self.limiter.record(compiled, key, selected, cost=per_leaf)  # never lost
        return decision


def _stored_override(limit: DescriptorLimit, found: Override) -> DescriptorLimit | None:
    """``limit`` with the rules of an override kept in the store, counted per descriptor
    as its own are; ``None`` (logged) when they name selectors, which descriptors lack."""
    tree = to_tree(found.rules)
    if compile_tree(tree).selectors:
        logger.warning(
            "ratelimit: override %s not applied: a descriptor's rules name no selector "
            "(they count per descriptor, as in the rules file)",
            found,
        )
        return None
    return dataclasses.replace(
        limit, rules=tree, tree=per_selector(tree, limit.selector), override=True
    )


def _cost(addend: int, descriptor: RateLimitDescriptor, n: int) -> int:
    """The request's ``hits_addend``, or the descriptor's own; 0 (unset) means 1."""
    if descriptor.HasField("hits_addend"):
        addend = descriptor.hits_addend.value
    cost = addend or 1
    if cost > 1_000_000_000:
        raise InvalidRequest(
            f"descriptor {n}: hits_addend {cost} is larger than any limit (a negative number "
            "sent as unsigned?)"
        )
    return cost
