"""A configuration's limits as rules of this package, for our algorithms
(``RATELIMIT_ALGORITHM`` with ``serve --envoy``).

Each limit becomes rules of our grammar (:attr:`~.descriptors.EnvoyLimit.rules`):

- ``rate_limit: {unit: second, requests_per_unit: 10}`` is ``10/1s`` (a week ``7d``, a month
  ``30d``, a year ``365d``, as its service counts them);
- ``rate_limit`` written as a list is every window at once (``10/1s | 100/1m``: refused when
  any of them is over), its ``name`` and ``replaces`` on its first item;
- ``rule: "10/5s | 1000/1h"`` is taken as written: any window, ``burst`` for GCRA, no
  selector (a descriptor's rules count per descriptor). A ``rate_limit`` beside it may only
  name it (``name``, ``replaces``).

``always_count: true`` (ours too) counts a descriptor's hits whether or not they are refused.
A limit of 0 requests admits nothing (its rules are ``""``). Rules that the algorithm cannot
keep, or that do not parse, are a load error naming the file and the descriptor.
"""

from __future__ import annotations

from ratelimit.core.checks import check_cost
from ratelimit.core.plan import compile_tree
from ratelimit.errors import ConfigurationError, RuleSyntaxError
from ratelimit.rules.tree import to_tree
from ratelimit.service.envoy_config.yaml_go import YamlDescriptor, error

SPANS = {
    "SECOND": "1s",
    "MINUTE": "1m",
    "HOUR": "1h",
    "DAY": "1d",
    "WEEK": "7d",
    "MONTH": "30d",
    "YEAR": "365d",
}
"""Each unit of the protocol as a span of our grammar."""


def rules_of(
    name: str, descriptor: YamlDescriptor, full_key: str, unit: str, algorithm: str
) -> str:
    """The rules for ``algorithm`` of ``descriptor`` of file ``name`` (its limit loaded as
    its loader loads it: ``full_key``, ``unit``; ``""`` for an unlimited one)."""
    where = f"descriptor '{full_key}' (line {descriptor.line})"
    rate = descriptor.rate_limit
    if rate is not None and rate.unlimited:
        if descriptor.more_limits or descriptor.rule:
            raise error(name, f"{where}: an unlimited limit has no other limit or rule")
        return ""
    if descriptor.rule:
        if unit or descriptor.more_limits:
            raise error(
                name,
                f"{where}: give its limit as rule or as rate_limit (unit, "
                "requests_per_unit), not both; a rate_limit beside a rule may only name it",
            )
        text = descriptor.rule
    else:
        assert rate is not None
        text = _windows(name, where, descriptor, rate.requests_per_unit, unit)
    if text:
        _check(name, where, text, algorithm)
    return text


def _windows(name: str, where: str, descriptor: YamlDescriptor, count: int, unit: str) -> str:
    """The rules of ``rate_limit`` (one, or a list): ``""`` if one admits nothing."""
    windows = [(count, unit)]
    for more in descriptor.more_limits:
        if more.name or more.replaces:
            raise error(name, f"{where}: name and replaces go on a rate_limit list's first item")
        upper = more.unit.upper()
        if more.unlimited or upper not in SPANS:
            raise error(name, f"{where}: invalid rate limit unit '{more.unit}' in its list")
        windows.append((more.requests_per_unit, upper))
    if any(count == 0 for count, _ in windows):
        return ""
    return " | ".join(f"{count}/{SPANS[unit]}" for count, unit in windows)


def _check(name: str, where: str, text: str, algorithm: str) -> None:
    try:
        compiled = compile_tree(to_tree(text))
    except RuleSyntaxError as exc:
        raise error(name, f"{where}: rule {text!r}: {exc}") from None
    if compiled.selectors:
        raise error(
            name,
            f"{where}: rule {text!r} names a selector: a descriptor's rules count per "
            "descriptor, as its entries say",
        )
    try:
        check_cost(compiled, 1, algorithm)
    except ConfigurationError as exc:
        raise error(name, f"{where}: rule {text!r}: {exc}") from None
