"""The OpenTelemetry hook: decisions counted by outcome, latency recorded, labels bounded
(read back through the SDK's in-memory reader)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ratelimit import MemoryBackend, RateLimit
from ratelimit.core.decision import Decision
from ratelimit.metrics.opentelemetry import OpenTelemetryHook
from tests.conftest import FailingBackend, FakeClock

pytestmark = pytest.mark.timeout(30)


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    found = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found += list(metric.data.data_points)
    return found


def counts(reader: InMemoryMetricReader) -> dict[tuple[str, str, str], int]:
    return {
        (p.attributes["outcome"], p.attributes["key"], p.attributes["rule"]): p.value
        for p in points(reader, "ratelimit.decisions")
    }


async def test_decisions_by_outcome_with_latency_and_bounded_labels() -> None:
    reader = InMemoryMetricReader()
    hook = OpenTelemetryHook(MeterProvider(metric_readers=[reader]).get_meter("t"), near_ratio=0.6)
    rl = RateLimit(MemoryBackend(clock=FakeClock()), hooks=[hook], denial_cache=0)
    for _ in range(6):  # 5/m: 1, 2 allowed; 3, 4, 5 near the limit (60% used); 6 over
        await rl.limit("user:5/m", key="search", user="secret-user-name").decide()
    await rl.limit("user:1/m", key="watch", user="u", shadow=True).decide()
    await rl.limit("user:1/m", key="watch", user="u", shadow=True).decide()
    failing = RateLimit(FailingBackend(), hooks=[hook])
    await failing.limit("1/s", key="down").decide()
    got = counts(reader)
    assert got[("allowed", "search", "user:5/m")] == 2
    assert got[("near_limit", "search", "user:5/m")] == 3
    assert got[("over_limit", "search", "user:5/m")] == 1
    assert got[("near_limit", "watch", "user:1/m")] == 1  # its one call used it all
    assert got[("shadow", "watch", "user:1/m")] == 1
    assert got[("degraded", "down", "")] == 1
    labels = {str(v) for p in points(reader, "ratelimit.decisions") for v in p.attributes.values()}
    assert not any("secret" in label for label in labels)  # selector values are never labels
    durations = points(reader, "ratelimit.decision.duration")
    assert sum(p.count for p in durations) == 9
    assert all(p.min >= 0 for p in durations)


def test_keys_can_be_left_out_and_the_ratio_is_checked() -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    hook = OpenTelemetryHook(meter, keys=False)
    hook(Decision(True, 0.0, None, None, "request-made-key"))
    (point,) = points(reader, "ratelimit.decisions")
    assert "key" not in point.attributes
    with pytest.raises(ValueError, match="near_ratio"):
        OpenTelemetryHook(meter, near_ratio=1.5)


async def test_an_override_is_an_attribute_never_its_values() -> None:
    reader = InMemoryMetricReader()
    hook = OpenTelemetryHook(MeterProvider(metric_readers=[reader]).get_meter("t"))
    rl = RateLimit(MemoryBackend(clock=FakeClock()), hooks=[hook])
    limit = rl.limit("user:5/m", key="search", user="secret-user-name")
    await limit.decide()
    await rl.overrides.set("search", "user:50/m", user="secret-user-name")
    await limit.decide()
    seen = {
        (p.attributes["override"], p.attributes["rule"])
        for p in points(reader, "ratelimit.decisions")
    }
    assert seen == {(False, "user:5/m"), (True, "user:50/m")}
    assert {p.attributes["override"] for p in points(reader, "ratelimit.decision.duration")} == {
        False,
        True,
    }
    labels = {str(v) for p in points(reader, "ratelimit.decisions") for v in p.attributes.values()}
    assert not any("secret" in label for label in labels)
