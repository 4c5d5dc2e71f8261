"""What a decision counts as in metrics, the same for every exporter: ``allowed``,
``near_limit`` (admitted with ``near_ratio`` or more of its tightest rule used),
``over_limit``, ``shadow`` (refused but let through) or ``degraded`` (decided by the
failure policy)."""

from __future__ import annotations

from ratelimit.core.decision import Decision

ALLOWED, NEAR_LIMIT, OVER_LIMIT, SHADOW, DEGRADED = (
    "allowed", "near_limit", "over_limit", "shadow", "degraded",
)  # fmt: skip
OUTCOMES = (ALLOWED, NEAR_LIMIT, OVER_LIMIT, SHADOW, DEGRADED)


def check_near_ratio(near_ratio: float) -> float:
    """``near_ratio`` as a float; ``TypeError`` / ``ValueError`` for a bad one."""
    if isinstance(near_ratio, bool) or not isinstance(near_ratio, int | float):
        raise TypeError(f"near_ratio must be a number, not {near_ratio!r}")
    if not 0 < near_ratio <= 1:
        raise ValueError(f"near_ratio must be above 0 and at most 1, not {near_ratio}")
    return float(near_ratio)


def near(count: float, remaining: float, near_ratio: float) -> bool:
    """Whether ``count - remaining`` used of ``count`` is near the limit."""
    return count - remaining >= near_ratio * count


def outcome(decision: Decision, near_ratio: float) -> str:
    """The outcome a decision counts as."""
    if decision.degraded:
        return DEGRADED
    if decision.shadow:
        return SHADOW
    if not decision.allowed:
        return OVER_LIMIT
    rule, remaining = decision.rule, decision.remaining
    if rule is not None and remaining is not None and near(rule.count, remaining, near_ratio):
        return NEAR_LIMIT
    return ALLOWED
