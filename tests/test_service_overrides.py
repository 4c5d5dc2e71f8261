"""The service under overrides: Envoy's per-descriptor ``limit`` (``RateLimitOverride``)
replaces a rules-file limit, or limits a descriptor alone; overrides set with the command
line apply to descriptors (key ``envoy/<domain>``) and to ratio's API (key ``ratio``). A
real ``ratelimit serve`` process on Redis, real gRPC clients, the real command line."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from ratelimit.cli.command import main as cli
from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from tests.service_process import ServiceProcess, rules_env

pytestmark = [pytest.mark.timeout(120), pytest.mark.redis]
RLS = rls_pb2.RateLimitResponse
NAMESPACE = "service-overrides"
RULES = """\
[[limit]]
domain = "gw"
descriptor = ["tenant"]
rule = "2/m"

[[limit]]
domain = "gw"
descriptor = ["quiet"]
rule = "2/m"
shadow = true
"""
_names = itertools.count()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[ServiceProcess]:
    env = rules_env(tmp_path_factory.mktemp("overrides"), RULES, redis_url, NAMESPACE)
    with ServiceProcess({**env, "RATELIMIT_RULES": "owner:2/m"}) as running:
        yield running


@pytest.fixture
async def channel(service: ServiceProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(service.address) as opened:
        yield opened


def ask(key: str, value: str, limit: tuple[int, int] | None = None) -> rls_pb2.RateLimitRequest:
    asked = rls_pb2.RateLimitRequest(domain="gw")
    descriptor = asked.descriptors.add()
    descriptor.entries.add(key=key, value=value)
    if limit is not None:
        descriptor.limit.requests_per_unit, descriptor.limit.unit = limit
    return asked


async def codes(
    stub: rls_pb2_grpc.RateLimitServiceAsyncStub, request: rls_pb2.RateLimitRequest, n: int
) -> list[int]:
    return [(await stub.ShouldRateLimit(request, timeout=10)).overall_code for _ in range(n)]


async def test_envoys_limit_replaces_the_rules_file_limit(channel: grpc.aio.Channel) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    tenant = f"t-{next(_names)}"
    answer = await stub.ShouldRateLimit(ask("tenant", tenant, (5, RLS.RateLimit.MINUTE)))
    assert answer.statuses[0].current_limit.requests_per_unit == 5
    assert answer.statuses[0].current_limit.unit == RLS.RateLimit.MINUTE
    assert answer.statuses[0].limit_remaining == 4
    overridden = ask("tenant", tenant, (5, RLS.RateLimit.MINUTE))
    assert await codes(stub, overridden, 5) == [RLS.OK] * 4 + [RLS.OVER_LIMIT]
    # the rules file's 2/m counts on the same counter: 5 counted, over it too
    assert await codes(stub, ask("tenant", tenant), 1) == [RLS.OVER_LIMIT]


async def test_envoys_limit_applies_to_a_descriptor_no_limit_matches(
    channel: grpc.aio.Channel,
) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    request = ask("user", f"u-{next(_names)}", (1, RLS.RateLimit.HOUR))
    assert await codes(stub, request, 2) == [RLS.OK, RLS.OVER_LIMIT]
    assert await codes(stub, ask("user", f"u-{next(_names)}"), 3) == [RLS.OK] * 3  # no limit


async def test_envoys_limit_is_enforced_on_a_shadow_limit_and_zero_refuses(
    channel: grpc.aio.Channel,
) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    request = ask("quiet", f"q-{next(_names)}", (1, RLS.RateLimit.DAY))
    assert await codes(stub, request, 2) == [RLS.OK, RLS.OVER_LIMIT]
    zero = await stub.ShouldRateLimit(ask("tenant", f"t-{next(_names)}", (0, RLS.RateLimit.SECOND)))
    assert zero.overall_code == RLS.OVER_LIMIT
    assert zero.statuses[0].current_limit.requests_per_unit == 0


async def test_an_unknown_unit_is_an_invalid_argument(channel: grpc.aio.Channel) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ShouldRateLimit(ask("tenant", "t", (5, 0)))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unit" in (refused.value.details() or "")


async def run(argv: list[str]) -> int:
    """The command line, in a thread of its own (it runs its own event loop)."""
    return await asyncio.to_thread(cli, argv)


async def _until(check: object, seconds: float = 20.0) -> None:
    """Ask ``check`` (a coroutine function) until it is true: the service reads overrides
    within its refresh (1 s); the deadline is a margin, never the claim."""
    deadline = time.monotonic() + seconds
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the service never applied the override"
        await asyncio.sleep(0.05)  # polling another process: not a timing assertion


async def test_a_command_line_override_applies_to_descriptors(
    channel: grpc.aio.Channel, redis_url: str
) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    tenant = f"t-{next(_names)}"
    storage = ["--storage", redis_url, "--namespace", NAMESPACE]
    assert await run(["override", "set", *storage, "--key", "gw", f"tenant={tenant}", "9/m"]) == 0
    assert await run(["override", "delete", *storage, "--key", "gw", f"tenant={tenant}"]) == 0
    key = ["--key", "envoy/gw"]
    assert await run(["override", "set", *storage, *key, f"tenant={tenant}", "3/m"]) == 0

    async def three() -> bool:
        status = (await stub.ShouldRateLimit(ask("tenant", tenant), timeout=10)).statuses[0]
        return status.current_limit.requests_per_unit == 3

    await _until(three)
    assert await run(["override", "delete", *storage, *key, f"tenant={tenant}"]) == 0

    async def two() -> bool:
        status = (await stub.ShouldRateLimit(ask("tenant", tenant), timeout=10)).statuses[0]
        return status.current_limit.requests_per_unit == 2

    await _until(two)


async def test_a_command_line_override_applies_to_ratios_owner(
    channel: grpc.aio.Channel, redis_url: str
) -> None:
    stub = ratio_pb2_grpc.RateLimitServiceStub(channel)
    owner = f"o-{next(_names)}"
    storage = ["--storage", redis_url, "--namespace", NAMESPACE]
    assert (
        await run(["override", "set", *storage, "--key", "ratio", f"owner={owner}", "owner:5/m"])
        == 0
    )

    admitted = 0

    async def five() -> bool:  # the owner's hits carry on: 5 admitted in all under it
        nonlocal admitted
        answer = await stub.RateLimit(ratio_pb2.RateLimitRequest(owner=owner, resource="r"))
        admitted += answer.code == ratio_pb2.RateLimitResponse.OK
        return answer.code == ratio_pb2.RateLimitResponse.OK and answer.remaining == 5 - admitted

    await _until(five)
    other = await stub.RateLimit(ratio_pb2.RateLimitRequest(owner=f"x-{owner}", resource="r"))
    assert other.remaining == 1  # RATELIMIT_RULES owner:2/m for everyone else
