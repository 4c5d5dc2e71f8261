"""Requests and tokens per minute for a language model, per API key, as the model providers
meter them: each call reserves its ``max_tokens`` (the most it can use), and once the reply
says what it really used, the difference is given back (or, past the estimate, counted).

    python examples/llm_tokens.py                                   # memory://
    REDIS_URL=redis://localhost:6379/0 python examples/llm_tokens.py   # shared by processes
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from ratelimit import RateLimit, RateLimitExceeded

# 5 requests and 2 000 tokens a minute per key, decided together: a refused call counts on
# neither. (Calls count 1 on the first rule; the second counts the call's tokens.)
RULES = "api_key:5/m | api_key:2000 tokens/m"


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Reply:
    text: str
    usage: Usage


class FakeModel:
    """A model client that answers at once, using about a quarter of its budget."""

    async def complete(self, prompt: str, max_tokens: int) -> Reply:
        used = Usage(prompt_tokens=len(prompt.split()), completion_tokens=max_tokens // 4)
        return Reply(text=f"echo: {prompt}", usage=used)


def estimate(api_key: str, prompt: str, max_tokens: int) -> dict[str, int]:
    """What a call may use at most: reserved before it runs."""
    return {"tokens": len(prompt.split()) + max_tokens}


def used(reply: Reply) -> dict[str, int]:
    """What it did use: settled once it returned."""
    return {"tokens": reply.usage.total_tokens}


async def main() -> None:
    url = os.environ.get("REDIS_URL", "memory://")
    model = FakeModel()
    # The window counters take large counts and costs (the sliding log keeps a timestamp
    # per token); GCRA works too.
    async with RateLimit.from_url(url, "llm-example", algorithm="sliding-window") as rl:

        @rl.limit(RULES, key="complete", cost=estimate, settle=used)
        async def complete(api_key: str, prompt: str, max_tokens: int) -> Reply:
            return await model.complete(prompt, max_tokens)

        limit = rl.limit(key="complete", api_key="key-1")
        for n in range(1, 5):  # each reserves 804 tokens and uses 204
            reply = await complete("key-1", "tell me a story", max_tokens=800)
            left = (await limit.peek(cost={"tokens": 1})).states[1].remaining + 1
            print(f"call {n}: used {reply.usage.total_tokens} tokens, {left} left this minute")
        try:
            await complete("key-1", "a long essay please", max_tokens=1500)
        except RateLimitExceeded as exc:
            print(f"call 5: refused by {exc.rule}, retry in {exc.retry_after:.0f} s")

        # By hand: reserve, call, settle (for async with, or code that is not one function).
        decision = await limit.acquire(cost={"tokens": 300})
        reply = await model.complete("short", max_tokens=296)
        await limit.settle(decision, {"tokens": reply.usage.total_tokens})
        after = await limit.peek(cost={"tokens": 1})
        print(f"by hand: used {reply.usage.total_tokens}, {after.states[1].remaining + 1} left")


if __name__ == "__main__":
    asyncio.run(main())
