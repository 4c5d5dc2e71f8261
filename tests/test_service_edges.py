"""The service at its edges (issue 21): counters that depend only on what a descriptor says,
requests too large to decide, a rules file caught mid-rewrite, SIGTERM under traffic and a
store that goes away. Real ``ratelimit serve`` processes, real gRPC clients."""

from __future__ import annotations

import asyncio
import itertools
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ratelimit import MemoryBackend, RateLimit
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan
from ratelimit.service import rules_file
from ratelimit.service.handlers import Handlers, ratio_tree
from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from tests.redis_server import RedisServer
from tests.service_process import ServiceProcess, rules_env

pytestmark = pytest.mark.timeout(120)
RLS = rls_pb2.RateLimitResponse
OK, OVER = RLS.OK, RLS.OVER_LIMIT
RULES = """\
[[limit]]
domain = "edges"
descriptor = ["user"]
rule = "2/h"

[[limit]]
domain = "edges"
descriptor = ["a", "b"]
rule = "1/h"
"""
_names = itertools.count()


def request(*descriptors: tuple[tuple[str, str], ...]) -> rls_pb2.RateLimitRequest:
    asked = rls_pb2.RateLimitRequest(domain="edges")
    for entries in descriptors:
        added = asked.descriptors.add()
        for key, value in entries:
            added.entries.add(key=key, value=value)
    return asked


def fresh(prefix: str) -> str:
    """A value no other test uses (the service of a module is shared)."""
    return f"{prefix}-{next(_names)}"


