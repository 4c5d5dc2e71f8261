"""The sliding log's stamps when the clock steps back (issue 36): a hit is recorded at the
newest hit's time when that is later than now, so every log stays newest first and every
engine keeps the same hits as the memory backend.

``_log.lua`` compares the newest hit with now as text when both have as many digits (the
common case: it saves C's ``strtod`` on every admission) and as numbers otherwise; the
cases below cross a power of ten both ways, so both comparisons run, each way round.
"""

from __future__ import annotations

import uuid

import pytest

from ratelimit import MemoryBackend, RateLimit
from ratelimit.backends.redis.keys import identifier_key
from ratelimit.core.plan import Identifier
from tests.conftest import FakeClock, store_backend

pytestmark = pytest.mark.timeout(60)

REDIS_KINDS = [
    "fakeredis",
    "fakeredis-commands",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-commands", marks=pytest.mark.redis),
]

# Clock positions in seconds, run in order: (start, then each move). Microseconds of 10 s
# have eight digits, of 9.9 s seven.
TRACES = {
    "back, same digits": (1_000_000.0, [0.001, -0.5, 0.0, 0.2, 0.4]),
    "back below a power of ten": (10.0, [0.000001, -0.1, 0.05, 0.1]),
    "forward across a power of ten": (9.999999, [0.000001, 0.5, -0.2]),
}


@pytest.mark.parametrize("kind", REDIS_KINDS)
@pytest.mark.parametrize("trace", list(TRACES))
async def test_a_clock_stepping_back_keeps_each_log_newest_first(
    request: pytest.FixtureRequest, kind: str, trace: str
) -> None:
    start, moves = TRACES[trace]
    memory_clock, redis_clock = FakeClock(start), FakeClock(start)
    memory, backend = MemoryBackend(clock=memory_clock), store_backend(request, kind, redis_clock)
    namespace = f"stamps-{uuid.uuid4().hex[:8]}"
    limiters = [
        RateLimit(memory, namespace, algorithm="sliding-log"),
        RateLimit(backend, namespace, algorithm="sliding-log"),
    ]
    try:
        for move in [0.0, *moves]:
            memory_clock.advance(move)
            redis_clock.advance(move)
            for cost in (1, 2):
                want, got = [
                    await rl.limit("user:20/h", key="k", user="u", cost=cost).decide()
                    for rl in limiters
                ]
                assert got == want, f"{trace}: at {redis_clock.now}"
        identifier = Identifier(namespace, "k", "user", "u")
        hits = memory.logs()[identifier]
        stored = [int(t) for t in await backend.client.lrange(identifier_key(identifier), 0, -1)]
        assert stored == list(hits)
        assert stored == sorted(stored, reverse=True)
        assert len(stored) == 3 * (1 + len(moves))  # every hit held
    finally:
        for rl in limiters:
            await rl.aclose()
