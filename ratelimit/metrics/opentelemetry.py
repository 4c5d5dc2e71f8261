"""OpenTelemetry metrics for every decision (``pip install "ratelimit-rules[otel]"``).

::

    from ratelimit.metrics.opentelemetry import OpenTelemetryHook

    rl = RateLimit(client, hooks=[OpenTelemetryHook()])   # the global MeterProvider

Two instruments, on the meter ``ratelimit``:

- ``ratelimit.decisions`` (counter): one per decision, with attributes ``outcome`` (one of
  ``allowed``, ``near_limit``: admitted with ``near_ratio`` or more of its tightest rule
  used, ``over_limit``, ``shadow``: refused but let through, ``degraded``: decided by the
  failure policy), ``key``, ``rule`` (the deciding rule's text) and ``override`` (a
  boolean: the rules in force were an override's, ``rl.overrides``; never which one);
- ``ratelimit.decision.duration`` (histogram, seconds): the decision pipeline's time,
  storage included, with attributes ``key`` and ``outcome``.

Labels stay bounded: keys and rule texts come from the code, never from callers; selector
values (user names, addresses) are never labels. ``keys=False`` drops the key too, for
services that make keys from requests.
"""

from __future__ import annotations

from typing import Any

from ratelimit.core.decision import Decision
from ratelimit.core.extras import needs_extra
from ratelimit.metrics.outcomes import (  # noqa: F401 (ALLOWED ... DEGRADED: imported from here before)
    ALLOWED,
    DEGRADED,
    NEAR_LIMIT,
    OVER_LIMIT,
    SHADOW,
    check_near_ratio,
    outcome,
)

with needs_extra("otel"):
    from opentelemetry import metrics


class OpenTelemetryHook:
    """A hook counting decisions and recording their latency. ``meter``: where the
    instruments live (default: ``metrics.get_meter("ratelimit")`` of the global provider);
    ``near_ratio``: how much of its tightest rule an admitted call must have used to count
    as ``near_limit`` (default 0.8); ``keys``: label with the limit's key (default on)."""

    def __init__(
        self, meter: metrics.Meter | None = None, near_ratio: float = 0.8, keys: bool = True
    ) -> None:
        self.near_ratio = check_near_ratio(near_ratio)
        meter = meter or metrics.get_meter("ratelimit")
        self.keys = keys
        self.decisions = meter.create_counter(
            "ratelimit.decisions", unit="{decision}", description="rate-limit decisions by outcome"
        )
        self.duration = meter.create_histogram(
            "ratelimit.decision.duration",
            unit="s",
            description="time to decide, storage included",
        )

    def __call__(self, decision: Decision) -> None:
        self.timed(decision, None)

    def timed(self, decision: Decision, seconds: float | None) -> None:
        what = outcome(decision, self.near_ratio)
        attributes: dict[str, Any] = {"outcome": what, "override": decision.override}
        if self.keys:
            attributes["key"] = decision.key
        self.decisions.add(
            1, {**attributes, "rule": "" if decision.rule is None else str(decision.rule)}
        )
        if seconds is not None:
            self.duration.record(seconds, attributes)
