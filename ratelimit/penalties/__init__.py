"""Penalties (``limit(..., penalty="ip: 5 refusals/10m for 1h")``): what one is
(:mod:`.spec`) and how a limit applies it (:mod:`.penalizer`). Each store keeps the holds
in its ``penalties`` module (``ratelimit/backends/*/penalties.py``), under the protocol of
:mod:`ratelimit.backends.penalty_store`.
"""

from ratelimit.penalties.spec import *  # noqa: F403 (what the module ratelimit.penalties held)
