"""The headers Envoy passes on to its client: a ``ShouldRateLimit`` answer's
``response_headers_to_add``, which Envoy adds to the response it sends downstream (on
``OK`` and ``OVER_LIMIT`` answers alike).

- ``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-ratelimit-headers-11),
  formatted by the ASGI middleware's own functions (:func:`ratelimit.asgi.headers.
  rate_limit_fields`), so that both front ends say the same thing the same way;
- ``Retry-After`` when the answer is ``OVER_LIMIT``: whole seconds, rounded up, at least 1
  (:func:`ratelimit.asgi.headers.retry_after`), the longest of the refusals (the request is
  admitted only once every one of them admits it).

What is reported, one list item per rule, descriptors in the request's order:

- every rule of every descriptor's limit that applied, whichever group decided it
  (enforced, ``always_count``, ``shadow``). A shadow descriptor is reported as the
  middleware reports a shadow limit (its state, ``r=0`` once it would refuse), and, as
  there, lets the request through: it never brings ``Retry-After``;
- a descriptor whose ``limit`` is 0 requests (Envoy's ``RateLimitOverride``): a policy that
  admits nothing, ``"0/h";q=0;w=3600`` with ``"0/h";r=0`` (no ``t``: it never resets), and
  its window as the ``Retry-After`` it brings;
- a decision the failure policy made (the store failed, ``RATELIMIT_ON_ERROR``): no rule
  state, so no items, as in the middleware; an ``OVER_LIMIT`` it answered (``deny``) still
  has ``Retry-After`` (at least 1 s).

Each policy is named by its rule's own text as the rules file (or an override) writes it
(``"3/m"``; a descriptor limited by ``"1/m | 10/h"`` has ``"1/m"`` and ``"10/h"``), never by
the selector the service counts it under (made from the domain and descriptor pattern),
and never with a descriptor's values: rule text is printable ASCII, a valid
Structured Field String once quoted. Two descriptors limited by the same text have items of
the same name.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from ratelimit.asgi.headers import Exhausted, rate_limit_fields, retry_after
from ratelimit.core.decision import Decision, RuleState
from ratelimit.core.extras import needs_extra
from ratelimit.rules.tree import Rule

with needs_extra("server"):
    from ratelimit.service.proto.envoy.core_pb2 import HeaderValue

POLICY = "ratelimit-policy"
LIMIT = "ratelimit"
RETRY_AFTER = "retry-after"


@functools.lru_cache(maxsize=4096)
def _own(rule: Rule) -> Rule:
    """``rule`` without the selector the service counts it under: the rule as written."""
    return rule if rule.selector is None else dataclasses.replace(rule, selector=None)


@functools.lru_cache(maxsize=16)
def _blocked(span: str) -> Exhausted:
    """The policy of a descriptor whose ``limit`` is 0 per ``span`` (``"h"``, ``"30d"``)."""
    window = Rule.parse(f"1/{span}").span_ms // 1000
    return Exhausted(f"0/{span}", 0, window)


def response_headers(
    states: Sequence[Sequence[RuleState]],
    blocked: Sequence[str] = (),
    refusals: Sequence[Decision] = (),
) -> list[tuple[str, str]]:
    """The headers of one answer, as (lower-case name, value) pairs; none when nothing is
    to be said. ``states``: each descriptor's rule states, in the request's order (empty
    for a descriptor no limit matched, or decided by the failure policy); ``blocked``: the
    span (``"h"``) of each descriptor whose ``limit`` is 0; ``refusals``: the decisions
    that refused the request (not the shadow ones). ``Retry-After`` is given exactly when
    there is a refusal: when the answer is ``OVER_LIMIT``."""
    own = [state._replace(rule=_own(state.rule)) for mine in states for state in mine]
    exhausted = [_blocked(span) for span in blocked]
    headers: list[tuple[str, str]] = []
    fields = rate_limit_fields(own, exhausted)
    if fields is not None:
        headers += [(POLICY, fields[0]), (LIMIT, fields[1])]
    waits = [wait for wait in map(retry_after, refusals) if wait is not None]
    waits += [max(policy.window or 1, 1) for policy in exhausted]
    if waits:
        headers.append((RETRY_AFTER, str(max(waits))))
    return headers


def header_values(
    states: Sequence[Sequence[RuleState]],
    blocked: Sequence[str] = (),
    refusals: Sequence[Decision] = (),
) -> list[HeaderValue]:
    """:func:`response_headers` as ``envoy.config.core.v3.HeaderValue`` messages."""
    return [
        HeaderValue(key=key, value=value)
        for key, value in response_headers(states, blocked, refusals)
    ]
