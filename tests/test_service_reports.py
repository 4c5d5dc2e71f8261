"""``always_count`` limits: usage reported after the fact (Envoy's ``apply_on_stream_done``,
the AI gateways' token accounting) is counted whether or not it is over the limit, and a
``hits_addend`` above the limit's count is counted; without ``always_count`` it is refused
(``OVER_LIMIT``), counting nothing. A real
``ratelimit serve`` process on Redis, real gRPC clients."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from tests.service_process import ServiceProcess, rules_env

pytestmark = [pytest.mark.timeout(120), pytest.mark.redis]
RLS = rls_pb2.RateLimitResponse
RULES = """\
[[limit]]
domain = "ai"
descriptor = ["api_key"]
rule = "1000/m"
always_count = true

[[limit]]
domain = "ai"
descriptor = ["plain"]
rule = "1000/m"

[[limit]]
domain = "ai"
descriptor = ["route"]
rule = "2/m"
"""
_names = itertools.count()


@pytest.fixture(scope="module", params=["sliding-window", "gcra"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[ServiceProcess]:
    algorithm = request.param
    env = rules_env(tmp_path_factory.mktemp("reports"), RULES, redis_url, f"reports-{algorithm}")
    with ServiceProcess({**env, "RATELIMIT_ALGORITHM": algorithm}) as running:
        yield running


@pytest.fixture
async def envoy(service: ServiceProcess) -> AsyncIterator[rls_pb2_grpc.RateLimitServiceAsyncStub]:
    async with grpc.aio.insecure_channel(service.address) as channel:
        yield rls_pb2_grpc.RateLimitServiceStub(channel)


def request(key: str, value: str, addend: int) -> rls_pb2.RateLimitRequest:
    asked = rls_pb2.RateLimitRequest(domain="ai", hits_addend=addend)
    asked.descriptors.add().entries.add(key=key, value=value)
    return asked


async def test_a_report_over_the_limit_is_counted_and_later_requests_wait_it_out(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    key = f"key-{next(_names)}"
    check = await envoy.ShouldRateLimit(request("api_key", key, 1), timeout=10)
    assert check.overall_code == RLS.OK
    report = await envoy.ShouldRateLimit(request("api_key", key, 1500), timeout=10)
    assert report.overall_code == RLS.OVER_LIMIT  # 1501 counted of 1000: over, and counted
    after = await envoy.ShouldRateLimit(request("api_key", key, 1), timeout=10)
    assert after.overall_code == RLS.OVER_LIMIT
    assert after.statuses[0].duration_until_reset.ToTimedelta().total_seconds() > 0


async def test_reports_refused_on_a_full_limit_still_count(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    key = f"key-{next(_names)}"
    assert (
        await envoy.ShouldRateLimit(request("api_key", key, 990), timeout=10)
    ).overall_code == RLS.OK
    refused = await envoy.ShouldRateLimit(request("api_key", key, 20), timeout=10)
    assert refused.overall_code == RLS.OVER_LIMIT  # 1010 > 1000: refused, and counted
    peek = await envoy.ShouldRateLimit(request("api_key", key, 1), timeout=10)
    assert peek.overall_code == RLS.OVER_LIMIT  # without the count, 991 + 1 would pass


async def test_a_limit_without_always_count_refuses_such_a_report(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    value = f"plain-{next(_names)}"
    never = await envoy.ShouldRateLimit(request("plain", value, 1500), timeout=10)
    assert never.overall_code == RLS.OVER_LIMIT  # above the count: refused, counting nothing
    assert (
        await envoy.ShouldRateLimit(request("plain", value, 990), timeout=10)
    ).overall_code == RLS.OK
    refused = await envoy.ShouldRateLimit(request("plain", value, 20), timeout=10)
    assert refused.overall_code == RLS.OVER_LIMIT
    fits = await envoy.ShouldRateLimit(request("plain", value, 10), timeout=10)
    assert fits.overall_code == RLS.OK  # the refused 20 counted nothing


async def test_an_always_count_descriptor_counts_when_another_refuses_the_request(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    key, route = f"key-{next(_names)}", f"route-{next(_names)}"
    both = rls_pb2.RateLimitRequest(domain="ai")
    both.descriptors.add().entries.add(key="route", value=route)
    both.descriptors.add().entries.add(key="api_key", value=key)
    for _ in range(2):
        assert (await envoy.ShouldRateLimit(both, timeout=10)).overall_code == RLS.OK
    refused = await envoy.ShouldRateLimit(both, timeout=10)  # the route's 2/m refuses
    assert refused.overall_code == RLS.OVER_LIMIT
    assert refused.statuses[1].limit_remaining == 997  # 3 counted on the key: the refused too
