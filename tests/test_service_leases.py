"""Leases in the service (``RATELIMIT_LEASE``): ``ratelimit serve`` with a rules file and
``ratelimit serve --envoy`` with our algorithms beneath take a slice of a hot descriptor's
limit from the store in one decision and answer the requests that follow from it
(:mod:`ratelimit.backends.leases`).

The variable is read and checked at start (refused without ``RATELIMIT_ALGORITHM`` under
``--envoy``); what the services decide is one plan of one cost when every descriptor counts
the same hits (which leases), per call when they differ; a hot descriptor takes far fewer
store decisions than requests and admits exactly its limit, in process on a fake clock, over
gRPC in process, and as processes on a real Redis (the store's script calls counted from
``INFO commandstats`` of a redis-server started here). No test waits for time to pass: the
fake clock does not move, and leases on the real clock hold for seconds, longer than a
test's requests take.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
import redis.asyncio as aioredis
from google.protobuf import wrappers_pb2

from ratelimit import MemoryBackend, RateLimit
from ratelimit.backends.base import SettleStore
from ratelimit.backends.leases import LeasedBackend
from ratelimit.core.decision import Decision
from ratelimit.core.plan import Plan
from ratelimit.core.settling import Settlement
from ratelimit.errors import ConfigurationError
from ratelimit.service import rules_file
from ratelimit.service.config import ServiceConfig
from ratelimit.service.envoy_config import EnvoyConfig
from ratelimit.service.envoy_config.yaml_go import root_of
from ratelimit.service.envoy_service import server as envoy_server
from ratelimit.service.envoy_service.answers import Answering
from ratelimit.service.envoy_service.our_answers import OurAnswers
from ratelimit.service.envoy_service.server import EnvoyService
from ratelimit.service.envoy_service.settings import (
    HONOURED,
    IGNORED,
    OURS,
    EnvoySettings,
    unhonoured,
)
from ratelimit.service.envoy_service.stats import EnvoyStats
from ratelimit.service.handlers import Handlers, ratio_tree
from ratelimit.service.observing import start_line
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from ratelimit.service.proto.envoy.common_pb2 import RateLimitDescriptor
from ratelimit.service.server import Service
from tests.conftest import FakeClock
from tests.redis_server import RedisServer
from tests.service_process import ROOT, EnvoyProcess, ServiceProcess

pytestmark = pytest.mark.timeout(60)
RLS = rls_pb2.RateLimitResponse
OK, OVER = RLS.OK, RLS.OVER_LIMIT
LEASED = ["sliding-log", "sliding-window", "fixed-window"]
"""Our algorithms that lease (GCRA decides every call at the store)."""
HOT = 200
"""The hot descriptor's limit, per hour. Window counters decide it on the fake clock only
(a window could end while a test runs on the real one); on the real clock the sliding log
does, whose hits stay counted for the hour."""
WIDE = 100_000
"""The other descriptor's limit, per day: never reached."""


def toml_rules(hot: int = HOT) -> str:
    return textwrap.dedent(
        f"""\
        [[limit]]
        domain = "d"
        descriptor = ["user"]
        rule = "{hot}/h"

        [[limit]]
        domain = "d"
        descriptor = ["tenant"]
        rule = "{WIDE}/d"
        """
    )


def envoy_yaml(hot: int = HOT) -> str:
    return textwrap.dedent(
        f"""\
        domain: d
        descriptors:
          - key: user
            rate_limit: {{unit: hour, requests_per_unit: {hot}}}
          - key: tenant
            rate_limit: {{unit: day, requests_per_unit: {WIDE}}}
        """
    )


def asked(*descriptors: tuple[str, str, int | None], hits: int = 0) -> rls_pb2.RateLimitRequest:
    """A request of domain ``d``: one descriptor per (key, value, its own hits_addend or
    ``None``), the request's ``hits_addend`` ``hits`` (0: unset, one hit)."""
    request = rls_pb2.RateLimitRequest(domain="d", hits_addend=hits)
    for key, value, own in descriptors:
        descriptor: RateLimitDescriptor = request.descriptors.add()
        descriptor.entries.add(key=key, value=value)
        if own is not None:
            descriptor.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=own))
    return request


