"""``cost=`` and ``settle=`` are typed against the decorated function: mypy (``--strict``,
with ``warn_unused_ignores``) runs over this file in CI, so each ``type: ignore`` below
must still mark an error, and each ``assert_type`` must hold. At run time the same
limits work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_type

from ratelimit import MemoryBackend, RateLimit


def estimate(api: str, prompt: str, max_tokens: int) -> dict[str, int]:
    return {"tokens": max_tokens}


@dataclass
class Reply:
    text: str
    tokens: int


def used(reply: Reply) -> dict[str, int]:
    return {"tokens": reply.tokens}


RULES = "api:60/m | api:1000 tokens/m"


async def test_cost_and_settle_bind_the_function_s_parameters_and_result() -> None:
    rl = RateLimit(MemoryBackend())

    @rl.limit(RULES, cost=estimate, settle=used)
    async def complete(api: str, prompt: str, max_tokens: int) -> Reply:
        return Reply(prompt, max_tokens // 2)

    reply = await complete("k", "hi", max_tokens=100)
    assert_type(reply, Reply)
    assert reply == Reply("hi", 50)

    @rl.limit(RULES, key="lambdas", cost=lambda api, n: {"tokens": n}, settle=lambda r: r)
    async def counted(api: str, n: int) -> int:
        return n

    assert await counted("k", 5) == 5

    @rl.limit("10/s", key="plain")
    async def plain(name: str) -> int:
        return len(name)

    length = await plain("abc")
    assert_type(length, int)
    assert length == 3


def test_a_cost_or_a_settle_that_does_not_fit_the_function_is_a_type_error() -> None:
    rl = RateLimit(MemoryBackend())

    @rl.limit(RULES, key="a", cost=estimate)  # type: ignore[arg-type]
    async def other_parameters(api: str) -> Reply:  # estimate needs prompt and max_tokens
        return Reply("", 0)

    @rl.limit(RULES, key="b", cost={"tokens": 5}, settle=used)  # type: ignore[arg-type]
    async def other_result(api: str) -> str:  # used takes a Reply
        return ""

    @rl.limit(RULES, key="c", cost=estimate, settle=used)  # type: ignore[arg-type]
    async def int_result(api: str, prompt: str, max_tokens: int) -> int:
        return 0

    assert callable(other_parameters)
    assert callable(other_result)
    assert callable(int_result)
