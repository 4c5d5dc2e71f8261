"""The rule language, parsed with pyparsing (the only module that imports it).

::

    rules    := tree ((";" | ",") tree)*
    tree     := and_term ("|" and_term)*
    and_term := atom ("&" atom)*
    atom     := rule | "(" tree ")"
    rule     := [selector ":"] count ["r" | counted] ("/" | "per") [multiple] unit
                ["burst" count]
    counted  := a word naming what the rule counts ("tokens"), not "r", "per" or "burst"
    unit     := ms | s | m | h | d | second(s) | sec(s) | minute(s) | min(s) | hour(s)
              | hr(s) | day(s)          (the words in any case)

``90000 tokens/m`` counts tokens, not calls: a call's ``cost`` mapping gives how many
(``{"tokens": 1200}``), on a counter of the rule's own. ``burst N`` (the word in any case)
lets N calls come at once under ``algorithm="gcra"``. ``&`` binds tighter than ``|``. ``;``
and ``,`` separate limits that all apply, as in the ``limits`` library (and slowapi,
flask-limiter): they mean ``|`` with the lowest precedence, so ``"100/hour;10/second"``
ports unchanged. Errors are :class:`RuleSyntaxError` with a 1-based column.
"""

from __future__ import annotations

import functools
import re

import pyparsing as pp

from ratelimit.errors import RuleSyntaxError
from ratelimit.rules.tree import MAX_COUNT, MAX_SPAN_MS, MAX_UNIT, UNIT_MS, And, Node, Or, Rule

MAX_TEXT = 4096
MAX_NESTING = 32

_UNIT_MS = dict(UNIT_MS)
_WORD_UNIT = {
    "second": "s",
    "sec": "s",
    "minute": "m",
    "min": "m",
    "hour": "h",
    "hr": "h",
    "day": "d",
}
_UNITS_EXPECTED = "unit (ms, s, m, h, d, second, minute, hour, day)"


def _fail(message: str) -> pp.ParseAction:
    def action(text: str, loc: int, _tokens: pp.ParseResults) -> None:
        raise pp.ParseFatalException(text, loc, message)

    return action


def _whole(name: str) -> pp.ParseAction:
    def action(text: str, loc: int, tokens: pp.ParseResults) -> int:
        number = int(tokens[0])
        if not 1 <= number <= MAX_COUNT:
            raise pp.ParseFatalException(
                text, loc, f"{name} must be an integer from 1 to {MAX_COUNT}, not {tokens[0]}"
            )
        return number

    return action


def _to_span_ms(text: str, loc: int, tokens: pp.ParseResults) -> int:
    unit = str(tokens["unit"])
    word = unit.lower().rstrip("s") if len(unit) > 2 else unit
    multiple = int(tokens["multiple"]) if "multiple" in tokens else 1
    span_ms = multiple * _UNIT_MS[_WORD_UNIT.get(word, word)]
    if not 1 <= span_ms <= MAX_SPAN_MS:
        raise pp.ParseFatalException(
            text, loc, f"span must be from 1 ms to 3650 days, not {multiple}{unit}"
        )
    return span_ms


def _to_rule(tokens: pp.ParseResults) -> Rule:
    selector = str(tokens["selector"]) if "selector" in tokens else None
    burst = int(tokens["burst"]) if "burst" in tokens else None
    unit = str(tokens["counted"]) if "counted" in tokens else None
    return Rule(int(tokens["count"]), int(tokens["span"]), selector, burst, unit)


def _fold(cls: type[And] | type[Or]) -> pp.ParseAction:
    def action(tokens: pp.ParseResults) -> Node:
        children = list(tokens)
        return children[0] if len(children) == 1 else cls(*children)

    return action