def headers(answer: rls_pb2.RateLimitResponse) -> dict[str, str]:
    return {header.key: header.value for header in answer.response_headers_to_add}


class Counting(MemoryBackend):
    """``memory://`` that counts the decisions it is asked for, with each one's costs, and
    the settles (what a lease gives back when it ends)."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        super().__init__(clock=clock)
        self.asked = 0
        self.granted = 0
        """The decisions that admitted (refusals past the limit reach the store in any
        order: callers waiting on a slice that was refused each ask again)."""
        self.settled = 0
        self.costs: list[tuple[float, tuple[float, ...]]] = []
        """Per decision that records: the plan's ``cost`` and ``costs``."""

    async def decide(self, plan: Plan) -> Decision:
        self.asked += 1
        if plan.record:
            self.costs.append((plan.cost, plan.costs))
        decision = await super().decide(plan)
        self.granted += decision.allowed
        return decision

    async def settle(self, settlement: Settlement) -> None:
        self.settled += 1
        await super().settle(settlement)

    @property
    def calls(self) -> int:
        """Every call the store took: decisions and settles."""
        return self.asked + self.settled


Answerer = Callable[[rls_pb2.RateLimitRequest], Awaitable[rls_pb2.RateLimitResponse]]


def toml_answerer(tmp_path: Path, limiter: RateLimit, hot: int = HOT) -> Answerer:
    """``ratelimit serve``'s ``ShouldRateLimit`` in process, on ``limiter``."""
    path = tmp_path / "rules.toml"
    path.write_text(toml_rules(hot))
    handlers = Handlers(limiter, ratio_tree("100/m"), rules_file.load(path), 30.0)
    return handlers.should_rate_limit


def envoy_answerer(tmp_path: Path, limiter: RateLimit, hot: int = HOT) -> Answerer:
    """``ratelimit serve --envoy``'s ``ShouldRateLimit`` with our algorithm, on ``limiter``."""
    config = EnvoyConfig(algorithm=limiter.algorithm)
    config.load("d.yaml", root_of("d.yaml", envoy_yaml(hot), ours=True))
    answers = OurAnswers(config, limiter, EnvoyStats(), Answering())
    return answers.should_rate_limit


ANSWERERS = {"toml": toml_answerer, "envoy": envoy_answerer}


async def hammer(answer: Answerer, request: rls_pb2.RateLimitRequest, calls: int) -> list[Any]:
    """``calls`` requests from 16 callers at once; the answers, in the order they came."""
    answers: list[Any] = []
    left = iter(range(calls))

    async def caller() -> None:
        for _ in left:
            answers.append(await answer(request))

    await asyncio.gather(*(caller() for _ in range(16)))
    return answers


# --- RATELIMIT_LEASE for `ratelimit serve` ---


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0.05", 0.05), ("50ms", 0.05), ("1s", 1.0), ("60", 60.0), ("0", 0.0)],
)
def test_the_lease_is_seconds_or_a_duration(text: str, seconds: float) -> None:
    assert ServiceConfig.from_env({"RATELIMIT_LEASE": text}).lease == pytest.approx(seconds)


def test_no_lease_by_default() -> None:
    assert ServiceConfig.from_env({}).lease == 0.0
    assert ServiceConfig.from_env({"RATELIMIT_LEASE": " "}).lease == 0.0  # empty: unset


@pytest.mark.parametrize("text", ["soon", "-1", "61", "2m", "nan", "inf", "5 s"])
def test_a_bad_lease_is_named(text: str) -> None:
    message = f"RATELIMIT_LEASE='{text}': a lease is seconds from 0 to 60"
    with pytest.raises(ConfigurationError, match=message):
        ServiceConfig.from_env({"RATELIMIT_LEASE": text})


