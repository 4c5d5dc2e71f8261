"""A configuration of envoyproxy/ratelimit decided by our algorithms
(``RATELIMIT_ALGORITHM`` with ``serve --envoy``): its limits read as rules of ours
(``rate_limit`` lists, ``rule``), a refused request counting nothing, several windows on one
descriptor, quota descriptors under an ``&``, and the wait until a request would be admitted
in ``duration_until_reset``; everything that picks the limits still its service's."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import wrappers_pb2

from ratelimit import MemoryBackend, RateLimit
from ratelimit.service.envoy_config import ConfigFileError, EnvoyConfig, load_directory
from ratelimit.service.envoy_config.yaml_go import root_of
from ratelimit.service.envoy_service.answers import Answering
from ratelimit.service.envoy_service.our_answers import OurAnswers
from ratelimit.service.envoy_service.stats import EnvoyStats
from ratelimit.service.proto.envoy import rls_pb2
from ratelimit.service.proto.envoy.common_pb2 import RateLimitDescriptor
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(30)
RLS = rls_pb2.RateLimitResponse
OK, OVER = RLS.OK, RLS.OVER_LIMIT

CONFIG = """\
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: burst
    rate_limit:
      - {unit: second, requests_per_unit: 2, name: burst}
      - {unit: minute, requests_per_unit: 3}
  - key: written
    rule: "2/10s"
  - key: named
    rule: "1/1h"
    rate_limit: {name: named, replaces: [{name: other}]}
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 100, name: other}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: internal
    rate_limit: {unlimited: true}
  - key: tokens
    always_count: true
    rate_limit: {unit: hour, requests_per_unit: 100}
