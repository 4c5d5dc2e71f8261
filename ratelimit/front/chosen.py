"""Rules chosen per call: plans and tiers.

``rules=`` may be a callable (sync or async) of the decorated call's own arguments returning
rules (text or a tree), or a mapping from the values of one selector to rules::

    @rl.limit({"free": "apikey:100/h", "pro": "apikey:10000/h"}, key="search",
              tier=get_tier, apikey=get_api_key)

The mapping is keyed by the one keyword selector of ``limit()`` that none of its rules
names (here ``tier``); a value it lacks takes the ``"default"`` entry, or raises
``ConfigurationError`` naming the value. Every text is parsed once (when the limit is made
for a mapping, at its first call for a callable, then from the parse cache); a bad text from
a callable raises ``RuleSyntaxError`` naming it.

Where a store spreads keys, each identifier is kept where its own (namespace, key, selector,
value) says, whatever tree counts on it: the trees of one key, a callable's and a mapping's
alike, never give one identifier two counters.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeAlias

from ratelimit.core.plan import CompiledTree, compile_tree
from ratelimit.core.selectors import CallSite, SelectorSources, as_text, resolve
from ratelimit.errors import ConfigurationError
from ratelimit.rules.tree import RuleLike, to_tree

DEFAULT = "default"
"""The entry of a rules mapping for values it does not name."""

RulesLike: TypeAlias = (
    "RuleLike | Mapping[str, RuleLike] | Callable[..., RuleLike | Awaitable[RuleLike]]"
)
"""What ``limit()`` takes as rules: fixed, by a selector's value, or from the call."""


UNRESOLVED: Any = object()
"""A rules mapping's selector value not resolved yet (:meth:`ChosenRules.choose`)."""


class ChosenRules:
    """Rules that depend on the call (see the module). Equal when made from the same
    callable, or from equal mappings keyed by the same selector."""

    __slots__ = ("by", "entries", "function")

    def __init__(self, rules: object, keywords: Mapping[str, object]) -> None:
        self.function: Callable[..., Any] | None = None
        self.entries: dict[str, CompiledTree] = {}
        self.by = ""
        if isinstance(rules, Mapping):
            if not rules:
                raise ConfigurationError("a rules mapping needs at least one entry")
            for value, text in rules.items():
                if not isinstance(value, str):
                    raise ConfigurationError(
                        f"rules mapping keys are selector values (text), not {value!r}"
                    )
                self.entries[value] = compile_tree(to_tree(text))
            named = {s.partition("#")[0] for c in self.entries.values() for s in c.selectors}
            free = [name for name in keywords if name not in named]
            if len(free) != 1:
                found = "none is given" if not free else "several are: " + ", ".join(free)
                raise ConfigurationError(
                    "a rules mapping is keyed by the one keyword selector of limit() that none "
                    f"of its rules names; {found} (such as tier=get_tier)"
                )
            self.by = free[0]
        else:
            self.function = rules  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChosenRules):
            return False
        if self.function is not None or other.function is not None:
            return self.function is other.function
        return self.by == other.by and self.entries == other.entries

    def __hash__(self) -> int:
        return hash((self.by, id(self.function), tuple(self.entries)))

    def __str__(self) -> str:
        if self.function is not None:
            return f"rules chosen by {getattr(self.function, '__qualname__', self.function)}"
        inner = ", ".join(f"{value!r}: '{c.tree}'" for value, c in self.entries.items())
        return f"rules by {self.by}: {{{inner}}}"

    @property
    def trees(self) -> tuple[CompiledTree, ...]:
        """The trees a mapping holds (none for a callable: they come with the calls)."""
        return tuple(self.entries.values())

    async def choose(
        self, sources: SelectorSources, key: str, call: CallSite | None, value: Any = UNRESOLVED
    ) -> tuple[CompiledTree, tuple[str, str | None] | None]:
        """The rules of one call, and the (selector, value) that chose them (a mapping's;
        ``None`` for a callable), which overrides match on too. ``value``: a mapping's
        selector value for the call, when it was resolved already (:class:`Chooser`;
        :data:`UNRESOLVED`: not yet)."""
        if self.function is not None:
            args = () if call is None else call.args
            kwargs = {} if call is None else call.kwargs
            chosen = self.function(*args, **kwargs)
            if inspect.isawaitable(chosen):
                chosen = await chosen
            return compile_tree(to_tree(chosen)), None
        if value is UNRESOLVED:
            (value,) = await resolve((self.by,), sources, key, call)
        return self.entry(value, key), (self.by, value)

    def entry(self, value: str | None, key: str) -> CompiledTree:
        """A mapping's rules for its selector's ``value`` (the ``"default"`` entry's for a
        value it lacks), or ``ConfigurationError`` naming the value."""
        compiled = self.entries.get(value or "") or self.entries.get(DEFAULT)
        if compiled is None:
            raise ConfigurationError(
                f"key {key!r}: no rules for {self.by}={value!r} and no {DEFAULT!r} entry "
                f"(the mapping names {', '.join(map(repr, self.entries))})"
            )
        return compiled


class Chooser:
    """The direct paths of a limit whose rules a mapping chooses by a keyword selector
    (``tier=get_tier``): one per entry, worked out when the limit decorates. Each call
    resolves the selector once (:meth:`value`), and its entry's paths decide it
    (:meth:`paths`); a value the mapping lacks has none, and the general path, given the
    value, answers it (its ``"default"`` entry, or the error naming the value)."""

    __slots__ = ("_calls", "_paths", "_source")

    def __init__(self, source: object, paths: Mapping[str, Any]) -> None:
        self._source = source
        self._calls = callable(source)
        self._paths = dict(paths)

    async def value(self) -> str | None:
        """The selector's value for this call: the keyword given, called (and awaited)."""
        value = self._source
        if self._calls:
            value = value()  # type: ignore[operator]
        if value.__class__ is not str and inspect.isawaitable(value):
            value = await value
        return as_text(value)

    def paths(self, value: str | None) -> Any:
        """The paths of the entry for ``value`` (the ``"default"`` entry's for one it
        lacks); ``(None, None, None)`` for the general path."""
        found = self._paths.get(value or "")
        if found is None:
            found = self._paths.get(DEFAULT, _GENERAL)
        return found


_GENERAL = (None, None, None)
