"""The migration guide's apps (tests/migrating_*.py) on a clock the test steps, so that a
minute's and an hour's windows pass without sleeping: the time is read from the file
``RL_MIGRATING_CLOCK`` names (seconds since the epoch, written by the test). The apps'
code is left as written: the peers' storage (``limits``' memory storage) reads its time
through the module ``time``, which is replaced in that storage's module alone; ours is
given ``clock=`` when ``RateLimit.from_url`` makes it. For ``uvicorn --factory``:
``tests.migrating_clock:slowapi_before`` and ``tests.migrating_clock:slowapi_after``."""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import limits.storage.memory

from ratelimit import RateLimit
from ratelimit.sync import RateLimit as SyncRateLimit

EXPIRE_EVENTS = (limits.storage.memory.MemoryStorage, "_MemoryStorage__expire_events")
"""The memory storage's timer thread's work (a private name: checked by the tests)."""


class FileClock:
    """The time written in ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __call__(self) -> float:
        return float(self.path.read_text())


class PeerTime:
    """The module ``time`` as ``limits``' memory storage reads it, with ``clock``'s time."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    def time(self) -> float:
        return self.clock()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _expire_on_read(storage: Any) -> None:
    """What ``limits``' memory storage runs on a timer thread, left out: its request
    thread drops an expired count when it reads it all the same. The thread reads a key's
    expiry, then pops the key, unlocked: when the clock jumps an hour and a request
    re-counts that key in between, the fresh count is popped too (seen: a fourth request
    let through in a window of three)."""


def peer_on(clock: Callable[[], float], name: str) -> ModuleType:
    """The peer's app module ``name``, imported afresh, with ``limits``' memory storage
    on ``clock``, expiring counts where it reads them (:func:`_expire_on_read`)."""
    setattr(limits.storage.memory, "time", PeerTime(clock))  # noqa: B010
    setattr(EXPIRE_EVENTS[0], EXPIRE_EVENTS[1], _expire_on_read)
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def ours_on(clock: Callable[[], float], name: str) -> ModuleType:
    """Our app module ``name``, imported afresh, its limiter made on ``clock``."""
    made = {cls: cls.__dict__["from_url"] for cls in (RateLimit, SyncRateLimit)}

    def on_clock(cls: Any) -> Any:
        original = made[cls].__func__
        return classmethod(
            lambda c, url, *args, **kw: original(c, url, *args, **{"clock": clock, **kw})
        )

    try:
        for cls in made:
            setattr(cls, "from_url", on_clock(cls))  # noqa: B010
        sys.modules.pop(name, None)
        return importlib.import_module(name)
    finally:
        for cls, method in made.items():
            setattr(cls, "from_url", method)  # noqa: B010


def _clock() -> FileClock:
    return FileClock(os.environ["RL_MIGRATING_CLOCK"])


def slowapi_before() -> Any:
    return peer_on(_clock(), "tests.migrating_slowapi_before").app


def slowapi_after() -> Any:
    return ours_on(_clock(), "tests.migrating_slowapi_after").app
