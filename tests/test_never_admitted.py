"""A cost chosen per call that its rules can never admit (a ``cost=`` callable's answer, a
``decide(cost=...)``, a request's ``max_tokens``) is a refusal, never a configuration error
at call time: ``RateLimitExceeded`` from the decorator and ``async with``, a refused
``Decision`` (:class:`~ratelimit.core.decision.NeverAdmitted`, saying why) from ``decide``;
nothing is counted, waiting does not wait for what never comes, and hooks see the refusal.
On every store. (The HTTP edge: tests/test_asgi_costs.py; the service:
tests/test_service_refusals.py.)"""

from __future__ import annotations

import logging

import pytest

import ratelimit.sync
from ratelimit import ConfigurationError, Decision, MemoryBackend, RateLimit, RateLimitExceeded
from ratelimit.core.decision import NeverAdmitted

pytestmark = pytest.mark.timeout(60)


async def test_a_decorated_call_whose_cost_is_above_a_rule_is_refused(rl: RateLimit) -> None:
    seen: list[Decision] = []
    limiter = RateLimit(rl.storage, rl.namespace, hooks=[seen.append])

    @limiter.limit("api:1000 tokens/m", cost=lambda api, n: {"tokens": n}, wait=True)
    async def chat(api: str, n: int) -> int:
        return n

    with pytest.raises(RateLimitExceeded) as refused:
        await chat("a", 1001)  # wait=True: no wait would admit it, so it does not wait
    assert isinstance(refused.value.decision, NeverAdmitted)
    assert "its cost (1001) is more than rule 'api:1000 tokens/m' admits at once (1000)" in str(
        refused.value
    )
    assert "retrying the same call will not help" in str(refused.value)
    assert [d.allowed for d in seen] == [False]  # hooks see the refusal
    assert await chat("a", 1000) == 1000  # nothing was counted


async def test_decide_and_async_with_refuse_a_cost_above_the_rule(rl: RateLimit) -> None:
    limit = rl.limit("user:5/m", user="u", key="k")
    decision = await limit.decide(cost=6)
    assert not decision.allowed
    assert isinstance(decision, NeverAdmitted)
    assert str(decision.rule) == "user:5/m"
    with pytest.raises(RateLimitExceeded):
        async with rl.limit("user:5/m", user="u", key="k", cost=lambda: 9):
            pass
    assert (await limit.decide(cost=5)).allowed  # the 6 and the 9 counted nothing


async def test_a_gcra_cost_above_the_burst_is_refused(gcra: RateLimit) -> None:
    decision = await gcra.limit("user:10/s burst 3", user="u", key="k").decide(cost=4)
    assert isinstance(decision, NeverAdmitted)
    assert "admits at once (3)" in decision.why


async def test_a_cost_the_sliding_log_cannot_count_at_once_is_refused_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rl = RateLimit(MemoryBackend())
    limit = rl.limit("90000 tokens/m", key="budget", cost=lambda: {"tokens": 2000})
    with caplog.at_level(logging.WARNING, "ratelimit"):
        decision = await limit.decide()
        await limit.decide()
    assert isinstance(decision, NeverAdmitted)
    assert decision.why == "its cost (2000) is more than this limiter counts in one call"
    warned = [r.getMessage() for r in caplog.records if "refuses calls" in r.getMessage()]
    assert len(warned) == 1  # the operator is told once, with what to do
    assert "sliding-window" in warned[0]


async def test_a_never_admitted_call_counts_toward_no_penalty() -> None:
    rl = RateLimit(MemoryBackend())
    limit = rl.limit("ip:1000/m", ip="1.2.3.4", key="k", penalty="2 refusals/10m for 1h")
    for _ in range(3):
        assert isinstance(await limit.decide(cost=5000), NeverAdmitted)
    small = await limit.decide(cost=10)
    assert small.allowed  # the big ones were their cost's fault, never the client's rate
    assert small.penalty is None


async def test_a_cost_of_the_wrong_kind_is_still_an_error() -> None:
    rl = RateLimit(MemoryBackend())
    limit = rl.limit("10/m", key="k", cost=lambda: {"tokens": 5})
    with pytest.raises(ConfigurationError, match="names unit 'tokens'"):
        await limit.decide()  # a unit no rule counts: the code is wrong, not the call
    with pytest.raises(ConfigurationError, match="whole number"):
        await rl.limit("10/m", key="k").decide(cost=1.5)


def test_the_sync_api_refuses_a_cost_above_the_rule() -> None:
    with ratelimit.sync.RateLimit.from_url("memory://") as rl:

        @rl.limit("10/m", cost=lambda n: n)
        def work(n: int) -> int:
            return n

        with pytest.raises(RateLimitExceeded, match="never admitted"):
            work(11)
        assert work(10) == 10
