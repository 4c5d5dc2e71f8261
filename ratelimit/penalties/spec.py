"""Penalties as data: an identifier refused ``count`` times within ``span`` is then held
back (refused outright) for ``hold``: ``penalty="ip: 5 refusals/10m for 1h"``.

::

    penalty := [selector ":"] count ("refusals" | "refusal") "/" span "for" duration

``span`` and ``duration`` are spelled as the rules' spans (``s``, ``10m``, ``1h``, ``2 days``;
:mod:`ratelimit.rules.grammar` parses them). Without a selector the penalty holds back the value
of the one selector the limit's rules name, or the whole key when they name none
(:func:`penalty_selector`). Errors are :class:`~ratelimit.errors.RuleSyntaxError` with a
1-based column. Pure data, as :mod:`ratelimit.core.slots` is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ratelimit.errors import ConfigurationError, RuleSyntaxError

_PENALTY = re.compile(
    r"\s*(?:(?P<selector>[A-Za-z_][A-Za-z0-9_]*)\s*:)?\s*(?P<counted>.*?)"
    r"(?:\s+(?i:for)\s+(?P<hold>.*?))?\s*\Z",
    re.DOTALL,
)
_REFUSALS = ("refusal", "refusals")


@dataclass(frozen=True, slots=True)
class Penalty:
    """Refused ``count`` times within ``span_ms``: held back for ``hold_ms``. ``selector``:
    the selector whose value is held back, ``None`` for the limit's one selector or its key."""

    count: int
    span_ms: int
    hold_ms: int
    selector: str | None
    text: str

    def __str__(self) -> str:
        return self.text

    @property
    def span(self) -> float:
        """The span, in seconds."""
        return self.span_ms / 1000

    @property
    def hold(self) -> float:
        """How long a hold lasts, in seconds."""
        return self.hold_ms / 1000


def parse_penalty(text: object) -> Penalty:
    """``"5 refusals/10m for 1h"`` or ``"ip: 5 refusals/10m for 1h"``, checked."""
    if isinstance(text, Penalty):
        return text
    if not isinstance(text, str):
        raise TypeError(
            f"a penalty is text such as '5 refusals/10m for 1h', not {type(text).__name__}"
        )
    from ratelimit.rules.grammar import parse_rule  # pyparsing: when a penalty is parsed

    match = _PENALTY.fullmatch(text)
    assert match is not None  # every part is optional
    counted_at = match.start("counted")
    if not match["counted"]:
        raise RuleSyntaxError(
            "a penalty is [selector:] count refusals/span for duration, such as "
            "'5 refusals/10m for 1h'",
            text,
            counted_at + 1,
        )
    try:
        rule = parse_rule(match["counted"])
    except RuleSyntaxError as exc:
        raise RuleSyntaxError(exc.message, text, counted_at + (exc.column or 1)) from None
    if rule.unit is None or rule.unit.lower() not in _REFUSALS or rule.selector or rule.burst:
        raise RuleSyntaxError(
            "a penalty counts refusals: write count refusals/span, such as '5 refusals/10m'",
            text,
            counted_at + 1,
        )
    if match["hold"] is None:
        raise RuleSyntaxError(
            "expected 'for' and how long the hold lasts, such as 'for 1h'",
            text,
            match.end("counted") + 1,
        )
    hold_at = match.start("hold")
    try:
        hold = parse_rule(f"1/{match['hold']}")
    except RuleSyntaxError as exc:
        column = max((exc.column or 3) - 2, 1)
        raise RuleSyntaxError(
            exc.message.replace("span must", "the duration must"), text, hold_at + column
        ) from None
    return Penalty(rule.count, rule.span_ms, hold.span_ms, match["selector"], text)


def penalty_selector(penalty: Penalty, selectors: Iterable[str], where: str) -> str | None:
    """The selector whose value ``penalty`` holds back, among the ``selectors`` the limit's
    rules name (``None``: the whole key). ``ConfigurationError`` when it names one they do
    not, or names none while they name several."""
    named = sorted({s.split("#", 1)[0] for s in selectors})
    if penalty.selector is not None:
        if penalty.selector not in named:
            raise ConfigurationError(
                f"penalty '{penalty}' of {where} holds back selector {penalty.selector!r}, "
                f"which its rules do not name (they name {named or 'none'})"
            )
        return penalty.selector
    if len(named) > 1:
        raise ConfigurationError(
            f"penalty '{penalty}' of {where}: the rules name several selectors ({named}); "
            f"say which one it holds back, such as '{named[0]}: {penalty}'"
        )
    return named[0] if named else None


def checked_penalty(penalty: object, compiled: object, where: str) -> str | None:
    """``penalty`` as a front end keeps it (its text), checked now against the rules'
    selectors (``compiled.selectors``); ``None`` stays ``None``."""
    if penalty is None:
        return None
    parsed = parse_penalty(penalty)
    penalty_selector(parsed, getattr(compiled, "selectors", ()), where)
    return parsed.text


def unselected_penalty(text: object, where: str) -> str | None:
    """A penalty that names no selector (the service's, whose descriptors select), checked;
    ``ConfigurationError`` naming ``where`` otherwise."""
    if text is None:
        return None
    try:
        penalty = parse_penalty(text)
    except (RuleSyntaxError, TypeError) as exc:
        raise ConfigurationError(f"{where}: penalty {text!r}: {exc}") from None
    if penalty.selector is not None:
        raise ConfigurationError(
            f"{where}: penalty {text!r} names a selector; the descriptor's values are held "
            "back here, so write it without one (such as '5 refusals/10m for 1h')"
        )
    return penalty.text
