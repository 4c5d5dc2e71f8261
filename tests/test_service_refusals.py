"""What a refused Envoy request counts, decided in process by the service's handlers on
every store (memory, Redis with both engines, PostgreSQL) and every algorithm it runs:

- a request refused by an ``always_count`` descriptor takes nothing from its other
  descriptors (the ``always_count`` one still counts it);
- an override (kept in the store, or the request's own ``limit``) lowered below a
  descriptor's ``hits_addend`` refuses the request (``OVER_LIMIT``, counting nothing on
  the others), and so does a rules-file limit a rule of which never admits the
  ``hits_addend`` (a request's cost is a refusal, never an error), with no ``Retry-After``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ratelimit import RateLimit
from ratelimit.service import rules_file
from ratelimit.service.handlers import Handlers, ratio_tree
from ratelimit.service.proto.envoy import rls_pb2
from tests.conftest import FakeClock, store_backend

pytestmark = pytest.mark.timeout(60)
RLS = rls_pb2.RateLimitResponse
RULES = b"""\
[[limit]]
domain = "gw"
descriptor = ["tenant"]
rule = "3/h"

[[limit]]
domain = "gw"
descriptor = ["api_key"]
rule = "1/h"
always_count = true

[[limit]]
domain = "gw"
descriptor = ["user"]
rule = "100/h"

[[limit]]
domain = "gw"
descriptor = ["trial"]
rule = "100/h"
shadow = true
"""
ALGORITHMS = ["sliding-log", "sliding-window", "fixed-window", "gcra"]
CASES = [
    *(pytest.param(("memory", a), id=f"memory-{a}") for a in ALGORITHMS),
    *(pytest.param(("redis", a), id=f"redis-{a}", marks=pytest.mark.redis) for a in ALGORITHMS),
    *(
        pytest.param(("redis-commands", a), id=f"redis-commands-{a}", marks=pytest.mark.redis)
        for a in ALGORITHMS
    ),
    *(
        pytest.param(("postgres", a), id=f"postgres-{a}", marks=pytest.mark.postgres)
        for a in ("sliding-window", "fixed-window")
    ),
]


@pytest.fixture(params=CASES)
async def handlers(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[Handlers]:
    """The service's handlers over the rules above, on one store and algorithm."""
    kind, algorithm = request.param
    backend = store_backend(request, kind, clock)
    namespace = f"refusals-{uuid.uuid4().hex[:8]}"
    rl = RateLimit(backend, namespace, algorithm=algorithm, denial_cache=0)
    rules = rules_file.parse(RULES, "rules.toml", algorithm)
    yield Handlers(rl, ratio_tree("100/m", algorithm), rules, 10.0)
    await rl.aclose()


Entry = tuple[str, str]


def ask(*descriptors: Entry, addend: int = 0, limit: tuple[int, int] | None = None) -> Any:
    """An Envoy request of domain ``gw`` of one-entry descriptors; ``limit`` (requests per
    unit, unit) the last one's own limit."""
    request = rls_pb2.RateLimitRequest(domain="gw", hits_addend=addend)
    for key, value in descriptors:
        descriptor = request.descriptors.add()
        descriptor.entries.add(key=key, value=value)
    if limit is not None:
        last = request.descriptors[-1]
        last.limit.requests_per_unit, last.limit.unit = limit
    return request


async def codes(handlers: Handlers, make: Callable[[], Any], n: int) -> list[int]:
    return [(await handlers.should_rate_limit(make())).overall_code for _ in range(n)]


async def test_a_request_refused_by_an_always_count_descriptor_takes_nothing_from_the_others(
    handlers: Handlers,
) -> None:
    tenant, key = ("tenant", "acme"), ("api_key", "k1")
    first = await handlers.should_rate_limit(ask(tenant, key))
    assert first.overall_code == RLS.OK
    for _ in range(3):  # the key's 1/h refuses: counted on the key, never on the tenant
        refused = await handlers.should_rate_limit(ask(tenant, key))
        assert refused.overall_code == RLS.OVER_LIMIT
        assert [s.code for s in refused.statuses] == [RLS.OK, RLS.OVER_LIMIT]
    # the tenant's 3/h counted only the admitted request: 2 more
    assert await codes(handlers, lambda: ask(tenant), 3) == [RLS.OK, RLS.OK, RLS.OVER_LIMIT]


