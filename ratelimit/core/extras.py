"""The optional parts of the package and the extra that installs each, so that a missing
dependency is reported by the name a user installs, not a bare ``ModuleNotFoundError``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

EXTRAS = {
    "asgi": "ratelimit.asgi.RouteLimit",
    "otel": "ratelimit.metrics.OpenTelemetryHook",
    "prometheus": "ratelimit.prometheus.PrometheusHook",
    "server": "the rate-limit service (ratelimit serve)",
    "postgres": "postgresql://",
    "flask": "ratelimit.flask",
    "django": "ratelimit.django",
}
"""Each extra, and what needs it."""


@contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Imports inside this block that fail for a missing module raise
    ``ModuleNotFoundError`` naming the extra to install (and the module that was missing).

    Example::

        with needs_extra("asgi"):
            from starlette.requests import Request
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{EXTRAS[extra]} needs the {extra!r} extra: pip install 'ratelimit-rules[{extra}]' "
            f"(missing module {exc.name!r})",
            name=exc.name,
        ) from exc
