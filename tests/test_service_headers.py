"""The headers Envoy passes on to its client (``response_headers_to_add``): the draft-11
``RateLimit-Policy`` and ``RateLimit`` fields and, on ``OVER_LIMIT``, ``Retry-After``. Real
``ratelimit serve`` processes and real gRPC clients; the header building in process."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from http_sfv.list import List as SFList

from ratelimit import MemoryBackend, RateLimit
from ratelimit.core.decision import Decision, RuleState, make_decision
from ratelimit.errors import ConfigurationError
from ratelimit.rules.tree import Rule
from ratelimit.service import rules_file
from ratelimit.service.config import ServiceConfig
from ratelimit.service.envoy_headers import response_headers
from ratelimit.service.handlers import Handlers, ratio_tree
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc
from tests.conftest import FailingBackend
from tests.service_process import ROOT, ServiceProcess, rules_env

pytestmark = pytest.mark.timeout(120)
RLS = rls_pb2.RateLimitResponse
OK, OVER = RLS.OK, RLS.OVER_LIMIT
HOUR = RLS.RateLimit.HOUR
RULES = """\
[[limit]]
domain = "hdr"
descriptor = ["user"]
rule = "3/h"

[[limit]]
domain = "hdr"
descriptor = ["path=/login", "user"]
rule = "2/h | 10/d"

[[limit]]
domain = "hdr"
descriptor = ["watched"]
rule = "1/d"
shadow = true

[[limit]]
domain = "hdr"
descriptor = ["tokens"]
rule = "5/h"
always_count = true
"""
_names = itertools.count()
Entries = tuple[tuple[str, str], ...]


def fresh(prefix: str) -> str:
    """A value no other test uses (the service of a module is shared)."""
    return f"{prefix}-{next(_names)}"


def request(
    *descriptors: Entries, zero: tuple[str, str] | None = None, hits: int = 0
) -> rls_pb2.RateLimitRequest:
    """A request of ``descriptors``, then (``zero``) one entry with a ``limit`` of 0/h."""
    asked = rls_pb2.RateLimitRequest(domain="hdr", hits_addend=hits)
    for entries in descriptors:
        added = asked.descriptors.add()
        for key, value in entries:
            added.entries.add(key=key, value=value)
    if zero is not None:
        added = asked.descriptors.add()
        added.entries.add(key=zero[0], value=zero[1])
        added.limit.requests_per_unit, added.limit.unit = 0, HOUR
    return asked


def headers(answer: rls_pb2.RateLimitResponse) -> dict[str, str]:
    """The answer's ``response_headers_to_add`` by name (each given once)."""
    names = [header.key for header in answer.response_headers_to_add]
    assert len(names) == len(set(names)), names
    return {header.key: header.value for header in answer.response_headers_to_add}


def items(value: str) -> list[tuple[str, dict[str, Any]]]:
    """A Structured Field List's items: (name, parameters)."""
    parsed = SFList()
    parsed.parse(value.encode("ascii"))
    return [(item.value, dict(item.params)) for item in parsed]


def limits(answer: rls_pb2.RateLimitResponse) -> list[tuple[str, dict[str, Any]]]:
    return items(headers(answer)["ratelimit"])


def policies(answer: rls_pb2.RateLimitResponse) -> list[tuple[str, dict[str, Any]]]:
    return items(headers(answer)["ratelimit-policy"])


def reset_s(status: RLS.DescriptorStatus) -> int:
    """A status's ``duration_until_reset``, in whole seconds rounded up."""
    return math.ceil(status.duration_until_reset.ToMicroseconds() / 1_000_000)


