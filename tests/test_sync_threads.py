"""Many threads on the sync API's direct Redis path (``backends/redis/script/blocking.py``):
each call counted exactly once and in order per thread, whether the threads go out alone or
share the batch script; a deadline kept by the kernel (``SO_RCVTIMEO``) still answered as a
missed deadline."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest

from ratelimit import BackendError, RateLimitExceeded
from ratelimit.backends.redis.script.blocking import SyncPipeline
from ratelimit.sync import RateLimit
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def pipeline_of(rl: RateLimit) -> SyncPipeline:
    assert rl.direct is not None
    pipeline = rl.direct._decider.backend._pipeline  # type: ignore[attr-defined]
    assert isinstance(pipeline, SyncPipeline)
    return pipeline


@pytest.mark.parametrize("mode", ["alone", "batched"])
def test_thirty_two_threads_admit_exactly_the_limit_in_order(redis_url: str, mode: str) -> None:
    namespace = f"threads-{uuid.uuid4().hex[:12]}"
    with RateLimit.from_url(redis_url, namespace, timeout=5, on_error="raise") as rl:

        @rl.limit("user:100/h")
        def work(user: str) -> None: ...

        work("warm")
        pipeline = pipeline_of(rl)
        if mode == "batched":  # every call made while another is out queues for a batch
            pipeline._max_in_flight = 1
        outcomes: list[list[bool]] = [[] for _ in range(32)]
        start = threading.Barrier(32)

        def worker(n: int) -> None:
            start.wait()
            for _ in range(10):
                try:
                    work("ann")
                    outcomes[n].append(True)
                except RateLimitExceeded:
                    outcomes[n].append(False)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(32)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(map(sum, outcomes)) == 100
        for mine in outcomes:  # counted in order: once refused, never admitted again
            assert mine == sorted(mine, reverse=True)
        assert rl.direct is not None
        key = f"{work.__module__}.{work.__qualname__}"
        assert rl.limit(key=key, user="ann").peek().remaining == 0
        assert len(pipeline._idle) <= pipeline._max_in_flight or mode == "batched"


def test_a_missed_deadline_on_the_direct_path_is_a_timeout() -> None:
    with RedisServer() as server:
        rl = RateLimit.from_url(server.url, "threads-deadline", on_error="raise", timeout=0.25)
        try:

            @rl.limit("user:5/m")
            def work(user: str) -> None: ...

            work("ann")  # the first call registers the limit, on the loop
            work("ann")  # the direct path's connection is open, its deadline the kernel's
            (connection,) = pipeline_of(rl)._idle
            sock = connection._sock
            assert sock.gettimeout() is None
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16) != bytes(16)
            server.pause()
            try:
                with pytest.raises(BackendError, match="Timeout reading from socket"):
                    work("ann")
            finally:
                server.resume()
            work("ann")  # a new connection: the one that missed its deadline was closed
        finally:
            rl.close()
