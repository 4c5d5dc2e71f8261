"""The memory backend's entries: one identifier's sliding log, window counters or GCRA
arrival times, each with the time it expires (``expires_us``), which the sweep reads; and
:class:`Tables`, what the backend's feature mixins share of it."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from ratelimit.algorithms import Arrival, window
from ratelimit.backends import windows
from ratelimit.backends.base import Clock
from ratelimit.core.plan import Identifier
from ratelimit.errors import LimiterClosedError
from ratelimit.rules.tree import Rule


class Log:
    """One identifier's hit timestamps (microseconds, newest first) and its expiry."""

    __slots__ = ("expires_us", "hits", "kept")

    def __init__(self) -> None:
        self.hits: deque[int] = deque()
        self.expires_us = 0
        self.kept = 0  # the largest count any limit on this log asked to keep

    def record(self, now: int, cost: int, keep: int, span_us: int, over: bool = False) -> None:
        """Add ``cost`` hits at ``now`` (never older than the newest), keep the newest
        ``keep`` or the largest count kept before, whichever is more (another limit on this
        log may read that far), and live at least ``span_us`` more. ``over``: a rule on
        this log was over its count (an ``And`` admitted the call through another rule):
        every hit within ``span_us`` is kept too, so that a refund taking hits back never
        brings a cut one's place into view."""
        hits = self.hits
        if keep < self.kept:
            keep = self.kept
        else:
            self.kept = keep
        stamp = hits[0] if hits and hits[0] > now else now
        if cost == 1:
            hits.appendleft(stamp)
        else:
            hits.extendleft([stamp] * min(cost, keep))
        if over:
            keep = max(keep, window(hits, len(hits), now - span_us)[0])
        while len(hits) > keep:
            hits.pop()
        if now + span_us > self.expires_us:
            self.expires_us = now + span_us


class Windows:
    """One identifier's window counters: per window size (us) its slots (``windows.py``),
    and its expiry."""

    __slots__ = ("expires_us", "slots")

    def __init__(self) -> None:
        self.slots: dict[int, list[Any]] = {}
        self.expires_us = 0

    def counted(self, size_us: int, index: int) -> tuple[float, float]:
        """(count of window ``index``, count of window ``index - 1``), 0.0 when not held."""
        slots = self.slots.get(size_us)
        return (0.0, 0.0) if slots is None else windows.counted(slots, index)

    def newest(self, size_us: int) -> int:
        """The newest window of ``size_us`` held, or -1."""
        slots = self.slots.get(size_us)
        return -1 if slots is None else windows.newest(slots)

    def hold(self, size_us: int, index: int, count: float) -> None:
        """Hold ``count`` as window ``index`` of ``size_us``."""
        slots = self.slots.get(size_us)
        if slots is None:
            slots = self.slots[size_us] = windows.empty()
        windows.hold(slots, index, count)


class Arrivals:
    """One identifier's GCRA arrival times (microseconds), per span (:func:`gcra_field`),
    each with the count of the rule it was stored under (a rule of another count rescales
    it: :func:`~ratelimit.algorithms.gcra_rescaled`), and its expiry: the latest."""

    __slots__ = ("expires_us", "rates", "tats")

    def __init__(self) -> None:
        self.tats: dict[str, Arrival] = {}
        self.rates: dict[str, int] = {}
        self.expires_us = 0

    def stored(self, field: str, rule: Rule) -> tuple[Arrival, int]:
        """The arrival time of ``field`` as stored, and the count it was stored under
        (``(0, 0)`` and ``rule``'s when none is)."""
        return self.tats.get(field, (0, 0)), self.rates.get(field, rule.count)

    def write(self, field: str, rule: Rule, tat: Arrival, count: int | None = None) -> None:
        """Hold ``tat`` as ``field``'s arrival time, stored under ``count`` (``rule``'s
        when ``None``)."""
        self.tats[field] = tat
        self.rates[field] = rule.count if count is None else count
        self.expires_us = max(self.expires_us, tat[0] + 1)


class Tables:
    """What the memory backend's feature mixins (decisions, settles, resets, slots) share:
    the dicts of entries its host holds, its lock and clock, and two checks of them."""

    _logs: dict[Identifier, Log]
    _windows: dict[Identifier, Windows]
    _arrivals: dict[Identifier, Arrivals]
    _resets: dict[Identifier, tuple[int, int]]
    _lock: threading.Lock
    _clock: Clock
    _closed: bool

    def _check_open(self) -> None:
        if self._closed:
            raise LimiterClosedError("this memory backend")


Entry = TypeVar("Entry", Log, Windows, Arrivals)


def live(
    table: dict[Identifier, Entry], identifier: Identifier, now: int, new: Callable[[], Entry]
) -> Entry:
    """``identifier``'s entry in ``table``, or a new one (``new()``, not stored) where it has
    none or it expired."""
    entry = table.get(identifier)
    return entry if entry is not None and entry.expires_us > now else new()
