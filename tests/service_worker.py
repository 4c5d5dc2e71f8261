"""One client process of the service tests: ``CONCURRENCY`` RPCs at once, over its own
channel, after a shared start time; prints how many were admitted.

    python -m tests.service_worker ADDRESS API CONCURRENCY START_AT
"""

from __future__ import annotations

import asyncio
import sys
import time

import grpc

from ratelimit.service.proto import ratio_pb2, ratio_pb2_grpc
from ratelimit.service.proto.envoy import rls_pb2, rls_pb2_grpc


async def main(address: str, api: str, concurrency: int, start_at: float) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        await channel.channel_ready()
        ratio = ratio_pb2_grpc.RateLimitServiceStub(channel)
        envoy = rls_pb2_grpc.RateLimitServiceStub(channel)

        async def one() -> bool:
            if api == "ratio":
                answer = await ratio.RateLimit(
                    ratio_pb2.RateLimitRequest(owner="shared", resource="work"), timeout=20
                )
                return answer.code == ratio_pb2.RateLimitResponse.OK
            request = rls_pb2.RateLimitRequest(domain="envoy")
            request.descriptors.add().entries.add(key="remote_address", value="10.0.0.1")
            reply = await envoy.ShouldRateLimit(request, timeout=20)
            return reply.overall_code == rls_pb2.RateLimitResponse.OK

        await asyncio.sleep(max(0.0, start_at - time.time()))
        results = await asyncio.gather(*(one() for _ in range(concurrency)))
    print(sum(results), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