async def test_the_service_leases_with_the_lease_it_is_given() -> None:
    leased = Service(ServiceConfig(lease=0.05, metrics="none"))
    plain = Service(ServiceConfig(metrics="none"))
    try:
        backend = leased.limiter.storage
        assert isinstance(backend, LeasedBackend)
        assert backend.hold == 0.05
        assert not isinstance(plain.limiter.storage, LeasedBackend)
    finally:
        await leased.limiter.aclose()
        await plain.limiter.aclose()


def test_the_start_line_says_what_is_leased() -> None:
    line = start_line(ServiceConfig(lease=0.05), 50051, None)
    assert "leases of 0.05 s" in line
    gcra = start_line(ServiceConfig(lease=0.05, algorithm="gcra"), 50051, None)
    assert "no leases: gcra decides every request at the store" in gcra
    assert "lease" not in start_line(ServiceConfig(), 50051, None)


# --- RATELIMIT_LEASE for `ratelimit serve --envoy` ---


def test_envoy_reads_the_lease_with_our_algorithms() -> None:
    env = {"RATELIMIT_ALGORITHM": "sliding-log", "RATELIMIT_LEASE": "50ms"}
    assert EnvoySettings.from_env(env).lease == pytest.approx(0.05)
    assert EnvoySettings.from_env({}).lease == 0.0
    assert EnvoySettings.from_env({"RATELIMIT_LEASE": "0"}).lease == 0.0  # off: no algorithm needed
    assert "RATELIMIT_LEASE" in HONOURED
    assert "RATELIMIT_LEASE" in OURS
    assert "RATELIMIT_LEASE" not in IGNORED
    assert unhonoured(env) == []


def test_envoy_refuses_a_lease_on_its_own_windows() -> None:
    """Its fixed windows (no ``RATELIMIT_ALGORITHM``) count request by request: a lease set
    there would do nothing, so the service does not start."""
    with pytest.raises(
        ConfigurationError,
        match=r"RATELIMIT_LEASE='0.05': leases are for our algorithms.*set RATELIMIT_ALGORITHM",
    ):
        EnvoySettings.from_env({"RATELIMIT_LEASE": "0.05"})


def test_envoy_names_a_bad_lease() -> None:
    env = {"RATELIMIT_ALGORITHM": "sliding-log", "RATELIMIT_LEASE": "61"}
    with pytest.raises(ConfigurationError, match="RATELIMIT_LEASE='61': a lease is seconds"):
        EnvoySettings.from_env(env)


async def test_envoy_leases_beneath_with_the_lease_it_is_given() -> None:
    settings = EnvoySettings.from_env(
        {"BACKEND_TYPE": "memory", "RATELIMIT_ALGORITHM": "sliding-log", "RATELIMIT_LEASE": "1"}
    )
    answers, store = envoy_server.answers_of(settings, EnvoyStats(), None)
    try:
        assert isinstance(answers, OurAnswers)
        backend = answers.limiter.storage
        assert isinstance(backend, LeasedBackend)
        assert backend.hold == 1.0
    finally:
        await store.aclose()


def test_envoy_warns_that_gcra_leases_nothing(tmp_path: Path) -> None:
    env = {"RUNTIME_ROOT": str(tmp_path), "RUNTIME_SUBDIRECTORY": "ratelimit"}
    env |= {"BACKEND_TYPE": "memory", "RATELIMIT_ALGORITHM": "gcra", "RATELIMIT_LEASE": "0.05"}
    with EnvoyProcess(env) as service:
        output = service.output
    assert "RATELIMIT_LEASE=0.05 does nothing with RATELIMIT_ALGORITHM=gcra" in output


