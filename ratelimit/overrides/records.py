"""Overrides as the store keeps them (:mod:`ratelimit.overrides.cache` applies them): the
:class:`Override`, its identity (:func:`override_id`) and record (:func:`encode`,
:func:`decode`), the checks of what is set, and which override is in force
(:func:`winner`: the store's order, never a writer's clock)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ratelimit.core.plan import CompiledTree, compile_tree
from ratelimit.errors import RateLimitError
from ratelimit.rules.tree import to_tree

logger = logging.getLogger("ratelimit")

MAX_ANNOUNCED_BYTES = 1_000
"""The longest key announced, in UTF-8 bytes (PostgreSQL's index takes about 2 700)."""
MAX_TTL = 10 * 365 * 86_400.0
"""The longest ``ttl=`` an override takes (ten years): its expiry stays a date."""
Values = tuple[tuple[str, str], ...]
"""An override's selector values: (name, value) pairs sorted by name."""


@dataclass(frozen=True, slots=True)
class Override:
    """Rules that replace those of ``key`` for calls with every one of ``values``.

    - ``key``: the limit's key;
    - ``values``: (selector, value) pairs, sorted by selector; empty for every call;
    - ``rules``: the rules in force instead, as text;
    - ``expires``: when it stops applying (seconds since the epoch), ``None`` for never;
    - ``at``: when it was set (seconds since the epoch, the setter's clock: shown, never
      ordered by);
    - ``version``: the store's order (the namespace's version its write made: the larger
      was set later); 0 for one written before stores kept it, ``None`` for one this
      process wrote and has not read back yet (it was set last, here).
    """

    key: str
    values: Values
    rules: str
    expires: float | None = None
    at: float = 0.0
    version: int | None = field(default=0, compare=False)

    @property
    def compiled(self) -> CompiledTree:
        """The rules, compiled (parsed once per distinct text)."""
        return compile_tree(to_tree(self.rules))

    @property
    def selectors(self) -> dict[str, str]:
        """``values`` as a mapping."""
        return dict(self.values)

    def live(self, now: float) -> bool:
        """Whether it applies at ``now`` (seconds since the epoch)."""
        return self.expires is None or now < self.expires

    def __str__(self) -> str:
        who = " ".join(f"{name}={value}" for name, value in self.values) or "every call"
        return f"{self.key} [{who}]: {self.rules}"


def values_of(values: Mapping[str, object]) -> Values:
    """Selector values as an override keeps them (text, sorted by name); ``TypeError`` or
    ``ValueError`` naming a bad one."""
    pairs = []
    for name, value in values.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a selector name is a name such as apikey, not {name!r}")
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise TypeError(f"the value of {name} must be text or a whole number, not {value!r}")
        if value == "":
            raise ValueError(f"the value of {name} must not be empty")
        pairs.append((name, str(value)))
    return tuple(sorted(pairs))


def override_id(key: str, values: Values) -> str:
    """The store's name of the override of ``key`` for ``values``: one per pair."""
    return json.dumps([key, [list(pair) for pair in values]], ensure_ascii=False)


def encode(override: Override) -> str:
    """What the store keeps of an override besides its id."""
    record = {"rules": override.rules, "expires": override.expires, "at": override.at}
    return json.dumps(record, ensure_ascii=False)


def decode(identity: str, record: str) -> Override | None:
    """The override a store's entry holds; ``None`` (and a warning) when it cannot be read,
    so that one bad entry never stops the others."""
    try:
        key, pairs = json.loads(identity)
        fields = json.loads(record)
        values = tuple((str(name), str(value)) for name, value in pairs)
        expires, at = fields.get("expires"), fields.get("at", 0.0)
        if expires is not None and not _is_time(expires):
            raise TypeError(f"expires is not a time: {expires!r}")
        if not _is_time(at):
            raise TypeError(f"at is not a time: {at!r}")
        version = fields.get("version", 0)
        if type(version) is not int:
            raise TypeError(f"version is not a whole number: {version!r}")
        override = Override(str(key), values, str(fields["rules"]), expires, at, version)
        override.compiled  # noqa: B018 - a text that does not parse is reported here
    except (ValueError, TypeError, KeyError, RateLimitError) as exc:
        logger.warning("ratelimit: an override in the store cannot be read (%s): %s", identity, exc)
        return None
    return override


def announceable(key: str) -> bool:
    """Whether every store can keep ``key`` in its table of announced keys: UTF-8 text (no
    lone surrogate) without a NUL byte, of at most :data:`MAX_ANNOUNCED_BYTES`. Others are
    never announced (announcing is best effort: ``ratelimit override set`` warns of them)."""
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        return False
    return size <= MAX_ANNOUNCED_BYTES and "\x00" not in key


def _is_time(value: object) -> bool:
    """Whether ``value`` is seconds since the epoch as a record keeps them (a number)."""
    return type(value) in (int, float) and not math.isnan(value)  # type: ignore[arg-type]


def check_ttl(ttl: object) -> float | None:
    """``ttl=``: ``None`` or seconds above 0, at most :data:`MAX_TTL`."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise TypeError(f"ttl must be a number of seconds, or None, not {ttl!r}")
    if ttl <= 0:
        raise ValueError(f"ttl must be above 0 seconds, not {ttl!r}")
    if ttl > MAX_TTL:
        raise ValueError(
            f"ttl must be at most {MAX_TTL:.0f} seconds (ten years), not {ttl!r}; "
            "ttl=None keeps an override until it is deleted"
        )
    return float(ttl)


def winner(found: Iterable[Override]) -> Override | None:
    """Of the overrides matching one call, the one in force: most values, then set last in
    the store's order (:attr:`Override.version`; among those written before stores kept
    one, the latest ``at``)."""
    return max(found, key=_rank, default=None)


def _rank(override: Override) -> tuple[int, float, float, Values]:
    version = override.version
    return (
        len(override.values),
        math.inf if version is None else version,
        override.at,
        override.values,
    )
