"""One Envoy request is one atomic decision whatever its descriptors' ``hits_addend``: a
request refused by one descriptor counts on none of the others. A real ``ratelimit serve``
process on memory and on Redis, real gRPC clients, every algorithm."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from ratelimit.algorithms import ALGORITHMS
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from tests.service_process import ServiceProcess, rules_env

pytestmark = pytest.mark.timeout(120)
RLS = rls_pb2.RateLimitResponse
RULES = """\
[[limit]]
domain = "costs"
descriptor = ["a"]
rule = "5/h"

[[limit]]
domain = "costs"
descriptor = ["b"]
rule = "2/h"
"""
_names = itertools.count()


@pytest.fixture(
    scope="module",
    params=[
        *(("memory", algorithm) for algorithm in ALGORITHMS),
        *(
            pytest.param(("redis", algorithm), marks=pytest.mark.redis)
            for algorithm in ("sliding-log", "gcra")
        ),
    ],
    ids=lambda param: "-".join(param),
)
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    store, algorithm = request.param
    storage = request.getfixturevalue("redis_url") if store == "redis" else None
    env = rules_env(tmp_path_factory.mktemp("costs"), RULES, storage, f"costs-{algorithm}")
    with ServiceProcess({**env, "RATELIMIT_ALGORITHM": algorithm}) as running:
        yield running


@pytest.fixture
async def envoy(service: ServiceProcess) -> AsyncIterator[rls_pb2_grpc.RateLimitServiceAsyncStub]:
    async with grpc.aio.insecure_channel(service.address) as channel:
        yield rls_pb2_grpc.RateLimitServiceStub(channel)


def descriptor(asked: rls_pb2.RateLimitRequest, key: str, value: str, addend: int) -> None:
    added = asked.descriptors.add()
    added.entries.add(key=key, value=value)
    added.hits_addend.value = addend


async def test_a_request_refused_by_one_descriptor_counts_on_none(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    a, b = f"a-{next(_names)}", f"b-{next(_names)}"
    both = rls_pb2.RateLimitRequest(domain="costs")
    descriptor(both, "a", a, 1)  # a: 5/h, one hit a request
    descriptor(both, "b", b, 2)  # b: 2/h, two hits a request
    first = await envoy.ShouldRateLimit(both, timeout=10)
    assert first.overall_code == RLS.OK
    assert [s.limit_remaining for s in first.statuses] == [4, 0]
    for _ in range(2):  # refused by b: a must count neither
        refused = await envoy.ShouldRateLimit(both, timeout=10)
        assert refused.overall_code == RLS.OVER_LIMIT
        assert [s.code for s in refused.statuses] == [RLS.OK, RLS.OVER_LIMIT]
    only_a = rls_pb2.RateLimitRequest(domain="costs")
    descriptor(only_a, "a", a, 1)
    codes = [(await envoy.ShouldRateLimit(only_a, timeout=10)).overall_code for _ in range(5)]
    assert codes == [RLS.OK] * 4 + [RLS.OVER_LIMIT]  # one hit of a counted, not three
