"""The Prometheus hook: decisions by outcome, latency, the storage's failures and outages,
read back from a registry of the test's own (and from the exposition text it writes)."""

from __future__ import annotations

import contextlib

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ratelimit import BackendError, MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan
from ratelimit.metrics.prometheus import PrometheusHook
from tests.conftest import FailingBackend, FakeClock

pytestmark = pytest.mark.timeout(30)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


async def test_decisions_by_outcome_key_and_limit_with_latency() -> None:
    registry = CollectorRegistry()
    hook = PrometheusHook(registry, near_ratio=0.6)
    rl = RateLimit(MemoryBackend(clock=FakeClock()), hooks=[hook], denial_cache=0)
    for _ in range(6):  # 5/m: 1, 2 allowed; 3, 4, 5 near the limit (60% used); 6 over
        await rl.limit("user:5/m", key="search", user="secret-user-name").decide()
    for _ in range(2):
        await rl.limit("user:1/m", key="watch", user="u", shadow=True).decide()
    await RateLimit(FailingBackend(), hooks=[hook]).limit("1/s", key="down").decide()

    def counted(key: str, limit: str, outcome: str) -> float:
        return value(registry, "ratelimit_decisions_total", key=key, limit=limit, outcome=outcome)

    assert counted("search", "user:5/m", "allowed") == 2
    assert counted("search", "user:5/m", "near_limit") == 3
    assert counted("search", "user:5/m", "over_limit") == 1
    assert counted("watch", "user:1/m", "near_limit") == 1
    assert counted("watch", "user:1/m", "shadow") == 1
    assert counted("down", "", "degraded") == 1
    assert value(registry, "ratelimit_decision_duration_seconds_count", key="search") == 6
    text = generate_latest(registry).decode()
    assert "secret-user-name" not in text  # selector values are never labels
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {"ratelimit_decisions", "ratelimit_decision_duration_seconds"} <= families


async def test_an_outage_is_counted_from_its_start_to_its_end() -> None:
    class Flaky(MemoryBackend):
        down = False

        async def decide(self, plan: Plan) -> Decision:
            if self.down:
                raise BackendError("storage down")
            return await super().decide(plan)

    registry = CollectorRegistry()
    backend = Flaky(clock=FakeClock())
    rl = RateLimit(backend, hooks=[PrometheusHook(registry)], denial_cache=0)
    limit = rl.limit("100/m", key="k")
    await limit.decide()
    assert value(registry, "ratelimit_store_up") == 1
    backend.down = True
    for _ in range(3):
        assert (await limit.decide()).degraded
    assert value(registry, "ratelimit_store_up") == 0
    assert value(registry, "ratelimit_store_failures_total") == 3
    assert value(registry, "ratelimit_store_outages_total") == 1  # one outage, three failures
    assert value(registry, "ratelimit_store_outage_seconds_total") == 0  # not over yet
    backend.down = False
    assert not (await limit.decide()).degraded
    assert value(registry, "ratelimit_store_up") == 1
    assert value(registry, "ratelimit_store_outage_seconds_total") > 0
    assert value(registry, "ratelimit_decisions_total", key="k", limit="", outcome="degraded") == 3


async def test_hooks_on_one_registry_share_its_metrics_and_keys_can_be_dropped() -> None:
    registry = CollectorRegistry()
    first, second = PrometheusHook(registry), PrometheusHook(registry, keys=False)
    assert first.metrics is second.metrics  # no "duplicated timeseries"
    rl = RateLimit(MemoryBackend(), hooks=[second])
    await rl.limit("10/m", key="per-request-key").decide()
    assert value(registry, "ratelimit_decisions_total", key="", limit="10/m", outcome="allowed")
    assert "per-request-key" not in generate_latest(registry).decode()


async def test_a_front_end_may_count_its_own_decisions() -> None:
    registry = CollectorRegistry()
    hook = PrometheusHook(registry, decisions=False)
    rl = RateLimit(MemoryBackend(), hooks=[hook])
    await rl.limit("10/m", key="k").decide()
    assert registry.get_sample_value("ratelimit_decisions_total", {"key": "k"}) is None
    hook.count("envoy/d", "[remote_address] 10/m", "over_limit", 2)
    hook.observe("envoy/d", 0.002)
    labels = {"key": "envoy/d", "limit": "[remote_address] 10/m", "outcome": "over_limit"}
    assert value(registry, "ratelimit_decisions_total", **labels) == 2
    assert value(registry, "ratelimit_decision_duration_seconds_count", key="envoy/d") == 1


@pytest.mark.parametrize("ratio", [0, 1.5, "high", True])
def test_a_bad_near_ratio_is_refused_when_the_hook_is_made(ratio: object) -> None:
    with pytest.raises((TypeError, ValueError), match="near_ratio"):
        PrometheusHook(CollectorRegistry(), near_ratio=ratio)  # type: ignore[arg-type]


async def test_the_labelled_children_kept_count_every_rule_under_its_own_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hook keeps each (key, rule, outcome)'s children by the rule's ``id``: rules of
    the same text made apart count together, rules of other texts apart, a decorated limit
    (the direct path, whole decisions) as ``decide()`` does; past ``CHILDREN`` the table
    starts again and nothing is miscounted."""
    monkeypatch.setattr("ratelimit.metrics.prometheus.CHILDREN", 2)
    registry = CollectorRegistry()
    rl = RateLimit(MemoryBackend(clock=FakeClock()), hooks=[PrometheusHook(registry)])

    @rl.limit("user:3/m", key="api")
    async def work(user: str) -> None: ...

    for user in ["ann", "bob", "ann", "ann", "ann"]:
        with contextlib.suppress(RateLimitExceeded):
            await work(user)
    for rules in ["user:3/m", "user:3/m", "user:9/h", "user:2/s"]:  # one limiter per rules
        other = RateLimit(MemoryBackend(clock=FakeClock()), hooks=rl.settings.hooks)
        await other.limit(rules, key="api", user="cy").decide()

    def counted(limit: str, outcome: str) -> float:
        return value(registry, "ratelimit_decisions_total", key="api", limit=limit, outcome=outcome)

    assert counted("user:3/m", "allowed") == 5  # ann twice, bob, cy twice (made apart)
    assert counted("user:3/m", "near_limit") == 1  # ann's third
    assert counted("user:3/m", "over_limit") == 1  # ann's fourth
    assert counted("user:9/h", "allowed") == 1
    assert counted("user:2/s", "allowed") == 1
    assert value(registry, "ratelimit_decision_duration_seconds_count", key="api") == 9


async def test_a_subclass_counting_its_own_way_counts_every_decision() -> None:
    """``count()`` is the hook's public door: a subclass that overrides it is called for
    every decision (the kept children are the plain hook's own shortcut)."""
    counted: list[tuple[str, str, str]] = []

    class Counting(PrometheusHook):
        def count(self, key: str, limit: str, what: str, n: int = 1) -> None:
            counted.append((key, limit, what))

    registry = CollectorRegistry()
    rl = RateLimit(MemoryBackend(clock=FakeClock()), hooks=[Counting(registry)])

    @rl.limit("user:2/m", key="api")
    async def work(user: str) -> None: ...

    for _ in range(3):
        with contextlib.suppress(RateLimitExceeded):
            await work("ann")
    assert counted == [
        ("api", "user:2/m", "allowed"),
        ("api", "user:2/m", "near_limit"),
        ("api", "user:2/m", "over_limit"),
    ]
    assert value(registry, "ratelimit_decision_duration_seconds_count", key="api") == 3
