"""What a response says about the limits that decided it: the ``RateLimit-Policy`` and
``RateLimit`` fields of draft-ietf-httpapi-ratelimit-headers-11 (Structured Field lists, one
item per rule that applied), ``Retry-After`` in whole seconds rounded up, the optional legacy
``X-RateLimit-*`` trio, and the RFC 9457 problem details of a refusal.

Each policy is named by its rule's text (``"ip:5/m"``), so a client reads what it is held
to. ``w`` is given for spans of whole seconds (the field has no finer unit); a GCRA rule
with a burst is ``q=burst`` over the burst's refill time (``10/s burst 20``: ``q=20;w=2``,
the same rate, and ``r`` never above ``q``); ``t`` is
:attr:`RuleState.reset_after <ratelimit.core.decision.RuleState>` rounded up.

A rule that counts a unit says so: ``qu="content-bytes"`` for a unit the draft's registry
defines (a rule counting ``bytes`` or ``content_bytes``); any other unit, which ``qu``
cannot name, as the vendor parameter ``ratelimit-unit`` (``"key:90000 tokens/m";q=90000;
w=60;ratelimit-unit="tokens"``), so that no client reads tokens as requests, the
default ``qu``. The legacy trio reports the tightest rule counting requests (any rule, when
none does). A concurrency limit that refused (``ConcurrencyLimitExceeded`` inside the
application) is reported with ``qu="concurrent-requests"``.

:func:`rate_limit_fields` gives the two fields' values as text for any front end: the
middleware's headers, and the rate-limit service's ``response_headers_to_add``
(:mod:`ratelimit.service.envoy_headers`).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from typing import NamedTuple

from ratelimit.core.decision import (
    Decision,
    HeldDecision,
    LocalSlotRefusal,
    NeverAdmitted,
    RuleState,
)
from ratelimit.core.slots import SlotLimit
from ratelimit.rules.tree import Rule

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
PROBLEM_JSON = b"application/problem+json"

Headers = list[tuple[bytes, bytes]]
REGISTERED_UNITS = {"bytes": "content-bytes", "content_bytes": "content-bytes"}
"""Rule units the draft's quota-unit registry names (``qu``), by the rule's unit."""
FULL_UNIT = "concurrent-requests"
"""The ``qu`` of a concurrency limit with no free slot."""


class Exhausted(NamedTuple):
    """A policy that is not a rule's and admits nothing now, with no known reset (so its
    ``RateLimit`` item has ``r=0`` and no ``t``): a concurrency limit with no free slot
    (``qu="concurrent-requests"``), or the rate-limit service's descriptor whose ``limit``
    is 0. ``name``: printable ASCII (quoted here); ``window``: ``w`` in seconds."""

    name: str
    quota: int
    window: int | None = None
    unit: str | None = None
    """A unit the draft's registry names (``qu``), such as ``"concurrent-requests"``."""


def quoted(text: str) -> str:
    """``text`` (printable ASCII) as a Structured Field String."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


@functools.lru_cache(maxsize=4096)
def _name(rule: Rule) -> str:
    """The policy's name as a Structured Field String (rule text is printable ASCII)."""
    return quoted(str(rule))


def _policy_item(
    name: str, quota: int, unit: str | None, window: int | None, vendor_unit: str | None = None
) -> str:
    """One ``RateLimit-Policy`` item: ``name`` (already quoted) with ``q``, then ``qu``,
    ``w`` and the vendor ``ratelimit-unit``, in that order, each when given."""
    item = f"{name};q={quota}"
    if unit is not None:
        item += f';qu="{unit}"'
    if window is not None:
        item += f";w={window}"
    if vendor_unit is not None:
        item += f';ratelimit-unit="{vendor_unit}"'  # a unit is a word: no escaping needed
    return item


def seconds(value: float) -> int:
    """Whole seconds, rounded up (delay-seconds)."""
    return max(math.ceil(value - 1e-9), 0)


def policy_field(states: Sequence[RuleState]) -> str:
    """``RateLimit-Policy``: ``"ip:5/m";q=5;w=60, ...``."""
    return _policies(tuple(state.rule for state in states))


@functools.lru_cache(maxsize=4096)
def _policies(rules: tuple[Rule, ...]) -> str:
    """The policy field of these rules: the same for every response they decide."""
    items = []
    for rule in rules:
        # A GCRA burst: q of it at once, refilled over burst intervals (the same rate).
        quota = rule.count if rule.burst is None else rule.burst
        window_ms = rule.span_ms * quota
        whole = window_ms % (1000 * rule.count) == 0
        window = window_ms // (1000 * rule.count) if whole else None
        registered = REGISTERED_UNITS.get(rule.unit) if rule.unit is not None else None
        vendor = rule.unit if registered is None else None
        items.append(_policy_item(_name(rule), quota, registered, window, vendor))
    return ", ".join(items)


def limit_field(states: Sequence[RuleState]) -> str:
    """``RateLimit``: ``"ip:5/m";r=3;t=42, ...``."""
    return ", ".join(
        f"{_name(state.rule)};r={state.remaining};t={seconds(state.reset_after)}"
        for state in states
    )


def retry_after(decision: Decision) -> int | None:
    """``Retry-After`` of a refusal: whole seconds, rounded up, at least 1; ``None`` for a
    request that is never admitted (:class:`~ratelimit.core.decision.NeverAdmitted`: its
    cost is more than its rules admit at once), whom no wait would help."""
    if decision.__class__ is NeverAdmitted:
        return None
    return max(seconds(decision.retry_after), 1)


