"""The rate-limit service: its configuration, rules file and command line in process, and
``python -m ratelimit serve`` as a real process answering real gRPC clients on loopback
(ratio's API and Envoy's RLS, on memory and on a real Redis)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ratelimit.cli.command import main as cli
from ratelimit.errors import ConfigurationError
from ratelimit.service import rules_file
from ratelimit.service.config import ServiceConfig
from ratelimit.service.handlers import ratio_tree
from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from ratelimit.service.server import Service
from tests.redis_server import RedisServer
from tests.service_process import ROOT, ServiceProcess

pytestmark = pytest.mark.timeout(120)
RLS = rls_pb2.RateLimitResponse
RULES = """\
# the rules of the tests
[[limit]]
domain = "envoy"
descriptor = ["remote_address"]
rule = "3/m"

[[limit]]
domain = "envoy"
descriptor = ["path=/login", "remote_address"]
rule = "1/m | 10/h"

[[limit]]
domain = "envoy"
descriptor = ["client_id"]
rule = "1/m"
shadow = true
"""


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    return path


def descriptor(request: rls_pb2.RateLimitRequest, *entries: tuple[str, str]) -> None:
    added = request.descriptors.add()
    for key, value in entries:
        added.entries.add(key=key, value=value)


# --- configuration, rules file, command line ---


def test_configuration_from_the_environment() -> None:
    config = ServiceConfig.from_env(
        {
            "RATIO_STORAGE": "inmemory://",
            "RATIO_LIMIT": "2400/day",
            "RATIO_PORT": "7000",
            "RATIO_CONNECTION_TIMEOUT": "1m30s",
        }
    )
    assert config == ServiceConfig(storage="memory://", rules="2400/day", port=7000, timeout=90)
    mine = ServiceConfig.from_env({"RATELIMIT_PORT": "8000", "RATIO_PORT": "7000"})
    assert mine.port == 8000  # RATELIMIT_* wins


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("RATELIMIT_PORT", "http", "RATELIMIT_PORT='http': a port is a number"),
        ("RATIO_PORT", "70000", "RATIO_PORT='70000'"),
        ("RATELIMIT_STORAGE", "mongodb://x", "RATELIMIT_STORAGE='mongodb://x'"),
        ("RATELIMIT_RULES", "10/x", "RATELIMIT_RULES='10/x': expected unit"),
        ("RATIO_LIMIT", "0/day", "RATIO_LIMIT='0/day'"),
        ("RATELIMIT_TIMEOUT", "soon", "RATELIMIT_TIMEOUT='soon': a duration"),
        ("RATELIMIT_TIMEOUT", "0", "above 0"),
        ("RATELIMIT_ON_ERROR", "raise", "RATELIMIT_ON_ERROR='raise'"),
        ("RATELIMIT_ALGORITHM", "leaky", "RATELIMIT_ALGORITHM='leaky': the algorithm is one of"),
        ("RATELIMIT_MAX_DESCRIPTORS", "0", "RATELIMIT_MAX_DESCRIPTORS='0': the most descriptors"),
        ("RATELIMIT_MAX_DESCRIPTORS", "lots", "RATELIMIT_MAX_DESCRIPTORS='lots'"),
    ],
)
def test_a_bad_variable_is_named(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        ServiceConfig.from_env({variable: value})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[limit]]\ndomain = "e"\ndescriptor = ["k"]\nrule = "10/x"\n', "line 1 .*rule '10/x'"),
        (
            RULES + '\n[[limit]]\ndomain = "envoy"\ndescriptor = ["k"]\nrule = "user:1/s"\n',
            "line 18 .*names a selector",
        ),
        (
            RULES
            + '\n[[limit]]\ndomain = "envoy"\ndescriptor = ["remote_address"]\nrule = "1/s"\n',
            "line 18: .*already limited at line 2",
        ),
        (
            '[[limit]]\ndomain = "e"\ndescriptor = ["k"]\nrule = "1/s"\nburst = 3\n',
            "line 1 .*unknown key 'burst'",
        ),
        ('[[limit]]\ndomain = "e"\ndescriptor = "k"\nrule = "1/s"\n', "descriptor must be a list"),
        ("[[limit]\n", "not valid TOML.*line 1"),
        ("[limits]\nx = 1\n", "unknown table or key 'limits'"),
    ],
)
def test_a_bad_rules_file_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=message):
        rules_file.load(path)


def test_bursts_need_gcra_in_the_rules_file_and_ratios_rules(tmp_path: Path) -> None:
    path = tmp_path / "burst.toml"
    path.write_text('[[limit]]\ndomain = "e"\ndescriptor = ["k"]\nrule = "10/s burst 20"\n')
    with pytest.raises(ConfigurationError, match="line 1: rule '10/s burst 20' names a burst"):
        rules_file.load(path)
    assert str(rules_file.load(path, "gcra").limits[0].rules) == "10/s burst 20"
    with pytest.raises(ConfigurationError, match="RATELIMIT_RULES='5/s burst 1': rule"):
        ratio_tree("5/s burst 1")
    assert ServiceConfig.from_env({"RATELIMIT_ALGORITHM": "gcra"}).algorithm == "gcra"


async def test_the_service_decides_by_the_algorithm_it_is_given() -> None:
    service = Service(ServiceConfig(algorithm="gcra", rules="owner:10/s burst 2", metrics="none"))
    request = ratio_pb2.RateLimitRequest(owner="o", resource="r")
    try:
        answers = [(await service.handlers.rate_limit(request)).code for _ in range(3)]
    finally:
        await service.limiter.aclose()
    ok, over = ratio_pb2.RateLimitResponse.OK, ratio_pb2.RateLimitResponse.OVER_LIMIT
    assert answers == [ok, ok, over]  # a burst of 2, then one every 100 ms


def test_descriptors_match_the_most_specific_limit(rules: Path) -> None:
    loaded = rules_file.load(rules)
    login = loaded.match("envoy", [("path", "/login"), ("remote_address", "1.2.3.4")])
    assert login is not None
    assert str(login.rules) == "1/m | 10/h"
    assert loaded.match("envoy", [("path", "/other"), ("remote_address", "1.2.3.4")]) is None
    assert loaded.match("other", [("remote_address", "1.2.3.4")]) is None


def test_the_command_line(rules: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["check", "apikey:100/h & (10/s | 15/m)"]) == 0
    assert "more than 100 calls per hour for one apikey, and" in capsys.readouterr().out
    assert cli(["check", "user:10/s burst 20"]) == 0
    assert "more than 10 calls per second (sustained; up to 20 at once)" in capsys.readouterr().out
    assert cli(["check", "10/x"]) == 1
    assert "expected unit" in capsys.readouterr().err
    assert cli(["check", str(rules)]) == 0
    assert "3 limits in 1 domain (envoy)" in capsys.readouterr().out
    assert cli(["peek", "--key", "k", "user:1/m", "user=ann"]) == 1  # memory://: refused
    assert "pass --storage" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        cli(["peek", "user:1/m"])
    assert usage.value.code == 2
    env = {"RATELIMIT_PORT": "http", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "ratelimit", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert "RATELIMIT_PORT='http'" in done.stderr
    with ServiceProcess() as running:  # a port in use: said, exit code 3
        env = {"RATELIMIT_PORT": str(running.port), "RATELIMIT_HOST": "127.0.0.1"}
        taken = subprocess.run(
            [sys.executable, "-m", "ratelimit", "serve"],
            env={**os.environ, **env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert taken.returncode == 3
    assert "cannot listen on 127.0.0.1:" in taken.stderr


@pytest.mark.redis
def test_peek_and_reset_on_redis(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    import redis

    from ratelimit import RateLimit

    async def spend() -> None:
        async with RateLimit.from_url(redis_url, namespace="cli") as rl:
            await rl.limit("user:1/m", key="k", user="ann").decide()

    asyncio.run(spend())
    args = ["--storage", redis_url, "--namespace", "cli", "--key", "k", "user:1/m", "user=ann"]
    assert cli(["peek", *args]) == 1
    assert "would be refused by user:1/m" in capsys.readouterr().out
    assert cli(["reset", *args]) == 0
    assert cli(["peek", *args]) == 0
    redis.Redis.from_url(redis_url).close()
    dead = ["--storage", "redis://127.0.0.1:1/0", "--key", "k", "user:1/m", "user=ann"]
    assert cli(["peek", *dead]) == 3


# --- the service as a process, real gRPC clients ---


@pytest.fixture(scope="module", params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    """One service per storage for the tests below, each test with names of its own."""
    rules = tmp_path_factory.mktemp("service") / "rules.toml"
    rules.write_text(RULES)
    env = {"RATELIMIT_RULES": "2/m", "RATELIMIT_RULES_FILE": str(rules)}
    if request.param == "redis":
        env["RATELIMIT_STORAGE"] = request.getfixturevalue("redis_url")
        env["RATELIMIT_NAMESPACE"] = f"svc-{time.monotonic_ns()}"
    with ServiceProcess(env) as running:
        yield running


@pytest.fixture
async def channel(service: ServiceProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(service.address) as opened:
        yield opened


async def test_ratio_api(channel: grpc.aio.Channel) -> None:
    stub = ratio_pb2_grpc.RateLimitServiceStub(channel)
    ask = ratio_pb2.RateLimitRequest(owner="ann", resource="search")
    answers = [await stub.RateLimit(ask) for _ in range(3)]
    codes = [a.code for a in answers]
    assert codes == [ratio_pb2.RateLimitResponse.OK] * 2 + [ratio_pb2.RateLimitResponse.OVER_LIMIT]
    assert [a.remaining for a in answers[:2]] == [1, 0]
    assert 59 < answers[2].retry_after <= 60
    other = await stub.RateLimit(ratio_pb2.RateLimitRequest(owner="ann", resource="other"))
    assert other.code == ratio_pb2.RateLimitResponse.OK  # per (owner, resource), as ratio
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await stub.RateLimit(ratio_pb2.RateLimitRequest(owner="ann"))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_envoy_rls(channel: grpc.aio.Channel) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    request = rls_pb2.RateLimitRequest(domain="envoy")
    descriptor(request, ("remote_address", "10.1.1.1"))
    descriptor(request, ("path", "/login"), ("remote_address", "10.1.1.1"))
    descriptor(request, ("path", "/unlimited"))
    first = await stub.ShouldRateLimit(request)
    assert first.overall_code == RLS.OK
    ip, login, free = first.statuses
    assert (ip.code, ip.limit_remaining, ip.current_limit.requests_per_unit) == (RLS.OK, 2, 3)
    assert ip.current_limit.unit == RLS.RateLimit.MINUTE
    assert 59 <= ip.duration_until_reset.seconds <= 60
    assert (login.code, login.limit_remaining) == (RLS.OK, 0)
    assert login.current_limit.name == "1/m | 10/h"
    assert free.code == RLS.OK
    assert not free.HasField("current_limit")
    second = await stub.ShouldRateLimit(request)
    assert second.overall_code == RLS.OVER_LIMIT
    assert [s.code for s in second.statuses] == [RLS.OK, RLS.OVER_LIMIT, RLS.OK]
    # one atomic decision: the refused request counted nothing, on any descriptor
    assert second.statuses[0].limit_remaining == 2
    only_ip = rls_pb2.RateLimitRequest(domain="envoy", hits_addend=2)
    descriptor(only_ip, ("remote_address", "10.1.1.1"))
    spent = await stub.ShouldRateLimit(only_ip)
    assert (spent.overall_code, spent.statuses[0].limit_remaining) == (RLS.OK, 0)


async def test_more_hits_than_the_rules_count_are_refused_not_invalid(
    channel: grpc.aio.Channel,
) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    request = rls_pb2.RateLimitRequest(domain="envoy", hits_addend=4)
    descriptor(request, ("remote_address", "never"))
    answer = await stub.ShouldRateLimit(request)  # a request's cost: OVER_LIMIT, not an error
    assert answer.overall_code == RLS.OVER_LIMIT
    request.hits_addend = 3
    spent = await stub.ShouldRateLimit(request)  # the 4 counted nothing
    assert (spent.overall_code, spent.statuses[0].limit_remaining) == (RLS.OK, 0)


async def test_shadow_descriptors_report_and_never_refuse(channel: grpc.aio.Channel) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    request = rls_pb2.RateLimitRequest(domain="envoy")
    descriptor(request, ("client_id", "c1"))
    answers = [await stub.ShouldRateLimit(request) for _ in range(2)]
    assert [a.overall_code for a in answers] == [RLS.OK, RLS.OK]
    assert answers[1].statuses[0].limit_remaining == 0


def malformed(case: str) -> rls_pb2.RateLimitRequest:
    request = rls_pb2.RateLimitRequest(domain="envoy")
    if case == "an empty descriptor":
        descriptor(request)
    elif case == "an empty value":
        descriptor(request, ("remote_address", ""))
    elif case == "an unknown domain":
        request.domain = "nowhere"
        descriptor(request, ("k", "v"))
    elif case == "no domain":
        request.domain = ""
        descriptor(request, ("k", "v"))
    elif case == "-1 sent as unsigned":
        request.hits_addend = 2**32 - 1
        descriptor(request, ("remote_address", "x"))
    return request


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("no descriptors", grpc.StatusCode.INVALID_ARGUMENT),
        ("an empty descriptor", grpc.StatusCode.INVALID_ARGUMENT),
        ("an empty value", grpc.StatusCode.INVALID_ARGUMENT),
        ("an unknown domain", grpc.StatusCode.NOT_FOUND),
        ("no domain", grpc.StatusCode.INVALID_ARGUMENT),
        ("-1 sent as unsigned", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_malformed_requests(
    channel: grpc.aio.Channel, case: str, code: grpc.StatusCode
) -> None:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ShouldRateLimit(malformed(case))
    assert refused.value.code() == code
    assert refused.value.details()


async def test_health_and_reflection(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", "RateLimitService", "envoy.service.ratelimit.v3.RateLimitService"):
        answer = await health.Check(health_pb2.HealthCheckRequest(service=name))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    replies = [reply async for reply in stub.ServerReflectionInfo(iter([ask]))]
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"RateLimitService", "envoy.service.ratelimit.v3.RateLimitService"} <= names


@pytest.mark.long
@pytest.mark.redis
@pytest.mark.parametrize("api", ["ratio", "envoy"])
def test_four_client_processes_admit_exactly_the_limit(
    api: str, redis_url: str, tmp_path: Path
) -> None:
    """4 processes x 50 concurrent RPCs on 50/10s: exactly 50 admitted."""
    path = tmp_path / "rules.toml"
    path.write_text(
        '[[limit]]\ndomain = "envoy"\ndescriptor = ["remote_address"]\nrule = "50/10s"\n'
    )
    env = {
        "RATELIMIT_STORAGE": redis_url,
        "RATELIMIT_NAMESPACE": f"exact-{api}-{time.monotonic_ns()}",
        "RATELIMIT_RULES": "50/10s",
        "RATELIMIT_RULES_FILE": str(path),
        "RATELIMIT_TIMEOUT": "10s",
    }
    with ServiceProcess(env) as service:
        start_at = time.time() + 3.0
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.service_worker",
                    service.address,
                    api,
                    "50",
                    str(start_at),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        admitted = []
        for worker in workers:
            with worker:
                admitted.append(int(worker.communicate(timeout=90)[0].strip()))
    assert sum(admitted) == 50, admitted


@pytest.mark.long
def test_rules_file_reloaded_under_traffic(rules: Path) -> None:
    """SIGHUP and a changed file both reload; a bad file keeps the old rules."""

    async def traffic(address: str, value: str, n: int) -> list[int]:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            request = rls_pb2.RateLimitRequest(domain="envoy")
            descriptor(request, ("remote_address", value))
            return [(await stub.ShouldRateLimit(request)).overall_code for _ in range(n)]

    with ServiceProcess({"RATELIMIT_RULES_FILE": str(rules)}) as service:
        assert asyncio.run(traffic(service.address, "a", 4)) == [RLS.OK] * 3 + [RLS.OVER_LIMIT]
        rules.write_text(RULES.replace('rule = "3/m"', 'rule = "5/m"'))
        service.signal(signal.SIGHUP)
        _wait_for(lambda: "rules file reloaded" in service.output)
        assert asyncio.run(traffic(service.address, "b", 6)) == [RLS.OK] * 5 + [RLS.OVER_LIMIT]
        rules.write_text(RULES.replace('rule = "3/m"', 'rule = "5/x"'))  # bad: kept out
        service.signal(signal.SIGHUP)
        _wait_for(lambda: "not reloaded" in service.output)
        assert "line 2" in service.output
        assert asyncio.run(traffic(service.address, "c", 6)) == [RLS.OK] * 5 + [RLS.OVER_LIMIT]
        time.sleep(1.1)  # an mtime that differs on coarse file systems too
        rules.write_text(RULES.replace('rule = "3/m"', 'rule = "1/m"'))  # seen by the watcher
        _wait_for(lambda: service.output.count("rules file reloaded") >= 2)
        assert asyncio.run(traffic(service.address, "d", 2)) == [RLS.OK, RLS.OVER_LIMIT]
        # reloads while calls keep coming: every call is answered, under the old or new rules
        answers, failures = asyncio.run(reload_during_traffic(service, rules))
        assert failures == []
        assert answers > 50


async def reload_during_traffic(service: ServiceProcess, rules: Path) -> tuple[int, list[str]]:
    answers, failures = 0, []
    stop = asyncio.Event()

    async def caller(n: int) -> None:
        nonlocal answers
        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            sent = 0
            while not stop.is_set():
                request = rls_pb2.RateLimitRequest(domain="envoy")
                descriptor(request, ("remote_address", f"load-{n}-{sent}"))
                sent += 1
                try:
                    reply = await stub.ShouldRateLimit(request, timeout=10)
                    assert reply.overall_code in (RLS.OK, RLS.OVER_LIMIT)
                    answers += 1
                except grpc.aio.AioRpcError as exc:
                    failures.append(str(exc.code()))

    callers = [asyncio.create_task(caller(n)) for n in range(4)]
    for rule in ("7/m", "8/m", "9/m"):
        await asyncio.sleep(0.2)
        text = RULES.replace('rule = "3/m"', f'rule = "{rule}"')
        await asyncio.to_thread(rules.write_text, text)
        service.signal(signal.SIGHUP)
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.gather(*callers)
    return answers, failures


def _wait_for(condition: object, timeout: float = 20.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_sigterm_answers_every_call_in_flight() -> None:
    async def run(service: ServiceProcess) -> tuple[int, int]:
        async with grpc.aio.insecure_channel(service.address) as channel:
            await channel.channel_ready()
            stub = ratio_pb2_grpc.RateLimitServiceStub(channel)

            async def one(n: int) -> bool:
                ask = ratio_pb2.RateLimitRequest(owner=f"o{n}", resource="r")
                return (await stub.RateLimit(ask, timeout=20)).code in (1, 2)

            calls = [asyncio.ensure_future(one(n)) for n in range(300)]
            await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
            service.signal(signal.SIGTERM)  # while most calls are still in flight
            results = await asyncio.gather(*calls, return_exceptions=True)
        answered = sum(r is True for r in results)
        refused = [r for r in results if r is not True]
        # a call is answered, or refused as UNAVAILABLE by the stopping server: none is
        # left to its deadline, half answered, or failed otherwise
        assert all(
            isinstance(r, grpc.aio.AioRpcError) and r.code() == grpc.StatusCode.UNAVAILABLE
            for r in refused
        ), {
            type(r).__name__ if not isinstance(r, grpc.aio.AioRpcError) else r.code()
            for r in refused
        }
        return answered, len(results)

    service = ServiceProcess().start()
    try:
        answered, sent = asyncio.run(run(service))
        assert service.wait(30) == 0
    finally:
        service.stop()
    assert "stopped" in service.output
    # every call was sent before SIGTERM, so every one is answered: the service drains
    # (answering until none has come for a moment) before it stops
    assert answered == sent == 300


@pytest.mark.long
@pytest.mark.redis
def test_redis_killed_fail_open_then_recovery() -> None:
    async def ask(address: str, n: int, owner: str) -> list[ratio_pb2.RateLimitResponse]:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = ratio_pb2_grpc.RateLimitServiceStub(channel)
            ask = ratio_pb2.RateLimitRequest(owner=owner, resource="r")
            return [await stub.RateLimit(ask, timeout=10) for _ in range(n)]

    with RedisServer() as redis:
        env = {"RATELIMIT_STORAGE": redis.url, "RATELIMIT_RULES": "2/m", "RATELIMIT_TIMEOUT": "0.5"}
        with ServiceProcess(env) as service:
            before = asyncio.run(ask(service.address, 3, "ann"))
            redis.stop()
            # another owner: ann's refusal stands in the denial cache, storage or not
            during = asyncio.run(ask(service.address, 3, "bob"))
            redis.start()
            started = time.monotonic()
            while True:  # recovery: decided by the storage again within a second
                after = asyncio.run(ask(service.address, 1, "cy"))[0]
                if not after.degraded or time.monotonic() - started > 5:
                    break
                time.sleep(0.05)
            recovered_in = time.monotonic() - started
    assert [a.code for a in before] == [1, 1, 2]
    assert all(a.code == 1 and a.degraded for a in during)  # fail-open: OK, marked degraded
    assert not after.degraded
    assert recovered_in < 1.0


def test_the_service_counts_decisions_in_opentelemetry() -> None:
    async def calls(address: str) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = ratio_pb2_grpc.RateLimitServiceStub(channel)
            for _ in range(3):
                await stub.RateLimit(ratio_pb2.RateLimitRequest(owner="ann", resource="r"))

    with ServiceProcess({"RATELIMIT_RULES": "2/m", "RATELIMIT_METRICS": "console"}) as service:
        asyncio.run(calls(service.address))
        service.signal(signal.SIGTERM)
        assert service.wait(30) == 0
    output = service.output
    assert '"name": "ratelimit.decisions"' in output
    assert '"outcome": "over_limit"' in output
    assert '"name": "ratelimit.decision.duration"' in output
    assert "ann" not in output  # selector values are never labels


async def test_shadow_descriptors_count_nothing_when_the_request_is_refused(rules: Path) -> None:
    """Handlers in process, on memory: what each identifier holds is read back."""
    from ratelimit import MemoryBackend, RateLimit
    from ratelimit.service.handlers import Handlers, ratio_tree

    backend = MemoryBackend()
    rl = RateLimit(backend, denial_cache=0)
    handlers = Handlers(rl, ratio_tree("2/m"), rules_file.load(rules), 5.0)
    only_ip = rls_pb2.RateLimitRequest(domain="envoy")
    descriptor(only_ip, ("remote_address", "10.7.7.7"))
    for _ in range(3):
        assert (await handlers.should_rate_limit(only_ip)).overall_code == RLS.OK
    both = rls_pb2.RateLimitRequest(domain="envoy")
    descriptor(both, ("remote_address", "10.7.7.7"))
    descriptor(both, ("client_id", "watched"))
    refused = await handlers.should_rate_limit(both)
    assert refused.overall_code == RLS.OVER_LIMIT
    assert [s.code for s in refused.statuses] == [RLS.OVER_LIMIT, RLS.OK]
    held = {identifier.value: len(hits) for identifier, hits in backend.logs().items() if hits}
    assert held == {"remote_address=10.7.7.7": 3}  # the shadow descriptor counted nothing
    only_shadow = rls_pb2.RateLimitRequest(domain="envoy")
    descriptor(only_shadow, ("client_id", "watched"))
    assert (await handlers.should_rate_limit(only_shadow)).overall_code == RLS.OK
    held = {identifier.value: len(hits) for identifier, hits in backend.logs().items()}
    assert held["client_id=watched"] == 1  # admitted: counted as usual
