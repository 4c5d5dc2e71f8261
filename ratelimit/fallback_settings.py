"""The checks of ``on_error="local"`` and ``local_share`` (:mod:`ratelimit.fallback`), made
when the settings are (``Settings``, ``RateLimit(...)``, the service's environment)."""

from __future__ import annotations

import math

from ratelimit.errors import ConfigurationError


def check_local_share(share: object, where: str = "local_share") -> float:
    """``share``: a number with ``0 < share <= 1`` (``where`` names it in the message)."""
    if (
        type(share) not in (int, float)
        or not math.isfinite(share)  # type: ignore[arg-type]
        or not 0 < share <= 1  # type: ignore[operator]
    ):
        raise ConfigurationError(
            f"{where} must be a number with 0 < share <= 1 (the share of each limit one "
            f"process admits while the store fails, e.g. 0.25 for 4 processes), not {share!r}"
        )
    return float(share)  # type: ignore[arg-type]


def check_local(on_error: str, share: object, background: bool, sync_rate: object) -> None:
    """``local_share`` only with ``on_error="local"``, and ``on_error="local"`` neither with
    background counting nor with ``sync_rate`` (which decide in-process already)."""
    check_local_share(share)
    if on_error != "local":
        if share != 1:
            raise ConfigurationError(
                f"local_share={share!r} applies only to on_error='local' (here on_error="
                f"{on_error!r}, so it would do nothing): set on_error='local' or drop it"
            )
        return
    if background:
        raise ConfigurationError(
            "on_error='local' needs background=False: background counting admits a call "
            "before the store decides it, so a failed count has no call left to decide locally"
        )
    if sync_rate:
        raise ConfigurationError(
            f"on_error='local' needs sync_rate=0 (here {sync_rate!r}): with sync_rate a "
            "process decides in-process on its own counters already, whatever the store does"
        )
