"""Rules registered under a ``key=``, so that ``limit(key=...)`` without rules can reuse them.

Example::

    registry = Registry()
    registry.register("cats", compiled, sources)
    registry.registered("cats").compiled
"""

from __future__ import annotations

from typing import NamedTuple

from ratelimit.core.plan import CompiledTree
from ratelimit.core.selectors import SelectorSources
from ratelimit.errors import RuleConflictError, UnknownKeyError
from ratelimit.front.chosen import ChosenRules


class Registration(NamedTuple):
    """The rules of one key and the selector sources they were registered with: a tree,
    or rules chosen per call (:class:`~ratelimit.front.chosen.ChosenRules`)."""

    compiled: CompiledTree | ChosenRules
    sources: SelectorSources


class Registry:
    """One limiter's keys and their rules: one rule set per key."""

    def __init__(self) -> None:
        self._by_key: dict[str, Registration] = {}

    def register(
        self, key: str, compiled: CompiledTree | ChosenRules, sources: SelectorSources
    ) -> None:
        """Register ``compiled`` under ``key``; different rules already there are refused
        (``RuleConflictError``), equal ones are kept."""
        registered = self._by_key.get(key)
        if registered is None:
            self._by_key[key] = Registration(compiled, sources)
        elif registered.compiled is not compiled and _shape(registered.compiled) != _shape(
            compiled
        ):
            raise RuleConflictError(key, _shape(registered.compiled), _shape(compiled))

    def registered(self, key: str) -> Registration:
        """What was registered under ``key``, or ``UnknownKeyError``."""
        registration = self._by_key.get(key)
        if registration is None:
            raise UnknownKeyError(key)
        return registration


def _shape(rules: CompiledTree | ChosenRules) -> object:
    """What two registrations compare: a tree's rules, or the chosen rules themselves."""
    return rules.tree if isinstance(rules, CompiledTree) else rules
