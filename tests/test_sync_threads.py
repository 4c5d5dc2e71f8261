"""Many threads on the sync API's direct Redis path (``backends/redis/script/blocking.py``):
each call counted exactly once and in order per thread, whether the threads go out alone or
share the batch script; a deadline kept by the kernel (``SO_RCVTIMEO``) still answered as a
missed deadline."""

from __future__ import annotations

import socket
import threading
import uuid

import pytest
import redis

from ratelimit import BackendError, RateLimitExceeded
from ratelimit.backends.redis.script import blocking
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
            ((connection, _),) = pipeline_of(rl)._idle
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


def test_a_connection_the_server_closed_while_idle_is_opened_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restart closes the direct path's connections while they sit idle, longer than
    ``RECHECK_IDLE`` (the connections' clock says a second: a restart here may take less
    than the 10 ms one takes anywhere else): the next call connects again, and is decided."""
    now = [1000.0]
    monkeypatch.setattr(blocking, "_clock", lambda: now[0])
    with RedisServer() as server:
        rl = RateLimit.from_url(server.url, "threads-restart", on_error="raise")
        try:

            @rl.limit("user:5/m")
            def work(user: str) -> None: ...

            work("ann")  # registers the limit, on the loop
            work("ann")  # the direct path's connection is open
            ((before, _),) = pipeline_of(rl)._idle
            server.restart()  # same port, empty
            now[0] += 1.0
            work("ann")  # no BackendError: the closed connection was noticed
            ((after, _),) = pipeline_of(rl)._idle
            assert after is before
            assert after._sock is not None  # connected again
            key = f"{work.__module__}.{work.__qualname__}"
            # counted from nothing: one call, and the one a peek asks about
            assert rl.limit(key=key, user="ann").peek().remaining == 3
        finally:
            rl.close()


def test_a_connection_back_within_the_recheck_time_is_written_to_at_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection used again within ``RECHECK_IDLE`` is written to without asking the
    kernel first whether the server closed it (a system call, and a thread switch at 32
    threads); one the server did close in between fails that one call, as a call under
    way when it closed would, and the next call connects again."""
    asked: list[object] = []
    closed_by_server = blocking._closed_by_server

    def counted(connection: object) -> bool:
        asked.append(connection)
        return closed_by_server(connection)

    monkeypatch.setattr(blocking, "_closed_by_server", counted)
    monkeypatch.setattr(blocking, "RECHECK_IDLE", 3600.0)
    rl = RateLimit.from_url(redis_url, f"threads-recheck-{uuid.uuid4().hex[:8]}", on_error="raise")
    try:

        @rl.limit("user:50/m")
        def work(user: str) -> None: ...

        work("ann")  # registers the limit, on the loop
        for _ in range(10):
            work("ann")
        assert len(asked) == 1  # the new connection's first call only
        ((connection, _),) = pipeline_of(rl)._idle
        killer = redis.Redis.from_url(redis_url)
        connection.send_command("CLIENT", "ID")
        client_id = connection.read_response()
        killer.client_kill_filter(_id=client_id)
        killer.close()
        with pytest.raises(BackendError):
            work("ann")  # written at once to a connection the server had closed
        work("ann")  # a new connection
        monkeypatch.setattr(blocking, "RECHECK_IDLE", 0.0)
        work("ann")
        assert len(asked) == 2  # the first connection's first call, then every call
    finally:
        rl.close()
