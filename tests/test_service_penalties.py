"""Penalties in the service: a rules-file limit's ``penalty`` holds a descriptor back;
Envoy's answer is ``OVER_LIMIT`` with the hold's time in ``Retry-After``. In process (the
handlers the server runs) on memory:// with a fake clock, and checked when read."""

from __future__ import annotations

import pytest

from ratelimit import ConfigurationError, MemoryBackend, RateLimit
from ratelimit.service import rules_file
from ratelimit.service.handlers import ratio_tree
from ratelimit.service.penalties import PenalizingHandlers
from ratelimit.service.proto.envoy import rls_pb2
from tests.conftest import FailingBackend, FakeClock

RLS = rls_pb2.RateLimitResponse
OK, OVER = RLS.OK, RLS.OVER_LIMIT

RULES = """\
[[limit]]
domain = "edge"
descriptor = ["remote_address"]
rule = "1/m"
penalty = "3 refusals/10m for 1h"

[[limit]]
domain = "edge"
descriptor = ["user"]
rule = "1/m"
"""


def request(*entries: tuple[str, str]) -> rls_pb2.RateLimitRequest:
    asked = rls_pb2.RateLimitRequest(domain="edge")
    for key, value in entries:
        asked.descriptors.add().entries.add(key=key, value=value)
    return asked


def handlers(rl: RateLimit) -> PenalizingHandlers:
    return PenalizingHandlers(rl, ratio_tree("2/m"), rules_file.parse(RULES.encode(), "r"), 5.0)


def retry_after(answer: RLS) -> str | None:
    found = [h.value for h in answer.response_headers_to_add if h.key == "retry-after"]
    return found[0] if found else None


async def test_a_descriptor_refused_too_often_is_held_back(clock: FakeClock) -> None:
    rl = RateLimit(MemoryBackend(clock=clock))
    service = handlers(rl)
    bad = request(("remote_address", "192.0.2.7"))
    codes = [(await service.should_rate_limit(bad)).overall_code for _ in range(4)]
    assert codes == [OK, OVER, OVER, OVER]  # the third refusal starts the hold
    clock.advance(120)  # the rule would admit now
    held = await service.should_rate_limit(bad)
    assert held.overall_code == OVER
    assert retry_after(held) == str(3600 - 120)
    assert (
        await service.should_rate_limit(request(("remote_address", "192.0.2.8")))
    ).overall_code == OK
    holds = await rl.penalties.list()
    assert [(h.key, h.value) for h in holds] == [("envoy/edge", "remote_address=192.0.2.7")]
    await rl.penalties.lift("envoy/edge")
    assert (await service.should_rate_limit(bad)).overall_code == OK
    unpenalized = request(("user", "u"))
    codes = [(await service.should_rate_limit(unpenalized)).overall_code for _ in range(6)]
    assert codes == [OK, *[OVER] * 5]
    assert await rl.penalties.list() == []  # a limit without a penalty holds nothing back


def test_checked_when_read() -> None:
    bad = RULES.replace('"3 refusals/10m for 1h"', '"ip: 3 refusals/10m for 1h"')
    with pytest.raises(ConfigurationError, match="names a selector"):
        rules_file.parse(bad.encode(), "r")
    bad = RULES.replace('"3 refusals/10m for 1h"', '"3 refusals/10m"')
    with pytest.raises(ConfigurationError, match="column"):
        rules_file.parse(bad.encode(), "r")
    with pytest.raises(ConfigurationError, match="no penalty"):
        rules_file.parse(
            RULES.replace('rule = "1/m"\n', 'rule = "1/m"\nalways_count = true\n', 1).encode(), "r"
        )
    with pytest.raises(ConfigurationError, match="keeps no penalties"):
        handlers(RateLimit(FailingBackend()))
