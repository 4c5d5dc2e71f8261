"""What the ``ratelimit`` command's subcommands share: exit codes, the storage URL, and
selector values given as ``name=value``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from ratelimit.algorithms import SLIDING_LOG, SLIDING_WINDOW
from ratelimit.backends.postgres.url import SCHEMES as POSTGRES_SCHEMES
from ratelimit.backends.redis.schemes import SCHEMES as REDIS_SCHEMES
from ratelimit.backends.urls import redacted, storage_url_problem
from ratelimit.errors import ConfigurationError
from ratelimit.front.limiter import RateLimit

OK, REFUSED, USAGE, FAILED = 0, 1, 2, 3
INVALID = REFUSED
STORAGE_HELP = (
    "the storage URL the limiters share, redis://... or postgresql://... (default: "
    "$RATELIMIT_STORAGE; memory:// is refused: it lives as long as this command)"
)
ALGORITHM_HELP = (
    "the limiters' algorithm (default: $RATELIMIT_ALGORITHM, else the store's own: "
    "sliding-window on PostgreSQL, sliding-log elsewhere)"
)


SPREAD = {"auto": None, "on": True, "off": False}
"""``--spread`` and ``RATELIMIT_SPREAD``: the ``spread`` setting they give."""
SPREAD_HELP = (
    "where a Redis store keeps each identifier of rules naming one selector: auto (the "
    "library's default: its own slot on a Redis Cluster, redis+cluster://), on, or off "
    "(one slot per key, as before spreading; also what rules chosen per call, rules "
    "mixing selectors and the service's limits always use); the application's spread= "
    "setting (default: $RATELIMIT_SPREAD, else auto; other stores never spread)"
)


_SAME = {"true": "on", "1": "on", "false": "off", "0": "off"}
"""What ``RATELIMIT_SPREAD`` may say for ``on``/``off`` too, as the service reads it."""


def default_spread() -> str:
    """``--spread``'s default: ``RATELIMIT_SPREAD`` (``true``/``false``, ``1``/``0`` read
    as ``on``/``off``, as the service reads them), else ``auto``."""
    text = os.environ.get("RATELIMIT_SPREAD", "").strip().lower() or "auto"
    return _SAME.get(text, text)


def spread_of(text: str, named: str = "RATELIMIT_SPREAD") -> bool | None:
    """The ``spread`` setting ``text`` (``auto``, ``on`` or ``off``) gives;
    ``ConfigurationError`` naming ``named`` (where it came from) for another."""
    if text.lower() not in SPREAD:
        raise ConfigurationError(
            f"{named}={text!r}: where a Redis store keeps each identifier is 'auto' (spread "
            "on a Redis Cluster), 'on' or 'off'"
        )
    return SPREAD[text.lower()]


def default_namespace() -> str:
    """``--namespace``'s default: ``RATELIMIT_NAMESPACE``, else ``""``, the library's own
    (``RateLimit(storage, namespace="")``), so that the command reads what an application
    with no ``namespace=`` wrote."""
    return os.environ.get("RATELIMIT_NAMESPACE", "")


def namespace_help() -> str:
    """``--namespace``'s help, with the default it has now."""
    now = os.environ.get("RATELIMIT_NAMESPACE")
    given = "" if now is None else f"; set now: {now!r}"
    text = (
        "the namespace the application's RateLimit(..., namespace=...) was given "
        f'(default: "", the library\'s default; $RATELIMIT_NAMESPACE overrides{given})'
    )
    return text.replace("%", "%%")


def namespace_hint(namespace: str) -> str:
    """What to check when nothing was found in ``namespace``."""
    if namespace:
        return "is the namespace right? the library's default is ''"
    return (
        "is the namespace right? '' is the library's default, unless "
        "RateLimit(..., namespace=...) set another"
    )


def nothing_counted(args: argparse.Namespace, values: dict[str, str]) -> str:
    """What ``peek`` and ``reset`` say when they found nothing counted for ``values`` of
    ``--key`` in ``--namespace``, with what to check."""
    return (
        f"nothing counted for key {args.key!r} and {who(values)} in namespace "
        f"{args.namespace!r} ({namespace_hint(args.namespace)}; is the key? a decorated "
        "function's is its module.qualname, a block's without key= where it was made, "
        "module.qualname:line:column, as Decision.key shows)"
    )


def default_algorithm() -> str | None:
    """``--algorithm``'s default: ``RATELIMIT_ALGORITHM``, else ``None`` (the store's own,
    :func:`algorithm_of`)."""
    return os.environ.get("RATELIMIT_ALGORITHM", "").strip() or None


def algorithm_of(args: argparse.Namespace, storage: str) -> str:
    """The algorithm a command's limiter uses: ``--algorithm`` when given, else the one the
    store decides by default (PostgreSQL decides no sliding log: the sliding window)."""
    given: str | None = args.algorithm
    if given:
        return given
    return SLIDING_WINDOW if urlsplit(storage).scheme in POSTGRES_SCHEMES else SLIDING_LOG


def values_of(pairs: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            parser.error(f"selector values are name=value, not {pair!r}")
        values[name] = value
    return values


def storage_of(args: argparse.Namespace) -> str | None:
    """The storage URL ``--storage`` (or ``RATELIMIT_STORAGE``) gives, or ``None`` after
    saying on stderr what is wrong with it, naming where it came from."""
    url: str | None = args.storage
    named = "--storage"
    if url is None:
        url = os.environ.get("RATELIMIT_STORAGE", "").strip() or "memory://"
        named = "RATELIMIT_STORAGE"
    problem = storage_url_problem(url)
    if problem is None:
        return url
    print(f"bad storage URL: {named}={redacted(url)!r}: {problem}", file=sys.stderr)
    return None


def unshared(storage: str, what: str) -> bool:
    """Whether ``storage`` is ``memory://``, where ``what`` (``"overrides"``, ``"counters"``)
    would live and die with this command, reaching no process (said on stderr: pass
    ``--storage`` or set ``RATELIMIT_STORAGE`` to the store the limiters share)."""
    if urlsplit(storage).scheme != "memory":
        return False
    print(
        f"invalid: memory:// keeps {what} in the process that made them, so this command "
        "would reach no other; pass --storage (or set RATELIMIT_STORAGE) to the store the "
        "limiters share (redis://..., postgresql://...)",
        file=sys.stderr,
    )
    return True


def who(values: dict[str, str]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items()) or "every caller"


def limiter_of(args: argparse.Namespace, storage: str) -> RateLimit:
    """The limiter a command works through: ``--namespace``, ``--spread`` (on a Redis
    store) and the algorithm (:func:`algorithm_of`) of ``args``, and ``on_error="raise"``
    (a storage that fails is reported, never guessed at), with :data:`COMMAND_TIMEOUT` on
    Redis (an operator's command is no request path: a far or busy Redis is waited for)."""
    algorithm = algorithm_of(args, storage)
    if not redis_storage(storage):
        return RateLimit.from_url(
            storage, namespace=args.namespace, on_error="raise", algorithm=algorithm
        )
    return RateLimit.from_url(
        storage,
        namespace=args.namespace,
        on_error="raise",
        algorithm=algorithm,
        spread=spread_of(args.spread),
        timeout=COMMAND_TIMEOUT,
    )


COMMAND_TIMEOUT = 5.0
"""Seconds each store call of a command may take on Redis (a limiter's default, 0.25 s,
bounds request paths)."""


def redis_storage(url: str) -> bool:
    """Whether ``url`` opens a Redis store (the only stores that take ``spread``)."""
    return urlsplit(url).scheme in REDIS_SCHEMES
