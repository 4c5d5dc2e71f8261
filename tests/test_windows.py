"""The window counters' layout (windows.py), shared by memory, the scripts and the commands."""

from __future__ import annotations

import fakeredis

from ratelimit import RateLimit
from ratelimit.backends import RedisCommandBackend, RedisScriptBackend, windows
from ratelimit.backends.redis.keys import counter_key, window_fields
from ratelimit.core.plan import Identifier
from tests.conftest import FakeClock


def test_two_slots_hold_the_current_and_the_previous_window() -> None:
    slots = windows.empty()
    assert windows.newest(slots) == -1
    assert windows.counted(slots, 7) == (0.0, 0.0)
    windows.hold(slots, 6, 2.0)
    windows.hold(slots, 7, 3.5)
    assert windows.counted(slots, 7) == (3.5, 2.0)
    assert windows.counted(slots, 8) == (0.0, 3.5)  # window 6 is two sizes old: not counted
    windows.hold(slots, 8, 1.0)  # replaces window 6 in slot 0
    assert slots == [1.0, 8, 3.5, 7]
    assert windows.newest(slots) == 8
    # Redis returns the same four as text, None for a field not held; window 0 is a window
    assert windows.counted([b"4", b"0", None, None], 0) == (4.0, 0.0)
    assert windows.newest([b"4", b"0", None, None]) == 0


async def test_scripts_and_commands_write_the_fields_keys_py_names() -> None:
    size_us = 60_000_000
    for engine in (RedisScriptBackend, RedisCommandBackend):
        client = fakeredis.FakeAsyncRedis()
        clock = FakeClock(start=size_us * 10 / 1_000_000)  # window 10: slot 0
        rl = RateLimit(engine(client, clock=clock), "ns", algorithm="sliding-window")
        limit = rl.limit("5/m", key="k")
        await limit.decide()
        clock.advance(60)  # window 11: slot 1
        await limit.decide()
        await rl.increment("c", 60)
        names: dict[str, set[str]] = {}
        for key in ("k", "c"):
            stored = await client.hgetall(counter_key(Identifier("ns", key, None, None)))
            names[key] = {n.decode() if isinstance(n, bytes) else n for n in stored}
        assert names["k"] == set(window_fields(size_us)), engine  # both slots written
        assert names["c"] == set(window_fields(size_us)[2:]), engine  # window 11: slot 1
        await rl.aclose()
        await client.aclose()
