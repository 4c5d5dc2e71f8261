"""``ShouldRateLimit`` answered as envoyproxy/ratelimit answers it
(:mod:`ratelimit.service.envoy_service.answers`), on windows counted in this process with
an injected clock: each case is one of its service's (``test/service/ratelimit_test.go``,
``test/limiter/base_limiter_test.go``, ``test/redis/fixed_cache_impl_test.go``), the
expected answers worked out from its code."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, wrappers_pb2

from ratelimit.backends.redis.envoy.windows import Count
from ratelimit.service.envoy_config import EnvoyConfig
from ratelimit.service.envoy_config.yaml_go import root_of
from ratelimit.service.envoy_service.answers import (
    MAX_UINT32,
    Answering,
    BadUnit,
    EnvoyAnswers,
    ServiceError,
)
from ratelimit.service.envoy_service.counting import MemoryCounts, OverLimitCache
from ratelimit.service.envoy_service.stats import EnvoyStats
from ratelimit.service.proto.envoy import rls_pb2
from ratelimit.service.proto.envoy.common_pb2 import RateLimitDescriptor

pytestmark = pytest.mark.timeout(30)
RLS = rls_pb2.RateLimitResponse
OK, OVER = RLS.OK, RLS.OVER_LIMIT
DEPLOYED = Path(__file__).resolve().parent.parent
T0 = 1_700_000_000.0  # a multiple of 100 s: 1_700_000_000 % 60 == 20


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def config_of(*texts: str) -> EnvoyConfig:
    config = EnvoyConfig()
    for n, text in enumerate(texts):
        config.load(f"f{n}.yaml", root_of(f"f{n}.yaml", textwrap.dedent(text)))
    return config


CONFIG = """\
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /login
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    descriptors:
      - key: model
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: files
    value: "up*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: internal
    rate_limit: {unlimited: true, name: internal}
  - key: old
    rate_limit: {unit: minute, requests_per_unit: 1, name: old}
  - key: new
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: old}]}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {team: {a: 1}, plan: gold}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {team: {b: 2}, plan: silver}
"""


def answers_of(
    *texts: str, counts: Any = None, clock: Clock | None = None, **answering: Any
) -> EnvoyAnswers:
    clock = clock or Clock()
    return EnvoyAnswers(
        config_of(*(texts or (CONFIG,))),
        counts or MemoryCounts(clock),
        EnvoyStats(),
        Answering(**answering),
        clock=clock,
    )


def descriptor(
    *entries: tuple[str, str], hits: int | None = None, **limit: int
) -> RateLimitDescriptor:
    out = RateLimitDescriptor()
    for key, value in entries:
        out.entries.add(key=key, value=value)
    if hits is not None:
        out.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    if limit:
        out.limit.requests_per_unit = limit["requests_per_unit"]
        out.limit.unit = limit["unit"]
    return out


def request(*descriptors: RateLimitDescriptor, domain: str = "d", hits: int = 0) -> Any:
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)


async def codes(answers: EnvoyAnswers, *descriptors: RateLimitDescriptor, **kw: Any) -> Any:
    answer = await answers.should_rate_limit(request(*descriptors, **kw))
    return answer.overall_code, [s.code for s in answer.statuses]


def stat(answers: EnvoyAnswers, name: str) -> int:
    return answers.stats.counters[f"ratelimit.service.rate_limit.{name}"].value


async def test_a_fixed_window_counts_every_hit_and_says_what_is_left() -> None:
    clock = Clock()
    answers = answers_of(clock=clock)
    user = descriptor(("user", "alice"))
    seen = []
    for _ in range(5):
        answer = await answers.should_rate_limit(request(user))
        status = answer.statuses[0]
        seen.append((answer.overall_code, status.limit_remaining))
        assert status.current_limit.requests_per_unit == 3
        assert status.current_limit.unit == RLS.RateLimit.MINUTE
        assert status.duration_until_reset.seconds == 60 - 20  # the window's end
    assert seen == [(OK, 2), (OK, 1), (OK, 0), (OVER, 0), (OVER, 0)]
    # refused hits count too, and the next window starts afresh
    assert stat(answers, "d.user.total_hits") == 5
    assert stat(answers, "d.user.over_limit") == 2
    assert stat(answers, "d.user.within_limit") == 3
    clock.now += 40  # 1_700_000_060: a new minute
    assert await codes(answers, user) == (OK, [OK])
    other = descriptor(("user", "bob"))
    assert (await answers.should_rate_limit(request(other))).statuses[0].limit_remaining == 2


async def test_the_window_key_is_its_services_own() -> None:
    counts = MemoryCounts(Clock())
    answers = answers_of(counts=counts, cache_key_prefix="p:")
    await answers.should_rate_limit(request(descriptor(("user", "alice"))))
    await answers.should_rate_limit(request(descriptor(("tenant", "t1"), ("model", "m"))))
    await answers.should_rate_limit(request(descriptor(("files", "upload"))))
    await answers.should_rate_limit(request(descriptor(("files", "update"))))
    start_m = int(T0) // 60 * 60
    start_h = int(T0) // 3600 * 3600
    read = await counts.read(
        [
            Count(f"p:d_user_alice_{start_m}", 0, 0),
            Count(f"p:d_tenant_t1_model_m_{start_h}", 0, 0),
            Count(f"p:d_files_up*_{start_m}", 0, 0),  # share_threshold: one counter for all
        ]
    )
    assert read == [1, 1, 2]


async def test_hits_addend_of_the_request_and_of_each_descriptor() -> None:
    answers = answers_of()
    answer = await answers.should_rate_limit(request(descriptor(("user", "a")), hits=2))
    assert answer.statuses[0].limit_remaining == 1
    # a descriptor's own 0 only looks: nothing counted
    look = await answers.should_rate_limit(request(descriptor(("user", "a"), hits=0), hits=5))
    assert (look.overall_code, look.statuses[0].limit_remaining) == (OK, 1)
    # its own 2 over the request's 1: 4 > 3, refused, and counted
    assert await codes(answers, descriptor(("user", "a"), hits=2)) == (OVER, [OVER])
    assert stat(answers, "d.user.total_hits") == 4
    assert stat(answers, "d.user.over_limit") == 1  # 4 - 3: only the hit past the limit
    assert stat(answers, "d.user.near_limit") == 1  # 3 - max(floor(3 * 0.8), 2)


async def test_a_limit_counts_only_where_the_last_entry_reaches() -> None:
    answers = answers_of()
    nested = descriptor(("tenant", "t1"), ("model", "gpt"))
    for _ in range(5):
        assert await codes(answers, nested) == (OK, [OK])
    assert await codes(answers, nested) == (OVER, [OVER])
    # the parent alone has no limit: OK, nothing counted, no current_limit
    answer = await answers.should_rate_limit(request(descriptor(("tenant", "t1"))))
    assert answer.overall_code == OK
    assert not answer.statuses[0].HasField("current_limit")
    # an unknown value of a key without a value-specific limit: the key's limit
    assert await codes(answers, descriptor(("path", "/other"))) == (OK, [OK])


async def test_a_requests_own_limit_replaces_the_configs() -> None:
    answers = answers_of()
    own = descriptor(("user", "carol"), requests_per_unit=1, unit=RLS.RateLimit.HOUR)
    assert await codes(answers, own) == (OK, [OK])
    answer = await answers.should_rate_limit(request(own))
    assert answer.overall_code == OVER
    assert answer.statuses[0].current_limit.unit == RLS.RateLimit.HOUR
    assert stat(answers, "d.user_carol.total_hits") == 2  # its stats under its entries
    # also where the config has no limit; and a week of the protocol
    week = descriptor(("nothing", "x"), requests_per_unit=1, unit=RLS.RateLimit.WEEK)
    first = await answers.should_rate_limit(request(week))
    assert first.statuses[0].duration_until_reset.seconds == 7 * 86400 - int(T0) % (7 * 86400)
    with pytest.raises(BadUnit, match="not a unit"):
        await answers.should_rate_limit(
            request(descriptor(("user", "x"), requests_per_unit=1, unit=0))
        )


async def test_an_unknown_domain_limits_nothing_and_is_counted() -> None:
    answers = answers_of()
    answer = await answers.should_rate_limit(
        request(descriptor(("user", "a")), descriptor(("user", "b")), domain="nope")
    )
    assert answer.overall_code == OK
    assert [s.code for s in answer.statuses] == [OK, OK]
    assert answers.stats.counters["ratelimit.service.rate_limit.nope.domain_not_found"].value == 2


async def test_replaces_and_unlimited() -> None:
    answers = answers_of()
    old, new = descriptor(("old", "x")), descriptor(("new", "x"))
    # alone, "old" limits at 1 a minute; with "new" it is replaced
    assert await codes(answers, old) == (OK, [OK])
    assert await codes(answers, old) == (OVER, [OVER])
    for _ in range(3):
        assert await codes(answers, old, new) == (OK, [OK, OK])
    internal = await answers.should_rate_limit(request(descriptor(("internal", "svc"))))
    assert internal.overall_code == OK
    assert internal.statuses[0].limit_remaining == MAX_UINT32
    assert not internal.statuses[0].HasField("current_limit")


async def test_shadow_mode_of_a_descriptor_and_of_the_service() -> None:
    answers = answers_of()
    trial = descriptor(("trial", "x"))
    assert await codes(answers, trial) == (OK, [OK])
    assert await codes(answers, trial) == (OK, [OK])  # over, but in shadow mode
    assert stat(answers, "d.trial.shadow_mode") == 1
    assert stat(answers, "d.trial.over_limit") == 1
    shadowed = answers_of(shadow_mode=True)
    user = descriptor(("user", "a"))
    for _ in range(3):
        await shadowed.should_rate_limit(request(user))
    assert await codes(shadowed, user) == (OK, [OVER])  # the status says it, the answer OK
    assert shadowed.stats.global_shadow_mode.value == 1


async def test_quota_mode_refuses_only_when_every_quota_descriptor_is_over() -> None:
    answers = answers_of()
    a, b, user = (
        descriptor(("quota_a", "t")),
        descriptor(("quota_b", "t")),
        descriptor(("user", "u")),
    )
    assert await codes(answers, a, b) == (OK, [OK, OK])
    assert await codes(answers, a, b) == (OK, [OVER, OK])  # b still has quota
    assert await codes(answers, a, b) == (OVER, [OVER, OVER])
    # a normal descriptor over the limit refuses whatever the quota says
    fresh = answers_of()
    for _ in range(3):
        await fresh.should_rate_limit(request(user))
    assert await codes(fresh, descriptor(("quota_a", "z")), user) == (OVER, [OK, OVER])
    # QUOTA_MODE: every descriptor is a quota descriptor
    everyone = answers_of(quota_mode=True)
    for _ in range(3):
        await everyone.should_rate_limit(request(user))
    assert await codes(everyone, descriptor(("quota_b", "z")), user) == (OK, [OK, OVER])


async def test_headers_of_the_descriptor_nearest_its_limit() -> None:
    answers = answers_of(headers=("X-Limit", "X-Left", "X-Reset"))
    answer = await answers.should_rate_limit(
        request(descriptor(("user", "a")), descriptor(("tenant", "t"), ("model", "m")))
    )
    assert [(h.key, h.value) for h in answer.response_headers_to_add] == [
        ("X-Limit", "3"),
        ("X-Left", "2"),
        ("X-Reset", "40"),
    ]
    for _ in range(3):
        answer = await answers.should_rate_limit(
            request(descriptor(("tenant", "t"), ("model", "m")), descriptor(("internal", "x")))
        )
    assert [h.value for h in answer.response_headers_to_add] == [
        "5",
        "1",
        str(3600 - int(T0) % 3600),
    ]
    plain = await answers_of().should_rate_limit(request(descriptor(("user", "a"))))
    assert not plain.response_headers_to_add


async def test_dynamic_metadata_names_the_request_and_merges_what_passed() -> None:
    answers = answers_of(dynamic_metadata=True)
    a, b = descriptor(("quota_a", "t")), descriptor(("quota_b", "t"), hits=1)
    answer = await answers.should_rate_limit(request(a, b, hits=1))
    meta = json_format.MessageToDict(answer.dynamic_metadata)
    assert meta["domain"] == "d"
    assert meta["hitsAddend"] == 1
    assert [list(d["entries"]) for d in meta["descriptors"]] == [["quota_a=t"], ["quota_b=t"]]
    assert meta["descriptors"][1]["hitsAddend"] == 1
    # both passed: the first gives "plan", the structs merge
    assert meta["metadata"]["plan"] == "gold"
    assert dict(meta["metadata"]["team"]) == {"a": 1, "b": 2}
    again = await answers.should_rate_limit(request(a, b))  # a over now: only b's
    assert json_format.MessageToDict(again.dynamic_metadata)["metadata"]["plan"] == "silver"
    limited = descriptor(("user", "u"), requests_per_unit=7, unit=RLS.RateLimit.MINUTE)
    said = json_format.MessageToDict(
        (await answers.should_rate_limit(request(limited))).dynamic_metadata
    )
    assert said["descriptors"][0]["limit"] == "requests_per_unit:7 unit:MINUTE"


async def test_the_local_cache_refuses_known_keys_without_counting() -> None:
    counts = MemoryCounts(Clock())
    clock = Clock()
    answers = EnvoyAnswers(
        config_of(CONFIG),
        counts,
        EnvoyStats(),
        Answering(),
        OverLimitCache(1 << 20, clock),
        clock=clock,
    )
    user = descriptor(("user", "a"))
    for _ in range(4):
        await answers.should_rate_limit(request(user))
    assert await codes(answers, user) == (OVER, [OVER])
    key = f"d_user_a_{int(T0) // 60 * 60}"
    assert await counts.read([Count(key, 0, 0)]) == [4]  # the 5th was not counted
    assert stat(answers, "d.user.over_limit_with_local_cache") == 1
    assert stat(answers, "d.user.total_hits") == 5


async def test_stop_cache_key_increment_when_over_limit() -> None:
    counts = MemoryCounts(Clock())
    answers = answers_of(counts=counts, stop_increment_when_over=True)
    user, nested = descriptor(("user", "a")), descriptor(("tenant", "t"), ("model", "m"))
    for _ in range(3):
        await answers.should_rate_limit(request(user, nested))
    assert await codes(answers, user, nested) == (OVER, [OVER, OK])
    start_m, start_h = int(T0) // 60 * 60, int(T0) // 3600 * 3600
    # the key that would pass its limit counted; the other did not
    assert await counts.read(
        [Count(f"d_user_a_{start_m}", 0, 0), Count(f"d_tenant_t_model_m_{start_h}", 0, 0)]
    ) == [4, 3]


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (rls_pb2.RateLimitRequest(descriptors=[RateLimitDescriptor()]), "domain must not be empty"),
        (rls_pb2.RateLimitRequest(domain="d"), "descriptor list must not be empty"),
    ],
)
async def test_requests_its_service_refuses(req: Any, message: str) -> None:
    answers = answers_of()
    with pytest.raises(ServiceError, match=message):
        await answers.should_rate_limit(req)
    assert answers.stats.service_error.value == 1


async def test_no_configuration_loaded_is_a_service_error() -> None:
    answers = answers_of()
    answers.config = None
    with pytest.raises(ServiceError, match="no rate limit configuration loaded"):
        await answers.should_rate_limit(request(descriptor(("user", "a"))))


def test_near_limit_uses_go_float32() -> None:
    from ratelimit.service.envoy_service.answers import float32

    assert float32(0.8) != 0.8
    assert int(float32(float32(10) * float32(0.8))) == 8


async def test_the_deploy_examples_directory_answers_as_its_readme_says() -> None:
    """deploy/envoy-ratelimit: 20 a minute per address, 3 logins a minute counted in its
    place, internal addresses unlimited."""
    from ratelimit.service.envoy_config import load_directory

    folder = DEPLOYED / "deploy" / "envoy-ratelimit" / "runtime" / "ratelimit" / "config"
    clock = Clock()
    answers = EnvoyAnswers(load_directory(folder), MemoryCounts(clock), EnvoyStats(), clock=clock)

    async def edge(*descriptors: RateLimitDescriptor) -> Any:
        return (await answers.should_rate_limit(request(*descriptors, domain="edge"))).overall_code

    address = descriptor(("remote_address", "203.0.113.9"))
    login = descriptor(("path", "/login"), ("remote_address", "203.0.113.9"))
    assert [await edge(address, login) for _ in range(4)] == [OK, OK, OK, OVER]
    assert [await edge(address) for _ in range(21)] == [OK] * 20 + [OVER]  # logins not counted
    internal = descriptor(("remote_address", "10.1.2.3"))
    assert [await edge(internal) for _ in range(50)] == [OK] * 50


class SplitCounts:
    """Per-second limits on a Redis of their own (``REDIS_PERSECOND``), in memory."""

    def __init__(self, clock: Clock) -> None:
        self.main, self.second = MemoryCounts(clock), MemoryCounts(clock)

    def _of(self, counts: Any) -> list[tuple[MemoryCounts, Count]]:
        return [(self.second if c.per_second else self.main, c) for c in counts]

    async def add(self, counts: Any) -> list[int]:
        return [(await where.add([c]))[0] for where, c in self._of(counts)]

    async def read(self, counts: Any) -> list[int]:
        return [(await where.read([c]))[0] for where, c in self._of(counts)]

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def test_stop_increment_reads_per_second_keys_where_they_are() -> None:
    """``REDIS_PERSECOND``: the look before counting asks the per-second Redis for a
    per-second key; so the second request finds it near and counts only it."""
    clock = Clock()
    text = """\
