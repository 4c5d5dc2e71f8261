"""``peek`` decides without recording; ``reset`` forgets an identifier's hits. Every backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ratelimit import RateLimit
from tests.conftest import FakeClock, supporting


@pytest.mark.parametrize("algorithm", ["sliding-log", "sliding-window", "fixed-window"])
async def test_peek_records_nothing(
    make_backend: Callable[..., object], clock: FakeClock, namespace: str, algorithm: str
) -> None:
    rl = RateLimit(supporting(make_backend(clock), algorithm), namespace, algorithm=algorithm)
    limit = rl.limit("user:3/m", key="k", user="u")
    assert (await limit.decide()).allowed
    assert (await limit.decide()).allowed
    for _ in range(5):
        peeked = await limit.peek()
        assert peeked.allowed
        assert peeked.remaining == 0  # what the next call would leave
    assert (await limit.decide()).allowed  # the peeks took nothing
    refused = await limit.peek()
    assert not refused.allowed
    assert refused.retry_after > 0


@pytest.mark.parametrize("algorithm", ["sliding-log", "sliding-window"])
async def test_reset_forgets_one_identifier(
    make_backend: Callable[..., object], clock: FakeClock, namespace: str, algorithm: str
) -> None:
    rl = RateLimit(supporting(make_backend(clock), algorithm), namespace, algorithm=algorithm)
    vova = rl.limit("user:2/m", key="k", user="vova")
    dima = rl.limit("user:2/m", key="k", user="dima")
    for limit in (vova, dima):
        await limit.decide()
        await limit.decide()
        assert not (await limit.decide()).allowed  # refused, and in the denial cache
    await vova.reset()
    assert (await vova.decide()).allowed  # forgotten, cache included
    assert not (await dima.decide()).allowed  # untouched