def _build() -> tuple[pp.ParserElement, pp.ParserElement]:
    selector = pp.Regex(r"[A-Za-z_][A-Za-z0-9_]*(?=\s*:)").set_name("selector")
    count = (
        pp.Regex(r"\d+").set_name("count (a positive integer)").set_parse_action(_whole("count"))
    )
    multiple = pp.Regex(r"\d+").set_name("multiple")
    word = r"(?i:seconds?|secs?|minutes?|mins?|hours?|hrs?|days?)"
    unit = pp.Regex(rf"(?:ms|s|m|h|d|{word})(?![A-Za-z0-9_])").set_name(_UNITS_EXPECTED)
    unfixed = pp.Regex(r"(?i:months?|years?)(?![A-Za-z0-9_])").set_parse_action(
        _fail("month and year have no fixed length here: write 30d or 365d")
    )
    unit = (unit | unfixed).set_name(_UNITS_EXPECTED)
    span = pp.Group(pp.Optional(multiple("multiple")) + unit("unit")).set_parse_action(
        lambda text, loc, tokens: _to_span_ms(text, loc, tokens[0])
    )
    burst = (
        pp.Regex(r"\d+").set_name("burst (a positive integer)").set_parse_action(_whole("burst"))
    )
    burst_clause = pp.Suppress(pp.Regex(r"(?i:burst)(?![A-Za-z0-9_])")) - burst("burst")
    counted = pp.Regex(
        rf"(?!(?i:r|per|burst)(?![A-Za-z0-9_]))[A-Za-z_][A-Za-z0-9_]{{0,{MAX_UNIT - 1}}}"
        r"(?![A-Za-z0-9_])"
    ).set_name("what the rule counts (a word such as tokens)")
    third_field = (pp.Literal(":") + pp.Regex(r"[^\s&|()]*")).set_parse_action(
        _fail(
            "a rule has two fields, [selector:]count/span; a third field "
            "(such as ':0.1') is not supported"
        )
    )
    rule = (
        (
            pp.Optional(selector("selector") + pp.Suppress(":"))
            + count("count")
            + pp.Optional(counted("counted") | pp.Suppress(pp.Literal("r")))
            + pp.Suppress(pp.Regex(r"/|(?i:per)(?![A-Za-z0-9_])").set_name("'/' or 'per'"))
            + span("span")
            + pp.Optional(burst_clause)
        )
        .set_parse_action(_to_rule)
        .set_name("rule (such as 10/s or user:5/m)")
    )
    rule = rule + pp.Optional(third_field)

    tree = pp.Forward()
    tree.set_name("rules")
    atom = (rule | (pp.Suppress("(") - tree - pp.Suppress(")"))).set_name(
        "rule (such as 10/s or user:5/m) or '('"
    )
    and_term = (atom + pp.ZeroOrMore(pp.Suppress("&") - atom)).set_parse_action(_fold(And))
    tree <<= (and_term + pp.ZeroOrMore(pp.Suppress("|") - and_term)).set_parse_action(_fold(Or))
    separator = pp.Suppress(pp.Char(";,"))
    rules = (tree + pp.ZeroOrMore(separator - tree)).set_parse_action(_fold(Or))
    rule_end = pp.StringEnd().set_name("end of rule")
    tree_end = pp.StringEnd().set_name("end of rules, '&', '|' or ';'")
    return rule + rule_end, rules + tree_end


_RULE, _TREE = _build()


def _parse(element: pp.ParserElement, text: str) -> Node:
    if not isinstance(text, str):
        raise TypeError(f"rules must be text, not {type(text).__name__}")
    if not text.strip():
        raise RuleSyntaxError("empty rule", text, 1)
    if len(text) > MAX_TEXT:
        raise RuleSyntaxError(f"rule text longer than {MAX_TEXT} characters", text[:40] + "...")
    if text.count("(") > MAX_NESTING:
        raise RuleSyntaxError(f"more than {MAX_NESTING} parentheses", text)
    try:
        result = element.parse_string(text, parse_all=True)
    except pp.ParseBaseException as exc:
        raise RuleSyntaxError(_message(exc), text, exc.col) from None
    node: Node = result[0]
    return node


def _message(exc: pp.ParseBaseException) -> str:
    message = re.sub(r"^Expected\s+(?:\{|\[)?", "expected ", str(exc.msg))
    message = message.replace(", found end of text", "")
    return (
        message
        if message.startswith("expected") or not isinstance(exc, pp.ParseException)
        else f"expected {message}"
    )


@functools.lru_cache(maxsize=1024)
def parse_tree(text: str) -> Node:
    """Parse rule text, infix ``&`` / ``|`` and parentheses included, into a tree."""
    return _parse(_TREE, text)


@functools.lru_cache(maxsize=1024)
def parse_rule(text: str) -> Rule:
    """Parse exactly one rule such as ``"username:10/5m"``."""
    node = _parse(_RULE, text)
    assert isinstance(node, Rule)
    return node
