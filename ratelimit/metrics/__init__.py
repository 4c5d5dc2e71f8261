"""Metrics for every decision: :class:`OpenTelemetryHook` (:mod:`.opentelemetry`,
``pip install "ratelimit-rules[otel]"``) and :class:`PrometheusHook` (:mod:`.prometheus`,
``pip install "ratelimit-rules[prometheus]"``), counting the same outcomes
(:mod:`.outcomes`). Each hook imports its library when it is first named here, so that
one extra never needs the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratelimit.core.lazy import lazily
from ratelimit.metrics.outcomes import ALLOWED as ALLOWED
from ratelimit.metrics.outcomes import DEGRADED as DEGRADED
from ratelimit.metrics.outcomes import NEAR_LIMIT as NEAR_LIMIT
from ratelimit.metrics.outcomes import OVER_LIMIT as OVER_LIMIT
from ratelimit.metrics.outcomes import SHADOW as SHADOW

if TYPE_CHECKING:
    from ratelimit.metrics.opentelemetry import OpenTelemetryHook as OpenTelemetryHook
    from ratelimit.metrics.prometheus import PrometheusHook as PrometheusHook

__getattr__ = lazily(
    __name__,
    {
        "OpenTelemetryHook": "ratelimit.metrics.opentelemetry",
        "PrometheusHook": "ratelimit.metrics.prometheus",
    },
)