"""


def config_of(text: str = CONFIG, algorithm: str = "sliding-log") -> EnvoyConfig:
    config = EnvoyConfig(algorithm=algorithm)
    config.load("d.yaml", root_of("d.yaml", textwrap.dedent(text), ours=True))
    return config


def answers_of(clock: FakeClock, algorithm: str = "sliding-log", **answering: Any) -> OurAnswers:
    limiter = RateLimit(MemoryBackend(clock=clock), algorithm=algorithm, denial_cache=0)
    return OurAnswers(config_of(algorithm=algorithm), limiter, EnvoyStats(), Answering(**answering))


def descriptor(*entries: tuple[str, str], hits: int | None = None) -> RateLimitDescriptor:
    out = RateLimitDescriptor()
    for key, value in entries:
        out.entries.add(key=key, value=value)
    if hits is not None:
        out.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return out


async def ask(answers: OurAnswers, *descriptors: RateLimitDescriptor, hits: int = 0) -> Any:
    request = rls_pb2.RateLimitRequest(domain="d", descriptors=descriptors, hits_addend=hits)
    return await answers.should_rate_limit(request)


async def codes(answers: OurAnswers, *descriptors: RateLimitDescriptor) -> Any:
    answer = await ask(answers, *descriptors)
    return answer.overall_code, [s.code for s in answer.statuses]


def stat(answers: OurAnswers, name: str) -> int:
    return answers.stats.counters[f"ratelimit.service.rate_limit.d.{name}"].value


# --- the configuration, read as rules of ours ---


def test_limits_read_as_rules() -> None:
    config = config_of()
    rules = {
        key: None if (m := config.limit_of("d", [(key, "x")])) is None else m.limit.rules
        for key in ("user", "burst", "written", "named", "closed", "internal")
    }
    assert rules == {
        "user": "3/1m",
        "burst": "2/1s | 3/1m",
        "written": "2/10s",
        "named": "1/1h",
        "closed": "",
        "internal": "",
    }
    named = config.limit_of("d", [("named", "x")])
    assert named is not None
    assert (named.limit.name, named.limit.replaces) == ("named", ("other",))


@pytest.mark.parametrize(
    ("descriptor_text", "message"),
    [
        ('rule: "2/1s"\n    rate_limit: {unit: second, requests_per_unit: 1}', "not both"),
        ('rule: "user:2/1s"', "names a selector"),
        ('rule: "2//s"', "rule '2//s'"),
        ('rule: "2/1s burst 4"', "burst"),
        (
            "rate_limit:\n      - {unit: second, requests_per_unit: 1}\n"
            "      - {unit: hour, requests_per_unit: 9, name: late}",
            "name and replaces go on a rate_limit list's first item",
        ),
        (
            "rate_limit:\n      - {unit: second, requests_per_unit: 1}\n"
            "      - {unit: fortnight, requests_per_unit: 9}",
            "invalid rate limit unit 'fortnight' in its list",
        ),
        ('rule: "1/1s"\n    rate_limit: {unlimited: true}', "unlimited"),
    ],
)
def test_rules_a_configuration_cannot_have(
    tmp_path: Path, descriptor_text: str, message: str
) -> None:
    (tmp_path / "d.yaml").write_text(
        f"domain: d\ndescriptors:\n  - key: k\n    {descriptor_text}\n"
    )
    with pytest.raises(ConfigFileError, match=message) as raised:
        load_directory(tmp_path, algorithm="sliding-log")
    assert str(raised.value).startswith(f"{tmp_path / 'd.yaml'}: descriptor 'd.k' (line 3)")


def test_ours_is_refused_by_its_own_reading(tmp_path: Path) -> None:
    """Without our algorithms the file is read as its service reads it: ``rule`` is an
    unknown key, a list an unmarshal error."""
    (tmp_path / "d.yaml").write_text('domain: d\ndescriptors:\n  - key: k\n    rule: "1/1s"\n')
    with pytest.raises(ConfigFileError, match="unknown key 'rule'"):
        load_directory(tmp_path)
    listed = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      - {unit: second}\n"
    (tmp_path / "d.yaml").write_text(listed)
    with pytest.raises(ConfigFileError, match="cannot unmarshal !!seq into config.YamlRateLimit"):
        load_directory(tmp_path)


# --- the answers ---


async def test_a_refused_request_counts_nothing(clock: FakeClock) -> None:
    answers = answers_of(clock)
    user = descriptor(("user", "ann"))
    for at in (0.0, 10.0, 20.0):
        clock.now = 1_000_000.0 + at
        assert await codes(answers, user) == (OK, [OK])
    clock.now = 1_000_000.0 + 30
    for _ in range(5):  # refused: none of these counts
        refused = await ask(answers, user)
        assert refused.overall_code == OVER
    # the wait told is until the oldest hit leaves the sliding minute
    assert refused.statuses[0].duration_until_reset.ToSeconds() == 30
    assert refused.statuses[0].current_limit.requests_per_unit == 3
    assert refused.statuses[0].current_limit.unit == RLS.RateLimit.MINUTE
    clock.now = 1_000_000.0 + 60.001
    assert await codes(answers, user) == (OK, [OK])  # admitted at once: nothing was counted
    assert stat(answers, "user.total_hits") == 9
    assert stat(answers, "user.over_limit") == 5
    assert stat(answers, "user.within_limit") == 4


async def test_several_windows_on_one_descriptor(clock: FakeClock) -> None:
    answers = answers_of(clock)
    burst = descriptor(("burst", "b"))
    clock.now = 2_000_000.0
    assert [(await ask(answers, burst)).overall_code for _ in range(3)] == [OK, OK, OVER]
    clock.now += 1.5  # the second's window has room; the minute's has one
    assert [(await ask(answers, burst)).overall_code for _ in range(2)] == [OK, OVER]
    refused = await ask(answers, burst)
    assert refused.statuses[0].current_limit.name == "burst"
    assert refused.statuses[0].current_limit.unit == RLS.RateLimit.MINUTE


async def test_a_written_rule_of_any_window(clock: FakeClock) -> None:
    answers = answers_of(clock)
    written = descriptor(("written", "w"))
    clock.now = 3_000_000.0
    assert [(await ask(answers, written)).overall_code for _ in range(3)] == [OK, OK, OVER]
    refused = await ask(answers, written)
    assert refused.statuses[0].current_limit.unit == RLS.RateLimit.UNKNOWN  # 10 s: no unit
    assert refused.statuses[0].duration_until_reset.ToSeconds() == 10
    clock.now += 10.001
    assert (await ask(answers, written)).overall_code == OK


async def test_quota_descriptors_refuse_together_and_count_only_when_admitted(
    clock: FakeClock,
) -> None:
    answers = answers_of(clock)
    a, b = descriptor(("quota_a", "t")), descriptor(("quota_b", "t"))
    clock.now = 4_000_000.0
    assert await codes(answers, a, b) == (OK, [OK, OK])
    assert await codes(answers, a, b) == (OK, [OVER, OK])  # b has room: admitted
    assert await codes(answers, a, b) == (OVER, [OVER, OVER])
    # a normal descriptor over refuses, and the quota ones count nothing then
    fresh = answers_of(clock)
    user = descriptor(("user", "u"))
    for _ in range(3):
        await ask(fresh, user)
    assert await codes(fresh, descriptor(("quota_a", "z")), user) == (OVER, [OK, OVER])
    assert await codes(fresh, descriptor(("quota_a", "z"))) == (OK, [OK])  # still unspent


async def test_hits_of_each_descriptor_and_a_look_that_counts_nothing(clock: FakeClock) -> None:
    answers = answers_of(clock)
    clock.now = 5_000_000.0
    user = descriptor(("user", "h"))
    assert (await ask(answers, user, hits=2)).statuses[0].limit_remaining == 1
    look = await ask(answers, descriptor(("user", "h"), hits=0))
    assert (look.overall_code, look.statuses[0].limit_remaining) == (OK, 0)  # asked: one left
    assert (await ask(answers, descriptor(("user", "h"), hits=2))).overall_code == OVER
    assert (await ask(answers, user)).overall_code == OK  # the refused 2 were not counted
    spent = await ask(answers, descriptor(("user", "h"), hits=0))
    assert spent.overall_code == OVER  # one more would not be admitted


async def test_replaces_unlimited_shadow_and_a_closed_limit(clock: FakeClock) -> None:
    answers = answers_of(clock)
    clock.now = 6_000_000.0
    named, other = descriptor(("named", "n")), descriptor(("other", "n"))
    assert await codes(answers, named, other) == (OK, [OK, OK])  # "other" replaced
    assert await codes(answers, named, other) == (OVER, [OVER, OK])
    internal = await ask(answers, descriptor(("internal", "i")))
    assert internal.statuses[0].limit_remaining == 4_294_967_295
    trial = descriptor(("trial", "t"))
    assert [(await codes(answers, trial))[0] for _ in range(3)] == [OK, OK, OK]
    assert stat(answers, "trial.shadow_mode") == 2
    closed = await ask(answers, descriptor(("closed", "c")))
    assert closed.overall_code == OVER
    assert closed.statuses[0].current_limit.requests_per_unit == 0
    # refused by the closed limit: the others count nothing
    user = descriptor(("user", "c"))
    for _ in range(2):
        assert await codes(answers, descriptor(("closed", "c")), user) == (OVER, [OVER, OK])
    assert (await ask(answers, user)).statuses[0].limit_remaining == 2


async def test_a_requests_own_limit_and_gcra(clock: FakeClock) -> None:
    answers = answers_of(clock, algorithm="gcra")
    clock.now = 7_000_000.0
    own = descriptor(("user", "o"))
    own.limit.requests_per_unit, own.limit.unit = 2, RLS.RateLimit.HOUR
    assert [(await ask(answers, own)).overall_code for _ in range(3)] == [OK, OK, OVER]


async def test_global_shadow_mode_lets_everything_through(clock: FakeClock) -> None:
    answers = answers_of(clock, shadow_mode=True)
    clock.now = 8_000_000.0
    user = descriptor(("user", "s"))
    assert [(await ask(answers, user)).overall_code for _ in range(5)] == [OK] * 5


async def test_always_count_never_loses_a_usage_report(clock: FakeClock) -> None:
    """``always_count`` (ours): tokens reported after the fact are counted even when the
    report is over the limit, or above what the limit admits at once; the next request is
    refused."""
    answers = answers_of(clock)
    clock.now = 9_000_000.0
    tokens = descriptor(("tokens", "tenant"))
    first = await ask(answers, tokens, hits=60)
    assert (first.overall_code, first.statuses[0].limit_remaining) == (OK, 40)
    assert (await ask(answers, tokens, hits=60)).overall_code == OVER  # counted: 120
    look = await ask(answers, descriptor(("tokens", "tenant"), hits=0))
    assert look.overall_code == OVER
    other = descriptor(("tokens", "other"))
    assert (await ask(answers, other, hits=150)).overall_code == OVER  # above 100 at once
    assert (await ask(answers, other)).overall_code == OVER  # and counted
    assert stat(answers, "tokens.total_hits") == 60 + 60 + 150 + 1


def test_always_count_is_ours_only(tmp_path: Path) -> None:
    text = "domain: d\ndescriptors:\n  - key: k\n    always_count: true\n"
    (tmp_path / "d.yaml").write_text(text + "    rate_limit: {unit: hour, requests_per_unit: 1}\n")
    with pytest.raises(ConfigFileError, match="unknown key 'always_count'"):
        load_directory(tmp_path)
    assert load_directory(tmp_path, algorithm="sliding-log").limit_of("d", [("k", "x")])


async def test_values_that_join_alike_count_apart(clock: FakeClock) -> None:
    """A value holding ``_`` cannot make another descriptor's counter its own (one
    client spending another's limit): each entry is its own field of the counter's value."""
    limiter = RateLimit(MemoryBackend(clock=clock), algorithm="sliding-log", denial_cache=0)
    text = """\
domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: model
        rate_limit: {unit: hour, requests_per_unit: 1}
"""
    answers = OurAnswers(config_of(text), limiter, EnvoyStats(), Answering())
    clock.now = 10_000_000.0
    victim = descriptor(("tenant", "a_model_b"), ("model", "c"))
    crafted = descriptor(("tenant", "a"), ("model", "b_model_c"))
    assert (await ask(answers, crafted)).overall_code == OK
    assert (await ask(answers, victim)).overall_code == OK