@pytest.fixture(scope="module", params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    redis = request.param == "redis"
    storage = request.getfixturevalue("redis_url") if redis else None
    env = rules_env(tmp_path_factory.mktemp("headers"), RULES, storage, fresh("headers"))
    with ServiceProcess(env) as running:
        yield running


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """The same rules with ``RATELIMIT_RESPONSE_HEADERS=off``."""
    env = rules_env(tmp_path_factory.mktemp("quiet"), RULES)
    with ServiceProcess({**env, "RATELIMIT_RESPONSE_HEADERS": "off"}) as running:
        yield running


@pytest.fixture
async def envoy(service: ServiceProcess) -> AsyncIterator[rls_pb2_grpc.RateLimitServiceAsyncStub]:
    async with grpc.aio.insecure_channel(service.address) as channel:
        yield rls_pb2_grpc.RateLimitServiceStub(channel)


async def test_the_fields_follow_the_counts(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    user = fresh("u")
    answers = [await envoy.ShouldRateLimit(request((("user", user),))) for _ in range(4)]
    assert [a.overall_code for a in answers] == [OK, OK, OK, OVER]
    for answer, remaining in zip(answers, [2, 1, 0, 0], strict=True):
        assert policies(answer) == [("3/h", {"q": 3, "w": 3600})]
        [(name, params)] = limits(answer)
        assert (name, params["r"]) == ("3/h", remaining)
        assert 3590 <= params["t"] <= 3600
        assert answer.statuses[0].limit_remaining == remaining  # as the status says
        assert user not in str(answer.response_headers_to_add)
    assert all("retry-after" not in headers(a) for a in answers[:3])
    refused = answers[3]
    retry = int(headers(refused)["retry-after"])
    assert retry == limits(refused)[0][1]["t"] == reset_s(refused.statuses[0])


async def test_several_descriptors_one_item_per_rule_in_order(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    user = fresh("u")
    asked = request(
        (("user", user),), (("path", "/login"), ("user", user)), (("path", "/unlimited"),)
    )
    answers = [await envoy.ShouldRateLimit(asked) for _ in range(3)]
    assert [a.overall_code for a in answers] == [OK, OK, OVER]
    assert policies(answers[0]) == [
        ("3/h", {"q": 3, "w": 3600}),
        ("2/h", {"q": 2, "w": 3600}),
        ("10/d", {"q": 10, "w": 86400}),
    ]
    remaining = [[params["r"] for _, params in limits(a)] for a in answers]
    # one atomic decision: the refused request counts nothing, on any descriptor
    assert remaining == [[2, 1, 9], [1, 0, 8], [1, 0, 8]]
    assert [name for name, _ in limits(answers[2])] == ["3/h", "2/h", "10/d"]
    retry = int(headers(answers[2])["retry-after"])
    assert retry == limits(answers[2])[1][1]["t"] == reset_s(answers[2].statuses[1])
    assert "retry-after" not in headers(answers[1])


async def test_a_shadow_descriptor_is_reported_and_never_brings_retry_after(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    user, watched = fresh("u"), fresh("w")
    asked = request((("watched", watched),), (("user", user),))
    answers = [await envoy.ShouldRateLimit(asked) for _ in range(4)]
    assert [a.overall_code for a in answers] == [OK, OK, OK, OVER]
    assert [s.code for s in answers[1].statuses] == [OK, OK]  # shadow: let through
    for answer in answers:
        assert [name for name, _ in policies(answer)] == ["1/d", "3/h"]  # the request's order
    shadow = [limits(a)[0][1] for a in answers]
    assert [params["r"] for params in shadow] == [0, 0, 0, 0]
    assert all(86390 <= params["t"] <= 86400 for params in shadow)
    assert all("retry-after" not in headers(a) for a in answers[:3])
    # refused by the user's limit: its wait, not the shadow limit's day
    retry = int(headers(answers[3])["retry-after"])
    assert retry == limits(answers[3])[1][1]["t"] == reset_s(answers[3].statuses[1])
    assert retry <= 3600


async def test_a_limit_of_0_is_a_policy_that_admits_nothing(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    user = fresh("u")
    alone = await envoy.ShouldRateLimit(request(zero=("closed", fresh("c"))))
    assert alone.overall_code == OVER
    assert (alone.statuses[0].code, alone.statuses[0].current_limit.name) == (OVER, "0")
    assert policies(alone) == [("0/h", {"q": 0, "w": 3600})]
    assert limits(alone) == [("0/h", {"r": 0})]  # never resets: no t
    assert headers(alone)["retry-after"] == "3600"
    both = await envoy.ShouldRateLimit(request((("user", user),), zero=("closed", "x")))
    assert both.overall_code == OVER
    assert [s.code for s in both.statuses] == [OK, OVER]
    assert [name for name, _ in policies(both)] == ["3/h", "0/h"]
    assert limits(both)[0][1]["r"] == 2  # what a request would leave: nothing counted
    after = await envoy.ShouldRateLimit(request((("user", user),)))
    assert limits(after)[0][1]["r"] == 2  # the refused request counted nothing


async def test_always_count_descriptors_are_reported_over_the_limit_too(
    envoy: rls_pb2_grpc.RateLimitServiceAsyncStub,
) -> None:
    tokens = fresh("t")
    answers = [await envoy.ShouldRateLimit(request((("tokens", tokens),), hits=3)) for _ in "ab"]
    assert [a.overall_code for a in answers] == [OK, OVER]
    assert policies(answers[0]) == [("5/h", {"q": 5, "w": 3600})]
    assert [limits(a)[0][1]["r"] for a in answers] == [2, 0]
    retry = int(headers(answers[1])["retry-after"])
    assert retry == limits(answers[1])[0][1]["t"] == reset_s(answers[1].statuses[0])


def scenario(user: str, watched: str, tokens: str) -> list[rls_pb2.RateLimitRequest]:
    """Requests of every kind, refusals included."""
    login = (("path", "/login"), ("user", user))
    every = request((("user", user),), login, (("watched", watched),), (("tokens", tokens),))
    return [
        *[every] * 3,
        request((("user", user),), zero=("closed", "x")),
        request((("tokens", tokens),), hits=4),
        request((("free", "x"),)),
    ]


def test_off_gives_no_headers_and_the_same_answers(
    service: ServiceProcess, quiet: ServiceProcess
) -> None:
    async def answers(address: str) -> list[rls_pb2.RateLimitResponse]:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            asked = scenario(fresh("u"), fresh("w"), fresh("t"))
            return [await stub.ShouldRateLimit(one, timeout=10) for one in asked]

    def decided(answer: rls_pb2.RateLimitResponse) -> list[Any]:
        return [answer.overall_code] + [
            (s.code, s.limit_remaining, s.current_limit.SerializeToString())
            for s in answer.statuses
        ]

    loud = asyncio.run(answers(service.address))
    silent = asyncio.run(answers(quiet.address))
    assert [decided(a) for a in loud] == [decided(a) for a in silent]
    assert [a.overall_code for a in loud] == [OK, OK, OVER, OVER, OVER, OK]
    assert all(not a.response_headers_to_add for a in silent)
    assert [sorted(headers(a)) for a in loud] == [
        ["ratelimit", "ratelimit-policy"],
        ["ratelimit", "ratelimit-policy"],
        ["ratelimit", "ratelimit-policy", "retry-after"],
        ["ratelimit", "ratelimit-policy", "retry-after"],
        ["ratelimit", "ratelimit-policy", "retry-after"],
        [],  # no limit applied: nothing to say
    ]


# --- the switch ---


@pytest.mark.parametrize(
    ("value", "expected"),
    [("on", True), ("OFF", False), ("true", True), ("False", False), ("1", True), ("0", False)],
)
def test_the_switch_reads_on_and_off(value: str, expected: bool) -> None:
    config = ServiceConfig.from_env({"RATELIMIT_RESPONSE_HEADERS": value})
    assert config.response_headers is expected
    assert ServiceConfig.from_env({}).response_headers is True


def test_a_bad_switch_is_named() -> None:
    with pytest.raises(ConfigurationError, match="RATELIMIT_RESPONSE_HEADERS='yes please'"):
        ServiceConfig.from_env({"RATELIMIT_RESPONSE_HEADERS": "yes please"})


def test_a_bad_switch_stops_the_service_at_start() -> None:
    env = {**os.environ, "RATELIMIT_RESPONSE_HEADERS": "maybe", "RATELIMIT_PORT": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "ratelimit", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert "RATELIMIT_RESPONSE_HEADERS='maybe'" in done.stderr
    assert "'on' or 'off'" in done.stderr
    assert "serving on" not in done.stdout


# --- in process: failures, and the header building itself ---


def handlers(rl: RateLimit) -> Handlers:
    return Handlers(rl, ratio_tree("2/m"), rules_file.parse(RULES.encode(), "rules"), 5.0)


async def test_a_degraded_answer_as_the_middleware_gives_it() -> None:
    """The store failed: no rule states, so no fields; a refusal (``deny``) still says when
    to retry, as the middleware's 503 does."""
    asked = request((("user", "u"),), (("watched", "w"),))
    denying = handlers(RateLimit(FailingBackend(), on_error="deny"))
    refused = await denying.should_rate_limit(asked)
    assert refused.overall_code == OVER
    assert int(headers(refused).pop("retry-after")) >= 1
    assert set(headers(refused)) == {"retry-after"}
    opened = handlers(RateLimit(FailingBackend(), on_error="allow"))
    admitted = await opened.should_rate_limit(asked)
    assert admitted.overall_code == OK
    assert not admitted.response_headers_to_add


async def test_one_limit_named_by_two_descriptors_never_shows_the_service_s_selectors() -> None:
    rl = RateLimit(MemoryBackend(), denial_cache=0)
    answer = await handlers(rl).should_rate_limit(
        request((("user", "ann\x1fbob"),), (("user", 'bob "b"'),))
    )
    assert policies(answer) == [("3/h", {"q": 3, "w": 3600})] * 2
    assert [params["r"] for _, params in limits(answer)] == [2, 2]
    text = str([(h.key, h.value) for h in answer.response_headers_to_add])
    assert "d_" not in text
    assert "\x1f" not in text
    assert "ann" not in text
    assert "bob" not in text


def state(
    text: str, leaf: int, remaining: int, reset_after: float, selector: str = "d_0123456789abcdef"
) -> RuleState:
    """A rule's state as the service's decisions hold it: counted under its selector."""
    rule = dataclasses.replace(Rule.parse(text), selector=selector)
    return RuleState(rule, leaf, remaining == 0, remaining, reset_after)


def refusal(retry_after: float) -> Decision:
    return make_decision(False, retry_after, None, 0, "envoy/hdr")


def test_response_headers_name_rules_as_written() -> None:
    states = [
        [state("3/h", 0, 2, 3599.2)],
        [],  # a descriptor no limit matched
        [state("1/m", 0, 0, 59.5, "d_fedcba98#1"), state("10/h", 1, 9, 3000, "d_fedcba98#1")],
    ]
    found = dict(response_headers(states, ["d"], [refusal(59.5)]))
    assert items(found["ratelimit-policy"]) == [
        ("3/h", {"q": 3, "w": 3600}),
        ("1/m", {"q": 1, "w": 60}),
        ("10/h", {"q": 10, "w": 3600}),
        ("0/d", {"q": 0, "w": 86400}),
    ]
    assert items(found["ratelimit"]) == [
        ("3/h", {"r": 2, "t": 3600}),
        ("1/m", {"r": 0, "t": 60}),
        ("10/h", {"r": 9, "t": 3000}),
        ("0/d", {"r": 0}),
    ]
    assert found["retry-after"] == "86400"  # the longest refusal: a limit of 0's window


def test_retry_after_is_the_longest_refusal_rounded_up() -> None:
    states = [[state("3/h", 0, 0, 12.2)], [state("1/m", 0, 0, 30.01, "d_b")]]
    found = response_headers(states, refusals=[refusal(12.2), refusal(30.01)])
    assert found[-1] == ("retry-after", "31")
    assert response_headers([], refusals=[refusal(0.0)]) == [("retry-after", "1")]
    assert response_headers([[], []]) == []
    admitted = response_headers(states)
    assert [name for name, _ in admitted] == ["ratelimit-policy", "ratelimit"]
