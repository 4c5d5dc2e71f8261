"""What a refused descriptor's ``duration_until_reset`` says on the rules-file service: the
time until that descriptor's rules would admit the request (Envoy turns the largest of them
into ``Retry-After``), for every algorithm and for trees whose sides wait differently."""

from __future__ import annotations

import pytest

from ratelimit import MemoryBackend, RateLimit
from ratelimit.service import rules_file
from ratelimit.service.handlers import Handlers, ratio_tree
from ratelimit.service.proto.envoy import rls_pb2
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(60)

OVER = rls_pb2.RateLimitResponse.OVER_LIMIT


def handlers(rule: str, clock: FakeClock, algorithm: str = "sliding-log") -> Handlers:
    text = f'[[limit]]\ndomain = "d"\ndescriptor = ["user"]\nrule = "{rule}"\n'
    rl = RateLimit(MemoryBackend(clock=clock), algorithm=algorithm, denial_cache=0)
    return Handlers(rl, ratio_tree("2/m"), rules_file.parse(text.encode(), "rules"), 5.0)


def asked() -> rls_pb2.RateLimitRequest:
    request = rls_pb2.RateLimitRequest(domain="d")
    entry = request.descriptors.add().entries.add()
    entry.key, entry.value = "user", "ann"
    return request


async def test_an_and_tree_waits_for_its_first_side(clock: FakeClock) -> None:
    """``2/m & 4/h``: refused while both refuse; admitted again as soon as the minute's
    side admits (58 s), not when the hour's does (an hour on)."""
    service = handlers("2/m & 4/h", clock)
    for at in (0, 1, 61, 62):
        clock.now = 1_000_000.0 + at
        assert (await service.should_rate_limit(asked())).overall_code != OVER
    clock.now = 1_000_000.0 + 63
    refused = await service.should_rate_limit(asked())
    assert refused.overall_code == OVER
    assert refused.statuses[0].duration_until_reset.ToSeconds() == 58
    clock.now += 58
    assert (await service.should_rate_limit(asked())).overall_code != OVER


@pytest.mark.parametrize("algorithm", ["sliding-log", "sliding-window", "fixed-window", "gcra"])
async def test_a_refusal_waits_until_it_would_be_admitted(clock: FakeClock, algorithm: str) -> None:
    """``4/h``, a request a minute until one is refused: refused still half a second before
    the wait it was told, admitted right after it (for the sliding log the oldest hit
    leaving, never the window emptying)."""
    service = handlers("4/h", clock, algorithm)
    clock.now = 1_000_800.0  # a whole number of hours: the fixed window starts here
    for _ in range(20):
        refused = await service.should_rate_limit(asked())
        if refused.overall_code == OVER:
            break
        clock.now += 60
    assert refused.overall_code == OVER
    wait = refused.statuses[0].duration_until_reset.ToMicroseconds() / 1_000_000
    start = clock.now
    clock.now = start + wait - 0.5
    assert (await service.should_rate_limit(asked())).overall_code == OVER
    clock.now = start + wait + 0.001
    assert (await service.should_rate_limit(asked())).overall_code != OVER


@pytest.mark.parametrize(
    ("rule", "unit"),
    [
        ("3/7d", rls_pb2.RateLimitResponse.RateLimit.WEEK),
        ("3/30d", rls_pb2.RateLimitResponse.RateLimit.MONTH),
        ("3/365d", rls_pb2.RateLimitResponse.RateLimit.YEAR),
        ("3/2d", rls_pb2.RateLimitResponse.RateLimit.UNKNOWN),
    ],
)
async def test_current_limit_names_the_protocols_longer_units(
    clock: FakeClock, rule: str, unit: int
) -> None:
    """A week, 30 days and 365 days are the protocol's ``WEEK``, ``MONTH`` and ``YEAR``;
    a span the protocol has no unit for says ``UNKNOWN``."""
    answer = await handlers(rule, clock).should_rate_limit(asked())
    assert answer.statuses[0].current_limit.unit == unit
    assert answer.statuses[0].current_limit.requests_per_unit == 3
