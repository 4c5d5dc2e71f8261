"""The rule language: what parses, to what, and the errors for what does not."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit import And, Or, Rule, RuleSyntaxError
from ratelimit.rules.grammar import parse_rule, parse_tree
from ratelimit.rules.tree import Node, to_tree
from tests.strategies import trees

MINUTE = 60_000
HOUR = 3_600_000
DAY = 86_400_000


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("10/s", Rule(10, 1000)),
        ("10/5m", Rule(10, 5 * MINUTE)),
        ("username:10/5m", Rule(10, 5 * MINUTE, "username")),
        ("apikey:100/h", Rule(100, HOUR, "apikey")),
        ("5/d", Rule(5, DAY)),
        ("10/500ms", Rule(10, 500)),
        ("3/2h", Rule(3, 2 * HOUR)),
        # the seeds' other spellings
        ("100r/s", Rule(100, 1000)),
        ("2r/m", Rule(2, MINUTE)),
        ("2400/day", Rule(2400, DAY)),
        ("7/days", Rule(7, DAY)),
        ("1/second", Rule(1, 1000)),
        ("30/minutes", Rule(30, MINUTE)),
        ("4/hour", Rule(4, HOUR)),
        ("4/HOUR", Rule(4, HOUR)),
        ("4/Day", Rule(4, DAY)),
        ("ip:5/10s", Rule(5, 10_000, "ip")),
        (" user : 5 / 10 s ", Rule(5, 10_000, "user")),
    ],
)
def test_rules_parse(text: str, rule: Rule) -> None:
    assert parse_rule(text) == rule
    assert parse_tree(text) == rule


def test_a_day_is_24_hours_not_60() -> None:
    # ratio (seed 003) had PerDay = 60 h.
    assert parse_rule("1/d").span == 86_400.0


def test_infix_trees_and_precedence() -> None:
    a, b, c = Rule(100, HOUR, "apikey"), Rule(10, 1000), Rule(15, MINUTE)
    assert parse_tree("apikey:100/h & (10/s | 15/m)") == And(a, Or(b, c))
    # & binds tighter than |
    assert parse_tree("apikey:100/h & 10/s | 15/m") == Or(And(a, b), c)
    assert parse_tree("15/m | apikey:100/h & 10/s") == Or(c, And(a, b))
    assert parse_tree("(apikey:100/h)") == a
    # grouping of the same operator is kept, so str() round-trips exactly
    assert parse_tree("(10/s & 15/m) & apikey:100/h") == And(And(b, c), a)
    assert parse_tree("10/s & 15/m & apikey:100/h") == And(b, c, a)


def test_and_or_accept_text_and_nested_text() -> None:
    tree = And("apikey:100/h", Or("10/s", And("15/m", "apikey:5/s")))
    assert tree == parse_tree("apikey:100/h & (10/s | (15/m & apikey:5/s))")
    assert And("10/s | 15/m") == And(Or(Rule(10, 1000), Rule(15, MINUTE)))


def test_list_means_or() -> None:
    assert to_tree(["10/s", "15/m"]) == Or("10/s", "15/m")
    assert to_tree(("10/s",)) == Rule(10, 1000)


@pytest.mark.parametrize(
    ("text", "column", "fragment"),
    [
        ("", 1, "empty rule"),
        ("   ", 1, "empty rule"),
        ("10", 3, "expected '/'"),
        ("10/", 4, "expected unit"),
        ("10/x", 4, "expected unit (ms, s, m, h, d"),
        ("10/sx", 4, "expected unit"),
        ("10/w", 4, "expected unit"),
        ("5/M", 3, "expected unit"),
        ("0/s", 1, "count must be an integer from 1"),
        ("-1/s", 1, "expected rule"),
        ("1.5/s", 2, "expected '/'"),
        ("10/0s", 4, "span must be from 1 ms to 3650 days, not 0s"),
        ("10/3651d", 4, "span must be from 1 ms to 3650 days"),
        ("1000000001/s", 1, "count must be an integer from 1 to 1000000000"),
        ("user:/s", 6, "expected count"),
        ("apikey:5/s:0.1", 11, "third field"),
        ("vova:15/s:-1.0", 10, "third field"),
        ("10/s |", 7, "expected rule"),
        ("10/s & ", 8, "expected rule"),
        ("(10/s", 6, "expected ')'"),
        ("10/s)", 5, "expected end of rules"),
        ("10/s 5/m", 6, "expected end of rules"),
        ("a & b", 1, "expected rule"),
        ("10/s & (5/m | x)", 15, "expected rule"),
        ("user-name:5/s", 1, "expected rule"),
    ],
)
def test_syntax_errors_name_the_column_and_what_was_expected(
    text: str, column: int, fragment: str
) -> None:
    with pytest.raises(RuleSyntaxError) as caught:
        parse_tree(text)
    assert caught.value.column == column
    assert fragment in str(caught.value)
    assert f"at column {column}" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_parse_rule_takes_exactly_one_rule() -> None:
    with pytest.raises(RuleSyntaxError, match="expected end of rule at column 5"):
        parse_rule("5/m & 3/s")


def test_deep_nesting_and_huge_text_are_refused_cleanly() -> None:
    with pytest.raises(RuleSyntaxError, match="parentheses"):
        parse_tree("(" * 40 + "1/s" + ")" * 40)
    with pytest.raises(RuleSyntaxError, match="longer than"):
        parse_tree("1/s | " * 1000 + "1/s")


def test_non_text_rules_are_a_type_error() -> None:
    with pytest.raises(TypeError, match="rules must be text"):
        to_tree(10)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rules must be text"):
        parse_tree(b"10/s")


def test_empty_combinators_are_refused() -> None:
    with pytest.raises(RuleSyntaxError, match=r"And\(\) needs at least one rule"):
        And()
    with pytest.raises(RuleSyntaxError, match=r"Or\(\) needs at least one rule"):
        Or()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((0, 1000), "count must be"),
        ((True, 1000), "count must be"),
        ((5, 0), "span must be"),
        ((5, 1.5), "span must be"),
        ((5, 1000, "user name"), "selector must be an identifier"),
        ((5, 1000, ""), "selector must be an identifier"),
        ((5, 1000, "user#"), "selector must be an identifier"),
        ((5, 1000, "user#0"), "selector must be an identifier"),
        ((5, 1000, "#1"), "selector must be an identifier"),
        ((5, 1000, "user#1#2"), "selector must be an identifier"),
    ],
)
def test_rule_objects_validate(args: tuple[object, ...], fragment: str) -> None:
    with pytest.raises(RuleSyntaxError, match=fragment):
        Rule(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rule", "text"),
    [
        (Rule(10, 1000), "10/s"),
        (Rule(10, 300_000, "username"), "username:10/5m"),
        (Rule(2400, DAY), "2400/d"),
        (Rule(3, 90_000), "3/90s"),
        (Rule(3, 1500), "3/1500ms"),
        (Rule(1, 7 * DAY), "1/7d"),
    ],
)
def test_str_is_canonical_text(rule: Rule, text: str) -> None:
    assert str(rule) == text


@settings(deadline=None)  # a loaded CI machine must not fail a pure parse
@given(st.text(max_size=60))
def test_arbitrary_text_raises_nothing_but_rule_syntax_error(text: str) -> None:
    with contextlib.suppress(RuleSyntaxError):
        parse_tree(text)


_ALPHABET = st.sampled_from("0123456789/:&|() smhdrauserip_.-")


@settings(deadline=None)  # a loaded CI machine must not fail a pure parse
@given(st.text(_ALPHABET, max_size=40))
def test_rule_like_text_raises_nothing_but_rule_syntax_error(text: str) -> None:
    with contextlib.suppress(RuleSyntaxError):
        parse_tree(text)


_rules = st.builds(
    Rule,
    st.integers(1, 10**6),
    st.sampled_from([1, 250, 1000, 60_000, 300_000, HOUR, DAY, 7 * DAY]),
    st.none() | st.sampled_from(["user", "apikey", "ip", "a_1"]),
)
_trees = trees(_rules, max_leaves=8)


@settings(deadline=None)  # a loaded CI machine must not fail a pure parse
@given(_trees)
def test_str_of_a_tree_parses_back_to_an_equal_tree(tree: Node) -> None:
    assert parse_tree(str(tree)) == tree


@pytest.mark.parametrize(
    ("text", "same_as"),
    [
        ("10 per second", "10/s"),
        ("10/second", "10/s"),
        ("10/sec", "10/s"),
        ("10/secs", "10/s"),
        ("1 / Second", "1/s"),
        ("10 PER Minute", "10/m"),
        ("10/min", "10/m"),
        ("10/mins", "10/m"),
        ("10 per 2 minutes", "10/2m"),
        ("100/day", "100/d"),
        ("500/7days", "500/7d"),
        ("20/hr", "20/h"),
        ("100/hour;10/second", "100/h | 10/s"),
        ("100/hour; 10/second", "100/h | 10/s"),
        ("10/hour;100/day;2000 per 365 days", "10/h | 100/d | 2000/365d"),
        ("1 per second, 5 per minute", "1/s | 5/m"),
        ("user:10 per minute", "user:10/m"),
        ("apikey:100/h & 10/s; 1000/d", "(apikey:100/h & 10/s) | 1000/d"),
    ],
)
def test_rules_as_limits_and_slowapi_write_them(text: str, same_as: str) -> None:
    """``limits`` / slowapi / flask-limiter strings port unchanged: ``per``, word units and
    their short forms, and ``;`` or ``,`` between limits that all apply (our ``|``)."""
    assert to_tree(text) == to_tree(same_as)
    assert to_tree(str(to_tree(text))) == to_tree(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10/month", "month and year have no fixed length"),
        ("10 per 2 years", "month and year have no fixed length"),
        ("10/s;", "expected rule"),
        (";10/s", "expected"),
        ("10 per", "expected unit"),
        ("10 perr second", "expected '/' or 'per'"),
    ],
)
def test_ported_rules_that_cannot_work_say_why(text: str, message: str) -> None:
    with pytest.raises(RuleSyntaxError, match=re.escape(message)):
        to_tree(text)