@pytest.mark.parametrize(
    ("arguments", "env", "message"),
    [
        ([], {"RATELIMIT_LEASE": "soon"}, "cannot start: RATELIMIT_LEASE='soon': a lease is"),
        (
            ["--envoy"],
            {"RATELIMIT_LEASE": "0.05", "BACKEND_TYPE": "memory"},
            "cannot start: RATELIMIT_LEASE='0.05': leases are for our algorithms",
        ),
    ],
)
def test_a_refused_lease_stops_the_service_at_start(
    arguments: list[str], env: dict[str, str], message: str
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RATELIMIT_")}
    finished = subprocess.run(
        [sys.executable, "-m", "ratelimit", "serve", *arguments],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert finished.returncode == 3, finished.stderr
    assert message in finished.stderr


# --- what the services decide: one plain cost leases, per-descriptor costs do not ---


@pytest.mark.parametrize("front", ANSWERERS)
@pytest.mark.parametrize(
    ("request_hits", "own_hits", "cost"),
    [(0, None, 1), (3, None, 3), (0, 2, 2), (5, 5, 5)],
    ids=["one-each", "request-hits", "descriptor-hits", "both-alike"],
)
async def test_equal_hits_are_one_plain_cost_which_leases(
    front: str,
    request_hits: int,
    own_hits: int | None,
    cost: int,
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    """Every descriptor counting the same hits (the request's ``hits_addend`` for all, or
    each its own, alike): one plan of one cost (``costs`` empty), which is leased."""
    store = Counting(clock)
    limiter = RateLimit(store, lease=0.05)
    answer = ANSWERERS[front](tmp_path, limiter, hot=WIDE)  # never near the limit
    request = asked(("user", "u", own_hits), ("tenant", "t", own_hits), hits=request_hits)
    answers = await hammer(answer, request, 40)
    await limiter.aclose()
    assert [a.overall_code for a in answers] == [OK] * 40
    assert store.costs, "nothing decided"
    assert set(store.costs) <= {(cost * 2**k, ()) for k in range(8)}  # the call, or slices
    assert store.asked <= 40 / 4, store.asked


@pytest.mark.parametrize("front", ANSWERERS)
async def test_different_hits_per_descriptor_ask_the_store_every_time(
    front: str, tmp_path: Path, clock: FakeClock
) -> None:
    """Descriptors counting different hits in one request: costs per identifier, decided
    per call (as without leases)."""
    store = Counting(clock)
    limiter = RateLimit(store, lease=0.05)
    answer = ANSWERERS[front](tmp_path, limiter, hot=WIDE)
    answers = await hammer(answer, asked(("user", "u", 1), ("tenant", "t", 2)), 40)
    await limiter.aclose()
    assert [a.overall_code for a in answers] == [OK] * 40
    assert store.asked == 40
    assert set(store.costs) == {(2, (1.0, 2.0))}


# --- a hot descriptor: far fewer store calls than requests, exactly its limit ---

BUSY = 2000
"""Requests to a descriptor far from its limit (``WIDE``)."""


@pytest.mark.parametrize("algorithm", LEASED)
@pytest.mark.parametrize("front", ANSWERERS)
async def test_a_hot_descriptor_takes_few_store_calls(
    front: str, algorithm: str, tmp_path: Path, clock: FakeClock
) -> None:
    """``BUSY`` requests from 16 callers to a descriptor far from its limit: every one OK,
    the store asked (decisions and give-backs) for one in twenty at most."""
    store = Counting(clock)
    limiter = RateLimit(store, algorithm=algorithm, lease=0.05)
    answer = ANSWERERS[front](tmp_path, limiter)
    answers = await hammer(answer, asked(("tenant", "busy", None)), BUSY)
    await limiter.aclose()
    assert [a.overall_code for a in answers] == [OK] * BUSY
    assert store.calls <= BUSY / 20, (store.asked, store.settled)


@pytest.mark.parametrize("algorithm", [*LEASED, "gcra"])
@pytest.mark.parametrize("front", ANSWERERS)
async def test_a_hot_descriptor_admits_exactly_its_limit(
    front: str, algorithm: str, tmp_path: Path, clock: FakeClock
) -> None:
    """``HOT`` + 100 requests from 16 callers: exactly ``HOT`` answered OK (near the limit
    leases shrink to one call, so fewer calls are saved there); what the store counted is
    what was admitted: with the leases given back, a limiter without leases finds the
    limit full. GCRA asks the store for every admission."""
    store = Counting(clock)
    limiter = RateLimit(store, algorithm=algorithm, lease=0.05)
    answer = ANSWERERS[front](tmp_path, limiter)
    request = asked(("user", "u", None), ("tenant", "t", None))
    answers = await hammer(answer, request, HOT + 100)
    assert sum(a.overall_code == OK for a in answers) == HOT
    if algorithm in LEASED:
        assert store.calls <= (HOT + 100) / 2, (store.asked, store.settled)
    else:
        assert store.asked >= HOT
    backend = limiter.storage
    assert isinstance(backend, LeasedBackend)
    await backend.give_back()  # what the leases hold unused, as when the service stops
    after = RateLimit(store, algorithm=algorithm)  # no leases, the same store
    again = await ANSWERERS[front](tmp_path, after)(request)
    await limiter.aclose()
    assert again.overall_code == OVER


@pytest.mark.parametrize("algorithm", LEASED)
async def test_leased_answers_report_the_limit_and_headers(
    algorithm: str, tmp_path: Path, clock: FakeClock
) -> None:
    """An OK answered from a lease says what any OK says: the descriptor's limit, what it
    has left (in one process, exactly: ``HOT - 1`` down to 0, each once) and the
    ``RateLimit`` headers."""
    store = Counting(clock)
    limiter = RateLimit(store, algorithm=algorithm, lease=0.05)
    answer = toml_answerer(tmp_path, limiter)
    answers = await hammer(answer, asked(("user", "u", None)), HOT + 10)
    await limiter.aclose()
    admitted = [a for a in answers if a.overall_code == OK]
    assert store.granted < len(admitted) / 4  # most of them from leases
    for one in admitted:
        status = one.statuses[0]
        assert (status.current_limit.requests_per_unit, status.current_limit.name) == (
            HOT,
            f"{HOT}/h",
        )
        assert status.duration_until_reset.seconds > 0
        assert headers(one)["ratelimit-policy"] == f'"{HOT}/h";q={HOT};w=3600'
    remaining = sorted(one.statuses[0].limit_remaining for one in admitted)
    assert remaining == list(range(HOT))


# --- over gRPC, in process ---


async def _call_all(
    addresses: list[str], request: rls_pb2.RateLimitRequest, calls: int, callers: int = 8
) -> list[rls_pb2.RateLimitResponse]:
    """``calls`` ``ShouldRateLimit`` of ``request`` over gRPC, from ``callers`` clients at
    once, spread over ``addresses``."""
    channels = [grpc.aio.insecure_channel(address) for address in addresses]
    stubs = [rls_pb2_grpc.RateLimitServiceStub(channel) for channel in channels]
    answers: list[rls_pb2.RateLimitResponse] = []
    left = iter(range(calls))

    async def caller(n: int) -> None:
        stub = stubs[n % len(stubs)]
        for _ in left:
            answers.append(await stub.ShouldRateLimit(request, timeout=30))

    try:
        await asyncio.gather(*(caller(n) for n in range(callers)))
    finally:
        for channel in channels:
            await channel.close()
    return answers


def counted(backend: object, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the calls (decisions and settles) the store behind ``backend`` (leases)
    takes: a list that grows by one per call."""
    assert isinstance(backend, LeasedBackend)
    store = backend.store
    assert isinstance(store, SettleStore)
    calls: list[str] = []
    decide, settle = store.decide, store.settle

    async def deciding(plan: Plan) -> Decision:
        calls.append("decide")
        return await decide(plan)

    async def settling(settlement: Settlement) -> None:
        calls.append("settle")
        await settle(settlement)

    monkeypatch.setattr(store, "decide", deciding)
    monkeypatch.setattr(store, "settle", settling)
    return calls


CALLED = 1000
"""gRPC requests to a descriptor far from its limit."""


async def _busy_then_hot(address: str, calls: list[str]) -> None:
    """``CALLED`` requests to a descriptor far from its limit: every one OK, one store call
    in ten at most; then ``HOT`` + 100 to the hot one: exactly ``HOT`` OK."""
    busy = await _call_all([address], asked(("tenant", "busy", None)), CALLED)
    assert [a.overall_code for a in busy] == [OK] * CALLED
    assert len(calls) <= CALLED / 10, len(calls)
    request = asked(("user", "u", None), ("tenant", "t", None))
    hot = await _call_all([address], request, HOT + 100)
    assert sum(a.overall_code == OK for a in hot) == HOT


async def test_the_service_over_grpc_leases_a_hot_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ratelimit serve`` configured by its environment, in process, 8 gRPC clients."""
    path = tmp_path / "rules.toml"
    path.write_text(toml_rules())
    env = {"RATELIMIT_RULES_FILE": str(path), "RATELIMIT_LEASE": "5", "RATELIMIT_PORT": "0"}
    env |= {"RATELIMIT_HOST": "127.0.0.1", "RATELIMIT_METRICS": "none"}
    service = Service(ServiceConfig.from_env(env))
    calls = counted(service.limiter.storage, monkeypatch)
    port = await service.start()
    try:
        await _busy_then_hot(f"127.0.0.1:{port}", calls)
    finally:
        await service.shutdown()


async def test_envoy_over_grpc_leases_a_hot_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ratelimit serve --envoy`` with ``RATELIMIT_ALGORITHM`` and ``RATELIMIT_LEASE``, in
    process (``BACKEND_TYPE=memory``), 8 gRPC clients."""
    folder = tmp_path / "ratelimit" / "config"
    folder.mkdir(parents=True)
    (folder / "d.yaml").write_text(envoy_yaml())
    env = {"RUNTIME_ROOT": str(tmp_path), "RUNTIME_SUBDIRECTORY": "ratelimit"}
    env |= {"BACKEND_TYPE": "memory", "USE_STATSD": "false"}
    env |= {"RATELIMIT_ALGORITHM": "sliding-log", "RATELIMIT_LEASE": "5"}
    for name in ("GRPC_", "", "DEBUG_"):
        env |= {f"{name}HOST": "127.0.0.1", f"{name}PORT": "0"}
    service = EnvoyService(EnvoySettings.from_env(env))
    assert isinstance(service.answers, OurAnswers)
    calls = counted(service.answers.limiter.storage, monkeypatch)
    await service.start()
    try:
        await _busy_then_hot(f"127.0.0.1:{service.grpc_port}", calls)
    finally:
        service.stop()
        await service.shutdown()


# --- as processes, on a real Redis ---

SCRIPTS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
"""The commands a decision or a settle is on Redis: one script each."""


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this module's alone: its command counts are these tests'."""
    with RedisServer() as server:
        yield server


@pytest.fixture
async def scripts(own_redis: RedisServer) -> AsyncIterator[Callable[[], Awaitable[int]]]:
    """How many scripts ``own_redis`` has run (each decision, each settle is one)."""
    client = aioredis.Redis.from_url(own_redis.url)

    async def ran() -> int:
        stats = await client.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in SCRIPTS)

    yield ran
    await client.aclose()


_names = itertools.count()


def fresh() -> str:
    """A namespace (or key prefix) no other test uses."""
    return f"lease-{uuid.uuid4().hex[:8]}-{next(_names)}"


def _toml_env(tmp_path: Path, url: str, namespace: str, lease: str | None) -> dict[str, str]:
    path = tmp_path / "rules.toml"
    path.write_text(toml_rules())
    env = {"RATELIMIT_RULES_FILE": str(path), "RATELIMIT_STORAGE": url}
    env |= {"RATELIMIT_NAMESPACE": namespace, "RATELIMIT_METRICS": "none"}
    if lease is not None:
        env["RATELIMIT_LEASE"] = lease
    return env


async def _busy_then_hot_on_redis(
    address: str, scripts: Callable[[], Awaitable[int]]
) -> list[rls_pb2.RateLimitResponse]:
    """``CALLED`` requests to a descriptor far from its limit: every one OK, one script in
    ten at most; then the answers of ``HOT`` + 100 to the hot one."""
    before = await scripts()
    busy = await _call_all([address], asked(("tenant", "busy", None)), CALLED)
    ran = await scripts() - before
    assert [a.overall_code for a in busy] == [OK] * CALLED
    assert ran <= CALLED / 10, ran
    return await _call_all([address], asked(("user", "u", None), ("tenant", "t", None)), HOT + 100)


@pytest.mark.redis
async def test_a_service_process_on_redis_leases_a_hot_descriptor(
    tmp_path: Path, own_redis: RedisServer, scripts: Callable[[], Awaitable[int]]
) -> None:
    """``ratelimit serve`` on Redis with ``RATELIMIT_LEASE=5``: far fewer scripts than
    requests, exactly ``HOT`` OK of ``HOT`` + 100; stopped (its leases given back), the
    store holds exactly what was admitted: a service without leases finds the limit full."""
    namespace = fresh()
    with ServiceProcess(_toml_env(tmp_path, own_redis.url, namespace, "5")) as leased:
        hot = await _busy_then_hot_on_redis(leased.address, scripts)
    assert sum(a.overall_code == OK for a in hot) == HOT
    with ServiceProcess(_toml_env(tmp_path, own_redis.url, namespace, None)) as plain:
        after = await _call_all([plain.address], asked(("user", "u", None)), 1)
    assert [a.overall_code for a in after] == [OVER]


@pytest.mark.redis
async def test_two_service_processes_never_admit_past_the_limit(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """Two leased replicas on one Redis, ``HOT`` + 100 requests spread over both: never
    more than ``HOT`` OK; once both stopped (their leases given back), a replica without
    leases admits exactly what is left, so that the limit admitted ``HOT`` in all."""
    namespace = fresh()
    request = asked(("user", "u", None))
    env = _toml_env(tmp_path, own_redis.url, namespace, "5")
    with ServiceProcess(env) as one, ServiceProcess(env) as two:
        answers = await _call_all([one.address, two.address], request, HOT + 100)
    admitted = sum(a.overall_code == OK for a in answers)
    assert admitted <= HOT
    with ServiceProcess(_toml_env(tmp_path, own_redis.url, namespace, None)) as plain:
        rest = await _call_all([plain.address], request, HOT)
    assert admitted + sum(a.overall_code == OK for a in rest) == HOT


@pytest.mark.redis
async def test_envoy_process_on_redis_leases_a_hot_descriptor(
    tmp_path: Path, own_redis: RedisServer, scripts: Callable[[], Awaitable[int]]
) -> None:
    """``ratelimit serve --envoy`` on Redis with ``RATELIMIT_ALGORITHM=sliding-log`` and
    ``RATELIMIT_LEASE=5``: far fewer scripts than requests, exactly ``HOT`` OK of
    ``HOT`` + 100."""
    folder = tmp_path / "ratelimit" / "config"
    folder.mkdir(parents=True)
    (folder / "d.yaml").write_text(envoy_yaml())
    where = urlsplit(own_redis.url)
    env = {
        "RUNTIME_ROOT": str(tmp_path),
        "RUNTIME_SUBDIRECTORY": "ratelimit",
        "REDIS_SOCKET_TYPE": "tcp",
        "REDIS_URL": f"{where.hostname}:{where.port}",
        "CACHE_KEY_PREFIX": fresh(),
        "RATELIMIT_ALGORITHM": "sliding-log",
        "RATELIMIT_LEASE": "5",
    }
    with EnvoyProcess(env) as service:
        hot = await _busy_then_hot_on_redis(f"127.0.0.1:{service.port}", scripts)
    assert sum(a.overall_code == OK for a in hot) == HOT