domain: d
descriptors:
  - key: s
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: m
    rate_limit: {unit: minute, requests_per_unit: 100}
"""
    answers = EnvoyAnswers(
        config_of(text),
        SplitCounts(clock),
        EnvoyStats(),
        Answering(stop_increment_when_over=True),
        clock=clock,
    )
    seen = []
    for _ in range(4):
        answer = await answers.should_rate_limit(
            request(descriptor(("s", "x")), descriptor(("m", "x")))
        )
        seen.append(answer.statuses[1].limit_remaining)
    assert seen == [99, 99, 99, 99]


async def test_hits_above_a_count_read_wrap_as_gos_unsigned_numbers() -> None:
    """A key the local cache knows is over stops every increment; another key read below
    the request's hits is, to Go's unsigned arithmetic, past every threshold."""
    clock = Clock()
    text = """\
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
"""
    counts = MemoryCounts(clock)
    answers = EnvoyAnswers(
        config_of(text),
        counts,
        EnvoyStats(),
        Answering(stop_increment_when_over=True),
        OverLimitCache(1 << 20, clock),
        clock=clock,
    )
    a, b = descriptor(("a", "x")), descriptor(("b", "x"))
    await answers.should_rate_limit(request(a))
    await answers.should_rate_limit(request(a))  # over: now in the local cache
    await counts.add([Count(f"d_b_x_{int(T0) // 60 * 60}", 2, 60)])  # another process's
    await answers.should_rate_limit(request(a, b, hits=5))
    assert (stat(answers, "d.b.over_limit"), stat(answers, "d.b.near_limit")) == (5, 0)


async def test_dynamic_metadata_as_its_service_writes_the_odd_cases() -> None:
    answers = answers_of(dynamic_metadata=True)
    empty = RateLimitDescriptor()
    zero = descriptor(("user", "z"), requests_per_unit=0, unit=RLS.RateLimit.MINUTE)
    answer = await answers.should_rate_limit(request(empty, zero))
    said = json_format.MessageToDict(answer.dynamic_metadata)
    assert said["descriptors"][0]["entries"] == []
    assert said["descriptors"][1]["limit"] == "unit:MINUTE"
