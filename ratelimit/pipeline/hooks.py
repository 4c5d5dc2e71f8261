"""Hooks: callables told of every decision, for metrics and logs.

A hook is any ``Callable[[Decision], object]``: it sees ``allowed``, ``degraded``, ``rule``,
``key`` and ``retry_after``. Hooks run on the request path after each decision, in order;
keep them cheap (count, don't send). One that raises is logged once and otherwise ignored:
a broken metric never breaks a rate limit.

A hook that also wants each decision's latency has a ``timed(decision, seconds)`` method,
which is called instead (``seconds``: the time the decision pipeline took, storage
included); :class:`ratelimit.metrics.opentelemetry.OpenTelemetryHook` is one.

A hook that also wants to hear of the storage has any of ``store_failed()`` (a call of
the storage failed: a decision answered by the failure policy, or a settle lost),
``outage_started()`` (the first such failure while the storage answered) and
``outage_ended(seconds)`` (the storage answered again, after ``seconds``);
:class:`ratelimit.metrics.prometheus.PrometheusHook` is one.

Example::

    allowed = denied = 0

    def count(decision: Decision) -> None:
        nonlocal allowed, denied
        if decision.allowed:
            allowed += 1
        else:
            denied += 1

    rl = RateLimit(client, hooks=[count])
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ratelimit.core.decision import Decision, Hook

STORE_EVENTS = ("store_failed", "outage_started", "outage_ended")
"""What a hook may hear of the storage, besides decisions."""

logger = logging.getLogger("ratelimit")


class Hooks:
    """The hooks of one ``RateLimit``, each called with every decision."""

    def __init__(self, hooks: Sequence[Hook]) -> None:
        for hook in hooks:
            if not callable(hook):
                raise TypeError(f"a hook must be callable, not {type(hook).__name__}")
        self._hooks = tuple(hooks)
        self._timed = tuple(getattr(hook, "timed", None) for hook in hooks)
        self.timed = any(self._timed)
        self._calls: tuple[tuple[int, Callable[..., object], bool], ...] = tuple(
            (n, hook if timed is None else timed, timed is not None)
            for n, (hook, timed) in enumerate(zip(self._hooks, self._timed, strict=True))
        )
        """Per hook: its position, what is called (``timed``, or the hook), and whether it
        is ``timed``."""
        """Whether a hook wants latencies (the pipeline then reads the clock)."""
        self._failed: set[int] = set()
        self._events = {
            event: tuple(
                (n, method)
                for n, hook in enumerate(hooks)
                if (method := getattr(hook, event, None)) is not None
            )
            for event in STORE_EVENTS
        }

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def __call__(self, decision: Decision, seconds: float = 0.0) -> None:
        for n, hook, timed in self._calls:
            try:
                if timed:
                    hook(decision, seconds)
                else:
                    hook(decision)
            except Exception:
                self._broke(n)

    def store_event(self, event: str, *args: float) -> None:
        """Tell the hooks that listen of ``event`` (one of :data:`STORE_EVENTS`)."""
        for n, method in self._events[event]:
            try:
                method(*args)
            except Exception:
                self._broke(n)

    def _broke(self, n: int) -> None:
        if n not in self._failed:  # once per hook, not once per decision
            self._failed.add(n)
            logger.exception("ratelimit: hook %r failed; it stays installed", self._hooks[n])
