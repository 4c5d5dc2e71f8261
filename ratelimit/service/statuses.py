"""The per-descriptor statuses of an Envoy answer (``RateLimitResponse.DescriptorStatus``),
filled in from the rule states of the decisions that decided them: ``code``,
``current_limit`` (the descriptor's rules as its name; its tightest rule's count, and unit
when the span is one of the protocol's: a second, minute, hour, day, week, 30 days or 365
days), ``limit_remaining`` and ``duration_until_reset``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ratelimit.core.decision import Decision, RuleState
from ratelimit.core.evaluation import tree_limited, tree_wait
from ratelimit.core.extras import needs_extra
from ratelimit.core.plan import CompiledTree, compile_tree
from ratelimit.rules.tree import Rule
from ratelimit.service.rules_file import DescriptorLimit

with needs_extra("server"):
    from google.protobuf.duration_pb2 import Duration

    from ratelimit.service.proto.envoy import rls_pb2

RLS = rls_pb2.RateLimitResponse
UNITS = {1_000: RLS.RateLimit.SECOND, 60_000: RLS.RateLimit.MINUTE}
UNITS |= {3_600_000: RLS.RateLimit.HOUR, 86_400_000: RLS.RateLimit.DAY}
UNITS |= {7 * 86_400_000: RLS.RateLimit.WEEK, 30 * 86_400_000: RLS.RateLimit.MONTH}
UNITS |= {365 * 86_400_000: RLS.RateLimit.YEAR}
Matched = tuple[int, DescriptorLimit, str, int]
"""A descriptor a limit matched: its position in the request, its limit, its selector
value and its cost (``hits_addend``)."""


def fill(
    status: RLS.DescriptorStatus,
    code: RLS.Code.ValueType,
    limit: DescriptorLimit,
    rule: Rule,
    state: RuleState,
) -> None:
    """``status`` says ``code``, with ``rule`` of ``limit`` as its current limit, in the
    ``state`` a decision left it."""
    status.code = code
    status.current_limit.CopyFrom(
        RLS.RateLimit(
            name=str(limit.rules),
            requests_per_unit=rule.count,
            unit=UNITS.get(rule.span_ms, RLS.RateLimit.UNKNOWN),
        )
    )
    status.limit_remaining = state.remaining
    status.duration_until_reset.CopyFrom(duration(state.reset_after))


def filled(
    group: Sequence[Matched],
    decision: Decision,
    statuses: list[RLS.DescriptorStatus],
    reported: list[list[RuleState]],
) -> list[bool]:
    """Fill in the statuses of ``group``'s descriptors, which ``decision`` decided (their
    states also in ``reported``, for the response headers); whether each one's own rules
    refused (``True`` for a shadow descriptor too, whose status says OK)."""
    # each descriptor's leaves follow the previous one's: one pass over the states
    starts: list[int] = []
    descriptor_of_leaf: list[int] = []
    for i, (_, limit, _, _) in enumerate(group):
        starts.append(len(descriptor_of_leaf))
        descriptor_of_leaf += [i] * len(compile_tree(limit.rules).rules)
    states: list[list[RuleState]] = [[] for _ in group]
    for state in decision.states:
        states[descriptor_of_leaf[state.leaf]].append(state)
    refused: list[bool] = []
    for (n, limit, _, _), start, mine in zip(group, starts, states, strict=True):
        status, reported[n] = statuses[n], mine
        if not mine:  # nothing counted (fail-open): the policy's answer
            status.code = RLS.OK if decision.allowed or decision.shadow else RLS.OVER_LIMIT
            refused.append(status.code == RLS.OVER_LIMIT)
            continue
        compiled = compile_tree(limit.rules)
        refusing = {s.leaf - start: s for s in mine if s.limited}
        limited = tree_limited(compiled, refusing.__contains__)
        refused.append(limited)
        code = RLS.OVER_LIMIT if limited and not decision.shadow else RLS.OK
        if limited:
            tightest = _waited(compiled, refusing)
        else:
            tightest = min(mine, key=lambda s: (s.remaining, -s.reset_after))
        fill(status, code, limit, compiled.rules[tightest.leaf - start], tightest)
    return refused


def _waited(compiled: CompiledTree, refusing: dict[int, RuleState]) -> RuleState:
    """The state to report of a descriptor its rules refused (``refusing``: by leaf, those
    that did): the rule it waits on, and the wait until its rules admit it (an ``Or``'s last
    rule to admit, an ``And``'s first), which Envoy turns into ``Retry-After``."""
    waits = [refusing[i].reset_after if i in refusing else 0.0 for i in range(len(compiled.rules))]
    wait = tree_wait(compiled, waits.__getitem__)
    binding = min(refusing.values(), key=lambda state: abs(state.reset_after - wait))
    return binding._replace(reset_after=wait)


def below_cost(
    compiled: CompiledTree, states: Sequence[RuleState], fits: Callable[[Rule], bool]
) -> tuple[tuple[RuleState, ...], RuleState]:
    """The ``states`` of a descriptor whose override is below its cost (as asked without
    counting), each rule the cost does not ``fit`` exhausted for its window (it never
    admits the call); and the state to report, the longest wait (each rule exhausted when
    nothing was asked: the store failed)."""
    marked = tuple(
        state
        if fits(state.rule)
        else state._replace(limited=True, remaining=0, reset_after=state.rule.span_ms / 1000)
        for state in states
    )
    below = [s for s in marked if s.limited] or [
        RuleState(rule, leaf, True, 0, rule.span_ms / 1000)
        for leaf, rule in enumerate(compiled.rules)
    ]
    return marked, max(below, key=lambda s: s.reset_after)


def duration(seconds: float) -> Duration:
    """``seconds`` as a protobuf ``Duration`` (to the microsecond)."""
    held = Duration()
    held.FromMicroseconds(round(seconds * 1_000_000))
    return held
