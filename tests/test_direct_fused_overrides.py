"""The fused direct path (``ratelimit/front/fused.py``) asks ``OverrideCache.quiet``
before it admits: with the event loop whose task kept the copy of the overrides stopped,
and an override another limiter wrote meanwhile, its calls come out as the direct and
general paths' (the same answers, the refresh task started again, the same ``used``)."""

from __future__ import annotations

import asyncio

import pytest

from ratelimit import MemoryBackend, RateLimit, RateLimitExceeded
from tests.test_direct_fused import decided_by


def script(mode: str, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    backend = MemoryBackend()
    rl = RateLimit(backend, "fused")
    writer = RateLimit(backend, "fused")
    limit = rl.limit("user:3/m", key="k")
    decided_by(limit, mode, monkeypatch)

    @limit
    async def work(user: str) -> int:
        return 1

    async def calls(count: int) -> list[object]:
        seen: list[object] = []
        for _ in range(count):
            try:
                seen.append(await work("ann"))
            except RateLimitExceeded as exc:
                seen.append(exc.decision.rule)
        copy = rl._decider.overrides  # its task started again in this loop:
        seen.append(copy is not None and copy._loop is asyncio.get_running_loop())
        return seen

    cache = rl._decider.overrides
    assert cache is not None
    seen = asyncio.run(calls(2))  # the copy's task ran in this loop, which has stopped
    assert cache._loop is not None
    assert not cache._loop.is_running()
    asyncio.run(writer.overrides.set("k", "user:2/m", user="ann"))
    seen += asyncio.run(calls(2))
    seen.append(cache.used)
    asyncio.run(rl.aclose())
    asyncio.run(writer.aclose())
    return seen


def test_a_stopped_refresh_loop_comes_out_as_the_general_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fused = script("fused", monkeypatch)
    assert fused == script("direct", monkeypatch) == script("general", monkeypatch)
