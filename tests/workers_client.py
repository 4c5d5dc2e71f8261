"""One client process of the ``--workers`` tests: ``CHANNELS`` gRPC channels of its own, each
its own TCP connection (a local subchannel pool: channels of one process to one address
otherwise share one), which the kernel spreads over the workers listening on the port.

    python -m tests.workers_client ADDRESS CHANNELS CALLS OWNER

It prints ``ready`` once every channel is connected, waits for a line on standard input,
then, with ``CALLS`` above 0, sends that many calls of ratio's API for (``OWNER``, ``work``)
at once, round robin over its channels; with ``CALLS`` 0, each channel sends one call after
another (25 calls an owner, ``OWNER-<pid>-<channel>-<n>``) until a second line comes. Either
way it prints how each call ended, as JSON: ``{"OK": 12, "OVER_LIMIT": 28}``, an answer's
code or the gRPC status of a call that got none (``"UNAVAILABLE"``, ``"DEADLINE_EXCEEDED"``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
from typing import TYPE_CHECKING

import grpc

from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc

if TYPE_CHECKING:
    Stub = ratio_pb2_grpc.RateLimitServiceAsyncStub

CALL_TIMEOUT = 30.0
"""Each call's deadline: generous, so that a call the service loses shows, rather than a
slow machine."""
LOCAL_POOL = (("grpc.use_local_subchannel_pool", 1),)
"""Channel options giving each channel its own connection."""


def code_of(answer: ratio_pb2.RateLimitResponse) -> str:
    return ratio_pb2.RateLimitResponse.Code.Name(answer.code)


async def call(stub: Stub, owner: str) -> str:
    """How one call ended: its answer's code, or the status of a call that got none."""
    request = ratio_pb2.RateLimitRequest(owner=owner, resource="work")
    try:
        return code_of(await stub.RateLimit(request, timeout=CALL_TIMEOUT))
    except grpc.aio.AioRpcError as exc:
        return str(exc.code().name)


async def burst(stubs: list[Stub], calls: int, owner: str) -> list[str]:
    return await asyncio.gather(*(call(stubs[n % len(stubs)], owner) for n in range(calls)))


async def until_stopped(stubs: list[Stub], owner: str, stop: asyncio.Event) -> list[str]:
    async def one_channel(n: int, stub: Stub) -> list[str]:
        ended: list[str] = []
        while not stop.is_set():  # 25 calls an owner: under 20/m, 20 OK and 5 OVER_LIMIT
            ended.append(await call(stub, f"{owner}-{os.getpid()}-{n}-{len(ended) // 25}"))
            if ended[-1] != "OK" and ended[-1] != "OVER_LIMIT":
                # no service: the channel fails fast while it reconnects; pace it, so that
                # it does not spin on a shared core (a client's pace, not a test's wait)
                await asyncio.sleep(0.01)
        return ended

    per_channel = await asyncio.gather(*(one_channel(n, s) for n, s in enumerate(stubs)))
    return [ended for channel in per_channel for ended in channel]


async def main(address: str, channels: int, calls: int, owner: str) -> None:
    opened = [grpc.aio.insecure_channel(address, options=LOCAL_POOL) for _ in range(channels)]
    try:
        await asyncio.wait_for(asyncio.gather(*(c.channel_ready() for c in opened)), 60)
        stubs: list[Stub] = [ratio_pb2_grpc.RateLimitServiceStub(c) for c in opened]
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        if calls > 0:
            ended = await burst(stubs, calls, owner)
        else:
            stop = asyncio.Event()
            sending = asyncio.create_task(until_stopped(stubs, owner, stop))
            await asyncio.to_thread(sys.stdin.readline)
            stop.set()
            ended = await sending
    finally:
        for channel in opened:
            await channel.close()
    print(json.dumps(collections.Counter(ended)), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