async def test_an_always_count_descriptor_counts_a_request_refused_elsewhere(
    handlers: Handlers,
) -> None:
    tenant = ("tenant", "busy")
    assert await codes(handlers, lambda: ask(tenant), 3) == [RLS.OK] * 3
    refused = await handlers.should_rate_limit(ask(tenant, ("api_key", "k2")))
    assert [s.code for s in refused.statuses] == [RLS.OVER_LIMIT, RLS.OK]
    assert await codes(handlers, lambda: ask(("api_key", "k2")), 1) == [RLS.OVER_LIMIT]


async def test_an_override_lowered_below_hits_addend_refuses_and_counts_nothing(
    handlers: Handlers,
) -> None:
    await handlers.limiter.overrides.set("envoy/gw", "5/h", tenant="small")
    user = ("user", "u1")
    refused = await handlers.should_rate_limit(ask(user, ("tenant", "small"), addend=10))
    assert refused.overall_code == RLS.OVER_LIMIT
    lowered = refused.statuses[1]
    assert lowered.code == RLS.OVER_LIMIT
    assert lowered.current_limit.requests_per_unit == 5
    assert lowered.limit_remaining == 0
    assert refused.statuses[0].code == RLS.OK
    headers = {h.key: h.value for h in refused.response_headers_to_add}
    assert headers["retry-after"] == "3600"  # never admitted under 5/h: its window
    # nothing counted, on the user nor on the tenant
    admitted = await handlers.should_rate_limit(ask(user, ("tenant", "small"), addend=5))
    assert admitted.overall_code == RLS.OK
    assert [s.limit_remaining for s in admitted.statuses] == [95, 0]


async def test_a_requests_own_limit_below_hits_addend_refuses(handlers: Handlers) -> None:
    user = ("user", "u2")
    request = ask(user, ("tenant", "own"), addend=4, limit=(2, RLS.RateLimit.HOUR))
    refused = await handlers.should_rate_limit(request)
    assert refused.overall_code == RLS.OVER_LIMIT
    assert [s.code for s in refused.statuses] == [RLS.OK, RLS.OVER_LIMIT]
    assert await codes(handlers, lambda: ask(user, addend=100), 1) == [RLS.OK]  # 0 counted


async def test_a_shadow_limit_lowered_below_hits_addend_lets_the_request_through(
    handlers: Handlers,
) -> None:
    await handlers.limiter.overrides.set("envoy/gw", "2/h", trial="t1")
    user = ("user", "u4")
    answer = await handlers.should_rate_limit(ask(user, ("trial", "t1"), addend=3))
    assert answer.overall_code == RLS.OK
    assert [s.code for s in answer.statuses] == [RLS.OK, RLS.OK]
    assert answer.statuses[1].limit_remaining == 0  # reported as it would refuse
    assert [s.limit_remaining for s in answer.statuses][:1] == [97]  # the user counted 3


async def test_a_rules_file_limit_below_hits_addend_refuses_counting_nothing(
    handlers: Handlers,
) -> None:
    answer = await handlers.should_rate_limit(ask(("user", "u3"), ("tenant", "big"), addend=4))
    assert answer.overall_code == RLS.OVER_LIMIT
    assert [s.code for s in answer.statuses] == [RLS.OK, RLS.OVER_LIMIT]
    headers = {h.key: h.value for h in answer.response_headers_to_add}
    assert "retry-after" not in headers  # no wait would admit it
    assert '"3/h";r=0' in headers["ratelimit"]
    assert await codes(handlers, lambda: ask(("user", "u3"), addend=100), 1) == [RLS.OK]