@pytest.fixture(scope="module", params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    redis = request.param == "redis"
    storage = request.getfixturevalue("redis_url") if redis else None
    env = rules_env(tmp_path_factory.mktemp("edges"), RULES, storage, fresh("edges"))
    with ServiceProcess({**env, "RATELIMIT_RULES": "1/h"}) as running:
        yield running


@pytest.fixture
async def envoy(service: ServiceProcess) -> AsyncIterator[rls_pb2_grpc.RateLimitServiceAsyncStub]:
    async with grpc.aio.insecure_channel(service.address) as channel:
        yield rls_pb2_grpc.RateLimitServiceStub(channel)


# --- item 5: a descriptor's counter does not depend on its position in the request ---


async def test_one_descriptor_at_any_position_has_one_counter(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    """``user 2/h``: ``[x]`` 3 times, ``[y_i, x]`` 3 times, ``[z_i, w_i, x]`` 3 times admit
    ``x`` exactly twice in all."""
    x = (("user", fresh("x")),)
    asked = [request(x)] * 3
    asked += [request((("user", fresh("y")),), x) for _ in range(3)]
    asked += [request((("user", fresh("z")),), (("user", fresh("w")),), x) for _ in range(3)]
    admitted = 0
    for one in asked:
        answer = await envoy.ShouldRateLimit(one, timeout=10)
        status = answer.statuses[-1]  # x's
        admitted += status.code == OK
        assert (answer.overall_code == OK) == (status.code == OK)  # the others are fresh
    assert admitted == 2


async def test_one_limit_twice_in_a_request_counts_each_value(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    """Two values of one limit in one request are counted on their own counters, the
    same counters a request naming one of them alone uses."""
    x, y = (("user", fresh("x")),), (("user", fresh("y")),)
    both = await envoy.ShouldRateLimit(request(x, y), timeout=10)
    assert [s.limit_remaining for s in both.statuses] == [1, 1]
    alone = await envoy.ShouldRateLimit(request(y), timeout=10)
    assert alone.statuses[0].limit_remaining == 0  # y's second hit
    swapped = await envoy.ShouldRateLimit(request(y, x), timeout=10)
    assert swapped.overall_code == OVER  # y is used up, wherever it sits
    assert [s.code for s in swapped.statuses] == [OVER, OK]


# --- item 6: joined fields never collide ---


async def test_envoy_entries_that_join_alike_have_their_own_counters(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    tag = fresh("t")
    first = ((("a", f"{tag}1\x1fb=2"), ("b", "3")),)
    second = ((("a", f"{tag}1"), ("b", "2\x1fb=3")),)
    assert (await envoy.ShouldRateLimit(request(*first), timeout=10)).overall_code == OK
    assert (await envoy.ShouldRateLimit(request(*second), timeout=10)).overall_code == OK
    again = await envoy.ShouldRateLimit(request(*first), timeout=10)
    assert again.overall_code == OVER  # each is limited on its own: 1/h
    backslash = ((("a", f"{tag}\\"), ("b", "x")),)  # escapes of the encoding itself
    escaped = ((("a", f"{tag}\\\\"), ("b", "x")),)
    assert (await envoy.ShouldRateLimit(request(*backslash), timeout=10)).overall_code == OK
    assert (await envoy.ShouldRateLimit(request(*escaped), timeout=10)).overall_code == OK


async def test_ratio_owner_and_resource_that_join_alike_have_their_own_counters(
    service: ServiceProcess,
) -> None:
    tag = fresh("o")
    async with grpc.aio.insecure_channel(service.address) as channel:
        stub = ratio_pb2_grpc.RateLimitServiceStub(channel)
        pairs = [
            (f"{tag}a\x1fb", "c"),
            (f"{tag}a", "b\x1fc"),
            (f"{tag}a\\", "c"),
            (f"{tag}a", "\\c"),
        ]
        answers = [
            await stub.RateLimit(ratio_pb2.RateLimitRequest(owner=o, resource=r), timeout=10)
            for o, r in pairs
        ]
        again = await stub.RateLimit(
            ratio_pb2.RateLimitRequest(owner=pairs[0][0], resource="c"), timeout=10
        )
    assert [a.code for a in answers] == [ratio_pb2.RateLimitResponse.OK] * 4  # 1/h each
    assert again.code == ratio_pb2.RateLimitResponse.OVER_LIMIT


# --- item 11: one huge request, linear work, a cap ---


async def test_descriptors_past_the_cap_are_invalid_argument(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    """The default cap, 100 descriptors: a request at it is answered, one past it refused
    naming the cap."""
    at_cap = request(*((("user", fresh("cap")),) for _ in range(100)))
    answer = await envoy.ShouldRateLimit(at_cap, timeout=60)
    assert answer.overall_code == OK
    assert len(answer.statuses) == 100
    at_cap.descriptors.add().entries.add(key="user", value=fresh("cap"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await envoy.ShouldRateLimit(at_cap, timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert "101 descriptors" in details
    assert "at most 100 " in details
    assert "RATELIMIT_MAX_DESCRIPTORS" in details


def test_the_cap_is_configurable(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)

    async def ask(address: str, n: int) -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            try:
                await stub.ShouldRateLimit(
                    request(*((("user", fresh("c")),) for _ in range(n))), timeout=10
                )
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    env = {"RATELIMIT_RULES_FILE": str(path), "RATELIMIT_MAX_DESCRIPTORS": "3"}
    with ServiceProcess(env) as service:
        assert asyncio.run(ask(service.address, 3)) == grpc.StatusCode.OK
        assert asyncio.run(ask(service.address, 4)) == grpc.StatusCode.INVALID_ARGUMENT


def _lines_run(handlers: Handlers, asked: rls_pb2.RateLimitRequest) -> int:
    """How many lines of the package's code deciding ``asked`` runs (a count of work that
    does not depend on the machine's speed)."""
    package = str(Path(rules_file.__file__).resolve().parent.parent)
    lines = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(package) else None

    async def decide() -> None:
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            await handlers.should_rate_limit(asked)
        finally:
            sys.settrace(previous)

    asyncio.run(decide())
    return lines


def test_the_work_of_a_request_grows_linearly_with_its_descriptors(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    rl = RateLimit(MemoryBackend(), denial_cache=0)
    handlers = Handlers(rl, ratio_tree("1/h"), rules_file.load(path), 60.0, 1000)
    work = {}
    for n in (200, 800):
        users = request(*((("user", f"u{n}-{i}"),) for i in range(n)))
        _lines_run(handlers, users)  # once to fill the caches a request's shape fills
        users = request(*((("user", f"v{n}-{i}"),) for i in range(n)))
        work[n] = _lines_run(handlers, users)
    assert work[800] < 5 * work[200], work  # 4 times the descriptors: about 4 times the work


# --- item 13: SIGTERM under continuous traffic ---


@pytest.mark.long
def test_sigterm_under_continuous_traffic_answers_every_call_it_accepts() -> None:
    """Clients that never stop calling (nor look at health): after SIGTERM every call is
    answered, or refused as UNAVAILABLE before the service took it; none is cancelled,
    and the process exits 0 within its grace."""
    outcomes: dict[str, int] = {}
    stopping = {"signalled": 0.0}
    flowing = asyncio.Event()  # 200 calls answered: traffic is flowing

    async def caller(address: str, n: int, stop: asyncio.Event) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = ratio_pb2_grpc.RateLimitServiceStub(channel)
            sent = 0
            while not stop.is_set():
                sent += 1
                ask = ratio_pb2.RateLimitRequest(owner=f"c{n}", resource=str(sent))
                try:
                    answer = await stub.RateLimit(ask, timeout=30)
                    outcome = ratio_pb2.RateLimitResponse.Code.Name(answer.code)
                except grpc.aio.AioRpcError as exc:
                    outcome = exc.code().name
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if outcomes.get("OK", 0) >= 200:
                    flowing.set()

    async def run(service: ServiceProcess) -> None:
        stop = asyncio.Event()
        callers = [asyncio.create_task(caller(service.address, n, stop)) for n in range(8)]
        await flowing.wait()
        stopping["signalled"] = time.monotonic()
        service.signal(signal.SIGTERM)
        await asyncio.to_thread(service.wait, 60)
        stop.set()
        await asyncio.gather(*callers)

    service = ServiceProcess({"RATELIMIT_RULES": "100000/h"}).start()
    try:
        asyncio.run(run(service))
        exited_after = time.monotonic() - stopping["signalled"]
        code = service.wait(30)
    finally:
        service.stop()
    assert code == 0, service.output
    assert set(outcomes) <= {"OK", "OVER_LIMIT", "UNAVAILABLE"}, outcomes
    assert outcomes["OK"] >= 200
    assert exited_after < 10 + 5, exited_after  # the grace, and a margin to exit


# --- item 16: the store's health, and one log line per outage ---


async def _store_health(address: str) -> str:
    return await _health(address, "ratelimit.store")


async def _calls(address: str, n: int, owner: str) -> list[ratio_pb2.RateLimitResponse]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ratio_pb2_grpc.RateLimitServiceStub(channel)
        ask = ratio_pb2.RateLimitRequest(owner=owner, resource="r")
        return [await stub.RateLimit(ask, timeout=10) for _ in range(n)]


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)  # polling another process's state, not waiting for a window


@pytest.mark.redis
def test_the_stores_health_and_one_log_line_when_an_outage_starts_and_ends() -> None:
    """Redis stopped under a served process: ``ratelimit.store`` turns NOT_SERVING, 200
    degraded calls log one line, and when Redis is back the health turns SERVING (without
    a call) and one line says so, with the count."""
    with RedisServer() as redis:
        env = {"RATELIMIT_STORAGE": redis.url, "RATELIMIT_RULES": "1000/m"}
        env["RATELIMIT_TIMEOUT"] = "0.5"
        with ServiceProcess(env) as service:
            address = service.address
            assert all(not a.degraded for a in asyncio.run(_calls(address, 5, "before")))
            assert asyncio.run(_store_health(address)) == "SERVING"
            redis.stop()
            during = asyncio.run(_calls(address, 200, "during"))
            assert all(a.degraded and a.code == ratio_pb2.RateLimitResponse.OK for a in during)
            _until(lambda: asyncio.run(_store_health(address)) == "NOT_SERVING")
            overall = asyncio.run(_health(address, ""))
            assert overall == "SERVING"  # the service answers: fail-open, marked degraded
            redis.start()
            _until(lambda: asyncio.run(_store_health(address)) == "SERVING")
            assert all(not a.degraded for a in asyncio.run(_calls(address, 5, "after")))
    lines = service.lines
    failed = [line for line in lines if "storage failed" in line]
    back = [line for line in lines if "answers again" in line]
    assert len(failed) == 1, service.output
    assert len(back) == 1, service.output
    assert "200 decisions were degraded" in back[0]
    warnings = [line for line in lines if "WARNING" in line]
    assert warnings == failed + back, service.output  # nothing per call


async def _health(address: str, name: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))


class _SlowBackend(MemoryBackend):
    """A store that answers nothing until ``answering`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.answering = asyncio.Event()

    async def decide(self, plan: Plan) -> Decision:
        await self.answering.wait()
        return await super().decide(plan)


async def test_calls_past_their_deadline_are_one_outage_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The service's own deadline is a storage failure like any other: the failure policy
    answers, the outage is logged once when it starts and once when it ends."""
    backend = _SlowBackend()
    rl = RateLimit(backend, denial_cache=0)
    handlers = Handlers(rl, ratio_tree("1000/m"), None, 0.05)
    ask = ratio_pb2.RateLimitRequest(owner="o", resource="r")
    with caplog.at_level("INFO"):
        answers = await asyncio.gather(*(handlers.rate_limit(ask) for _ in range(50)))
        assert all(a.degraded and a.code == ratio_pb2.RateLimitResponse.OK for a in answers)
        assert rl.storage_failing
        backend.answering.set()
        assert not (await handlers.rate_limit(ask)).degraded
    assert not rl.storage_failing
    messages = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(messages) == 2, messages
    assert "storage failed" in messages[0]
    assert "took over 0.05 s" in messages[0]
    assert "50 decisions were degraded" in messages[1]