def rate_limit_fields(
    states: Sequence[RuleState], exhausted: Sequence[Exhausted] = ()
) -> tuple[str, str] | None:
    """The values of ``RateLimit-Policy`` and ``RateLimit``: one item per state, then one
    per ``exhausted`` policy; ``None`` when there is neither (nothing to report). Plain
    text, for any front end: the middleware's headers, the rate-limit service's
    ``response_headers_to_add``."""
    if not states and not exhausted:
        return None
    policies = [policy_field(states)] if states else []
    limits = [limit_field(states)] if states else []
    for policy in exhausted:
        name = quoted(policy.name)
        policies.append(_policy_item(name, policy.quota, policy.unit, policy.window))
        limits.append(f"{name};r=0")
    return ", ".join(policies), ", ".join(limits)


def rate_limit_headers(
    decisions: Sequence[Decision], legacy: bool = False, full: SlotLimit | None = None
) -> Headers:
    """The headers of a response decided by ``decisions`` (a route's limit and any
    dependencies'): nothing when no storage counted (no rule applied, or fail-open).
    ``full``: a concurrency limit that found no free slot, reported as
    ``qu="concurrent-requests"`` with nothing left (``r=0``; no ``t``: when a slot frees
    depends on how long the others run)."""
    states = [state for decision in decisions for state in decision.states]
    exhausted = () if full is None else (Exhausted(str(full), full.count, None, FULL_UNIT),)
    fields = rate_limit_fields(states, exhausted)
    if fields is None:
        return []
    headers: Headers = [
        (b"ratelimit-policy", fields[0].encode("ascii")),
        (b"ratelimit", fields[1].encode("ascii")),
    ]
    if not states:
        return headers
    if legacy:
        requests = [state for state in states if state.rule.unit is None] or states
        tightest = min(requests, key=lambda s: (s.remaining, -s.reset_after))
        headers += [
            (b"x-ratelimit-limit", str(tightest.rule.count).encode()),
            (b"x-ratelimit-remaining", str(tightest.remaining).encode()),
            (b"x-ratelimit-reset", str(seconds(tightest.reset_after)).encode()),
        ]
    return headers


def violated(decision: Decision) -> list[str]:
    """The names of the policies that refused."""
    names = [str(s.rule) for s in decision.states if s.limited]
    if not names and decision.rule is not None:
        names = [str(decision.rule)]
    return names


def undecided(decision: Decision) -> bool:
    """Whether a refusal is the limiter's failure to decide (the storage failed under
    ``on_error="deny"``, a lock timeout: 503, never ``refused=``'s) rather than a limit's
    (``on_error="local"``'s refusals of a local share included: 429)."""
    return decision.degraded and decision.rule is None and type(decision) is not LocalSlotRefusal


def problem(decision: Decision) -> tuple[int, bytes]:
    """The status and ``application/problem+json`` body of a refusal: 429 naming the
    violated policies (``on_error="local"``'s refusals too: a local share of a rule or of
    concurrency slots), or 503 when the limiter could not decide: the storage failed under
    ``on_error="deny"``, or the command engine's lock stayed held past ``lock_timeout``."""
    wait = retry_after(decision)
    if undecided(decision):
        body = {
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": "the rate limiter could not decide (its storage is failing, or busy) "
            f"and this service refuses requests until it can; retry after {wait} s",
        }
        return 503, json.dumps(body).encode()
    if decision.penalty is not None:  # held back by a penalty: no rule was asked
        why = decision.held_by if isinstance(decision, HeldDecision) else ""
        body = {
            "type": QUOTA_EXCEEDED,
            "title": "Request cannot be satisfied as assigned quota has been exceeded",
            "status": 429,
            "detail": f"held back for {wait} s{why}; retry after {wait} s",
            "penalty": wait,
        }
        return 429, json.dumps(body).encode()
    policies = violated(decision)
    if isinstance(decision, NeverAdmitted):
        body = {
            "type": QUOTA_EXCEEDED,
            "title": "Request cannot be satisfied as assigned quota has been exceeded",
            "status": 429,
            "detail": f"request refused: {decision.why}, so it is never admitted, however "
            "long the client waits (nothing was counted)",
            "violated-policies": policies,
        }
        return 429, json.dumps(body).encode()
    body = {
        "type": QUOTA_EXCEEDED,
        "title": "Request cannot be satisfied as assigned quota has been exceeded",
        "status": 429,
        "detail": f"rate limit exceeded ({', '.join(policies) or decision.key}); "
        f"retry after {wait} s",
        "violated-policies": policies,
    }
    return 429, json.dumps(body).encode()


def unreadable(error: Exception) -> tuple[int, bytes]:
    """The status and ``application/problem+json`` body of a request whose selector value
    its source's ``type`` cannot read (:class:`~ratelimit.asgi.values.SourceValueError`):
    422, counted nowhere."""
    body = {
        "type": "about:blank",
        "title": "Unprocessable Content",
        "status": 422,
        "detail": f"{error}; this service limits requests by that value, so it must be valid",
    }
    return 422, json.dumps(body).encode()


def problem_headers(body: bytes) -> Headers:
    """``Content-Type`` and ``Content-Length`` of a problem response."""
    return [(b"content-type", PROBLEM_JSON), (b"content-length", str(len(body)).encode())]


def refusal_headers(decision: Decision, body: bytes) -> Headers:
    """``Content-Type``, ``Content-Length`` and ``Retry-After`` of a problem response, in
    that order (``[2:]`` is ``Retry-After`` alone: none for a request never admitted)."""
    wait = retry_after(decision)
    if wait is None:  # never admitted: no wait helps
        return problem_headers(body)
    return [*problem_headers(body), (b"retry-after", str(wait).encode())]
