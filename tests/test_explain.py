"""What a rule tree means in words (:mod:`ratelimit.cli.explain`), as ``ratelimit check``
prints it: ``&`` is "only when both", which users of ``limits`` read the other way."""

from __future__ import annotations

import pytest

from ratelimit import And, Or, RateLimit, Rule
from ratelimit.cli.explain import describe, span
from ratelimit.rules.tree import to_tree


@pytest.mark.parametrize(
    ("rules", "words"),
    [
        ("5/m", "refused when: more than 5 calls per minute for the whole key"),
        ("user:1/m", "refused when: more than 1 call per minute for one user"),
        ("username:10/5m", "refused when: more than 10 calls per 5 minutes for one username"),
        ("10/1500ms", "refused when: more than 10 calls per 1500 ms for the whole key"),
        ("2400/day", "refused when: more than 2400 calls per day for the whole key"),
        (
            "apikey:100/h & (10/s | 15/m)",
            "refused only when both: more than 100 calls per hour for one apikey, and "
            "(more than 10 per second or more than 15 per minute, every call of the key)",
        ),
        (
            "user:5/m & 100/h",
            "refused only when both: more than 5 calls per minute for one user, and "
            "more than 100 calls per hour for the whole key",
        ),
        (
            "10/s | 15/m",
            "refused when either: more than 10 calls per second for the whole key, or "
            "more than 15 calls per minute for the whole key",
        ),
        (
            "10/second;15/minute",  # limits' own spelling: every listed limit applies
            "refused when either: more than 10 calls per second for the whole key, or "
            "more than 15 calls per minute for the whole key",
        ),
        (
            "1/s & 2/m & 3/h",
            "refused only when all of: more than 1 call per second for the whole key, "
            "more than 2 calls per minute for the whole key, and more than 3 calls per hour "
            "for the whole key",
        ),
        (
            "a:1/s | b:2/s | 3/s",
            "refused when any of: more than 1 call per second for one a, more than 2 calls "
            "per second for one b, or more than 3 calls per second for the whole key",
        ),
        (
            "user:10/s | (user:100/h & user:1000/d)",
            "refused when either: more than 10 calls per second for one user, or "
            "(more than 100 per hour and more than 1000 per day, every call of one user)",
        ),
        (
            "(ip:1/s | 5/s) & ip:100/h",
            "refused only when both: (more than 1 call per second for one ip or more than "
            "5 calls per second for the whole key), and more than 100 calls per hour for "
            "one ip",
        ),
        (
            "1/s & (2/m | (3/h & 4/d))",
            "refused only when both: more than 1 call per second for the whole key, and "
            "(more than 2 per minute or (more than 3 per hour and more than 4 per day), "
            "every call of the key)",
        ),
        (
            "10/s burst 20",
            "refused when: more than 10 calls per second (sustained; up to 20 at once) for the "
            "whole key",
        ),
        (
            "ip:10/s burst 20 | (1/s burst 5 & 10/m)",
            "refused when either: more than 10 calls per second (sustained; up to 20 at once) "
            "for one ip, or (more than 1 per second (sustained; up to 5 at once) and more than "
            "10 per minute, every call of the key)",
        ),
        (
            "apikey:90000 tokens/m | apikey:100/m",
            "refused when either: more than 90000 tokens per minute for one apikey, or "
            "more than 100 calls per minute for one apikey",
        ),
        (
            "apikey:1000 tokens/s & apikey:90000 tokens/m",
            "refused only when both: more than 1000 tokens per second for one apikey, and "
            "more than 90000 tokens per minute for one apikey",
        ),
        (
            "5/m & (1000 tokens/m | 10/s)",  # a group counting tokens and calls says each
            "refused only when both: more than 5 calls per minute for the whole key, and "
            "(more than 1000 tokens per minute for the whole key or more than 10 calls per "
            "second for the whole key)",
        ),
    ],
)
def test_a_tree_in_words(rules: str, words: str) -> None:
    assert describe(to_tree(rules)) == words


def test_trees_built_in_python_read_as_their_text() -> None:
    assert describe(And("apikey:100/h", Or("10/s", "15/m"))) == describe(
        to_tree("apikey:100/h & (10/s | 15/m)")
    )
    assert describe(Or(And("3/s"))) == describe(Rule(3, 1000))  # a group of one is its child
    assert describe(to_tree(["5/s", "user:1/m"])) == (
        "refused when either: more than 5 calls per second for the whole key, or more than "
        "1 call per minute for one user"
    )


def test_what_rules_without_a_selector_count_per_can_be_named() -> None:
    # the service's rules file counts a limit per descriptor
    words = describe(to_tree("100/m | 1000/h"), per="descriptor [remote_address]")
    assert words == (
        "refused when either: more than 100 calls per minute for one descriptor "
        "[remote_address], or more than 1000 calls per hour for one descriptor "
        "[remote_address]"
    )
    assert describe(to_tree("1/s & (2/m | 3/h)"), per="descriptor [ip]").endswith(
        "(more than 2 per minute or more than 3 per hour, every call of one descriptor [ip])"
    )


@pytest.mark.parametrize(
    ("ms", "words"),
    [(1, "1 ms"), (1000, "second"), (90_000, "90 seconds"), (300_000, "5 minutes"),
     (7_200_000, "2 hours"), (86_400_000, "day"), (1500, "1500 ms")],
)  # fmt: skip
def test_spans_in_words(ms: int, words: str) -> None:
    assert span(ms) == words


async def test_the_words_say_what_the_limiter_does() -> None:
    """ "only when both" is what ``&`` does: a call over one side of ``1/m & 2/m`` is
    admitted, one over both is refused; ``|`` refuses over either."""
    async with RateLimit.from_url("memory://") as rl:
        both = rl.limit("1/m & 2/m", key="both")
        assert describe(to_tree("1/m & 2/m")).startswith("refused only when both:")
        assert [(await both.decide()).allowed for _ in range(3)] == [True, True, False]
        either = rl.limit("1/m | 2/m", key="either")
        assert describe(to_tree("1/m | 2/m")).startswith("refused when either:")
        assert [(await either.decide()).allowed for _ in range(2)] == [True, False]
