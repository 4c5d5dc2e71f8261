"""``on_error="local"``'s store is one per limiter, even when threads make it at once: the
sync API decides on a caller's thread (its direct path), and several threads whose calls
failed together all reach the local store first. Two stores would each admit the share."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import ratelimit.pipeline.fallback
from ratelimit.backends.memory.backend import MemoryBackend
from ratelimit.pipeline.fallback import LocalFallback

pytestmark = pytest.mark.timeout(30)


def test_threads_reaching_the_local_store_at_once_share_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = LocalFallback(0.5)
    seen: list[MemoryBackend] = []
    made: list[MemoryBackend] = []

    def other_thread() -> None:
        seen.append(local.store)

    class Made(MemoryBackend):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            made.append(self)
            if len(made) == 1:  # while the first is being made, another thread asks
                other = threading.Thread(target=other_thread)
                other.start()
                other.join(0.5)  # with the store made once, it waits for this one
                threads.append(other)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(ratelimit.pipeline.fallback, "MemoryBackend", Made)
    first = local.store
    for thread in threads:
        thread.join()
    assert len(made) == 1
    assert seen == [first]
